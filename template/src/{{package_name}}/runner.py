"""The function arq calls: claim, run the agent, record the outcome (template-owned).

The row is written before the work (claim) and after it (outcome), never only in memory.
arq only delivers job ids; whether and how a job runs is decided here, from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import structlog
from arq.worker import Retry
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from . import job_store, paid_calls, provider_errors, recovery, replies, spend, tracing, waiting
from .agent import AgentContext, bind_logger
from .batched import BatchedWrites, DatabaseUnavailable
from .db import transaction
from .durable import Durable
from .errors import InvalidPayload, RateLimited, RetryLater
from .limits import CallLimits
from .limits.gate import NO_LIMIT, Admission, Gate
from .metrics import Metrics
from .paid_calls import PaidCallInDoubt, PaidCalls
from .queue import JobQueue, Push, QueueUnavailable
from .registry import Agent, Registry
from .retry import RetryPolicy, is_permanent
from .settings import Settings
from .states import JobState

log = structlog.get_logger("runner")
T = TypeVar("T")

# How soon arq should deliver a job again when the database could not be reached.
DB_UNAVAILABLE_RETRY_S = 5
# Added to a wait for a lease or run_after, so the next delivery lands after it.
LEASE_RECHECK_MARGIN_S = 0.1
# A claimed job's reads and its outcome write are tried again after these pauses when the
# database is briefly away (about 15 s in all) before the worker gives up and leaves the
# job to recovery, which runs it again once its lease expires.
DB_RETRY_PAUSES_S = (0.5, 1.0, 2.0, 4.0, 8.0)
DATABASE_ERRORS = (DBAPIError, OSError, DatabaseUnavailable)


@dataclass
class Runtime:
    """Everything a worker process shares between jobs."""

    settings: Settings
    engine: AsyncEngine
    queue: JobQueue
    registry: Registry  # the agents, their routes and limits (registry.py)
    policy: RetryPolicy
    worker_name: str
    lane_timeouts: dict[str, int] = field(default_factory=dict)
    # Claims and completions of concurrent jobs, written in batches (see batched.py).
    batched: BatchedWrites | None = None
    # This process's Prometheus series (its own registry: several runtimes never share).
    metrics: Metrics = field(default_factory=Metrics)
    # Agent concurrency limits, checked before the claim (limits/gate.py); None only in tests.
    gate: Gate | None = None
    # Named limits on calls inside jobs (ctx.limit, ctx.paid_call(limit=...)).
    call_limits: CallLimits | None = None

    @property
    def agents(self) -> dict[str, Agent]:
        return self.registry.agents


@dataclass(frozen=True)
class Outcome:
    """What one attempt ended with."""

    kind: Literal[
        "completed", "retry", "deferred", "failed", "dead_lettered", "denied", "in_doubt", "waiting"
    ]
    result: dict[str, Any] | None = None
    error: job_store.ErrorInfo | None = None
    delay_s: float = 0.0
    waiting_for: str | None = None  # "approval:NAME" or "children"


async def run_job(ctx: dict[str, Any], job_id: str, agent: str = "") -> str:
    """Run one delivery of `job_id` (of `agent`, which the push sends along; "" when it
    did not); returns the state it left the job in."""
    runtime: Runtime = ctx["runtime"]
    admission = await gate(runtime, ctx, job_id, agent)
    try:
        return await run_admitted(runtime, ctx, job_id, admission)
    finally:
        await admission.release()


async def gate(runtime: Runtime, ctx: dict[str, Any], job_id: str, agent: str = "") -> Admission:
    """The job's place under its agent's concurrency limits (none for unlimited agents,
    without a read of Redis or the database); raises arq's Retry, using no attempt, while
    the agent is at a limit (limits/gate.py)."""
    if runtime.gate is None or not runtime.gate.guards(ctx.get("lane"), agent):
        return NO_LIMIT
    return await runtime.gate.admit(runtime.engine, job_id, int(ctx.get("job_try") or 1))


async def run_admitted(
    runtime: Runtime, ctx: dict[str, Any], job_id: str, admission: Admission
) -> str:
    """Claim, check, run the agent, record the outcome."""
    job = await claim(runtime, job_id)
    if job is None:
        runtime.metrics.claim_refused()
        return await not_claimed(runtime, job_id)
    jlog = bind_logger(job.id, job.agent, job.attempts)
    jlog.debug("job_claimed", lane=job.lane, max_attempts=job.max_attempts)
    # Observed: the claim on entry, the recorded state on exit (metrics.py); traced as a
    # CONSUMER span joined to the submit's trace (tracing.py, when on).
    with runtime.metrics.run(job, due_ms=ctx.get("score")) as observed, tracing.run_span(job):
        check = await patiently(lambda: check_before_running(runtime, job), jlog)
        outcome = check or await call_agent(runtime, job, jlog, admission)
        observed.state = await record_outcome(runtime, job, outcome, jlog)
        return observed.state


async def claim(runtime: Runtime, job_id: str) -> job_store.Job | None:
    """The claim, or an arq retry when the database cannot be reached right now."""
    try:
        if runtime.batched is not None:
            return await runtime.batched.claim(job_id)
        async with transaction(runtime.engine) as conn:
            return await job_store.claim(
                conn,
                job_id,
                worker=runtime.worker_name,
                now=_now(),
                lease_s=runtime.settings.lease_s,
            )
    except DATABASE_ERRORS as exc:
        log.warning("claim_failed_database_unavailable", job_id=job_id, error=str(exc))
        raise Retry(defer=DB_UNAVAILABLE_RETRY_S) from exc


async def not_claimed(runtime: Runtime, job_id: str) -> str:
    """A delivery we may not run now: log why, and ask arq to deliver it again when a
    retry arrived early or another worker's lease may yet run out."""
    async with runtime.engine.connect() as conn:
        job = await job_store.get_job(conn, job_id)
    if job is None:
        log.warning("job_not_found", job_id=job_id)
        return "missing"
    due = None
    if job.state is JobState.QUEUED and job.run_after is not None:
        due = job.run_after  # arq delivered before run_after (clock skew between machines)
    elif job.state is JobState.ACTIVE and job.lease_expires_at is not None:
        if job.lease_expires_at < _now() and job.attempts >= job.max_attempts:
            return await settle_lost_last_attempt(runtime, job_id)
        due = job.lease_expires_at  # a live lease: the holder may still finish, or die
    if due is not None:
        wait = max((due - _now()).total_seconds(), 0.0) + LEASE_RECHECK_MARGIN_S
        log.info("job_not_due", job_id=job_id, state=job.state.value, recheck_in_s=round(wait, 3))
        raise Retry(defer=timedelta(seconds=wait))
    log.info("job_not_claimed", job_id=job_id, state=job.state.value)
    return job.state.value


async def settle_lost_last_attempt(runtime: Runtime, job_id: str) -> str:
    """A delivery of a job whose last attempt was lost: settle it as recovery would
    (in_doubt with a paid call open, else dead-lettered), never open one attempt more."""
    async with transaction(runtime.engine) as conn:
        state = await recovery.rescue(conn, job_id, now=_now())
    log.warning("job_lost_on_last_attempt", job_id=job_id, state=state and state.value)
    return state.value if state is not None else "not_claimed"


async def check_before_running(runtime: Runtime, job: job_store.Job) -> Outcome | None:
    """An outcome decided before the agent runs: a paid call left open by a dead worker
    (in doubt), a paid agent without cap or budget (denied), or attempts used up."""
    if job.attempts > job.max_attempts:
        lost = job_store.ErrorInfo(
            "AttemptsExhausted", "every attempt was used by workers that stopped mid-job"
        )
        return Outcome("dead_lettered", error=lost)
    agent = runtime.agents.get(job.agent)
    paid = agent is not None and agent.config.paid
    if job.attempts == 1 and not paid:
        return None  # no earlier attempt could have left a paid call open; no cap to check
    async with runtime.engine.connect() as conn:
        if job.attempts > 1 and await paid_calls.has_open_call(conn, job.id):
            reason = "a paid call was open when its worker stopped; the provider may have charged"
            return Outcome("in_doubt", error=job_store.ErrorInfo("PaidCallInDoubt", reason))
        if paid:
            refusal = await spend.exhausted(conn, job.agent, spend.utc_day(_now()))
            if refusal is not None:
                return Outcome("denied", error=job_store.ErrorInfo("SpendDenied", refusal))
    return None


async def call_agent(
    runtime: Runtime, job: job_store.Job, jlog: Any, admission: Admission = NO_LIMIT
) -> Outcome:
    """Run the agent under its timeout while a heartbeat keeps the lease."""
    agent = runtime.agents.get(job.agent)
    if agent is None:
        error = InvalidPayload(f"no agent named {job.agent!r} is installed in this worker")
        return decide(runtime.policy, job, error, ())
    paid = PaidCalls(
        runtime.engine, job.id, job.agent, job.attempts, observe=runtime.metrics.paid_call
    )
    durable = Durable(runtime.engine, job.id, job.attempts, runtime.registry.routes, runtime.queue)
    timeout = min(
        agent.config.timeout_s, runtime.lane_timeouts.get(job.lane, agent.config.timeout_s)
    )
    deadline = asyncio.get_running_loop().time() + timeout
    ctx = AgentContext(
        job.id,
        job.agent,
        job.attempts,
        job.max_attempts,
        jlog,
        paid,
        durable=durable,
        limits=runtime.call_limits,
        deadline=deadline,
        default_limit=agent.config.limit,
    )
    heartbeat = Heartbeat(runtime, job, jlog, admission)
    try:
        async with asyncio.timeout(timeout):
            result = await agent.run(ctx, dict(job.payload))
        _check_result(result)
    except waiting.Wait as wait:
        return Outcome("waiting", waiting_for=wait.reason)
    except (Exception, spend.SpendDenied, PaidCallInDoubt) as exc:  # noqa: BLE001 - all recorded
        return decide(runtime.policy, job, exc, agent.permanent_errors)
    finally:
        await heartbeat.stop()
    return Outcome("completed", result=result)


def decide(
    policy: RetryPolicy,
    job: job_store.Job,
    exc: BaseException,
    permanent: tuple[type[BaseException], ...],
) -> Outcome:
    """Map an agent's exception to the next state, using the database's attempt count."""
    error = error_info(exc)
    if isinstance(exc, spend.SpendDenied):
        return Outcome("denied", error=error)
    if isinstance(exc, PaidCallInDoubt):
        return Outcome("in_doubt", error=error)
    verdict = provider_errors.read(exc)
    if isinstance(exc, RateLimited) or (verdict is not None and verdict.next == "wait"):
        if job.deferrals >= policy.max_deferrals:
            why = f"rate limited for too long: sent back {job.deferrals} times; last: {exc}"
            return Outcome("dead_lettered", error=job_store.ErrorInfo("RateLimited", why))
        return Outcome("deferred", error=error, delay_s=wait_s(policy, job, exc, verdict))
    if is_permanent(exc, permanent) or (verdict is not None and verdict.next == "fail"):
        return Outcome("failed", error=error)
    if policy.exhausted(job.attempts, job.max_attempts):
        return Outcome("dead_lettered", error=error)
    delay = exc.after_s if isinstance(exc, RetryLater) else policy.delay(job.attempts)
    return Outcome("retry", error=error, delay_s=delay)


def wait_s(
    policy: RetryPolicy,
    job: job_store.Job,
    exc: BaseException,
    verdict: provider_errors.Verdict | None,
) -> float:
    """How long a rate-limited job waits: what the upstream asked for, else a backoff over
    the job's deferrals so far."""
    if isinstance(exc, RateLimited):
        return exc.after_s
    if verdict is not None and verdict.after_s is not None:
        return verdict.after_s
    return policy.delay(job.deferrals + 1)


async def record_outcome(runtime: Runtime, job: job_store.Job, outcome: Outcome, jlog: Any) -> str:
    """Write the outcome, guarded by the attempt number; hand a retry back to arq."""
    if outcome.kind == "waiting":
        return await park(runtime, job, outcome, jlog)
    agent = runtime.agents.get(job.agent)
    reply = agent.reply if agent is not None else None
    has_reply = reply is not None
    done = await patiently(lambda: write_outcome(runtime, job, outcome, has_reply=has_reply), jlog)
    if not done:
        jlog.warning("outcome_not_recorded_lease_lost", outcome=outcome.kind)
        return "lease_lost"
    if job.parent_id is not None and outcome.kind not in ("retry", "deferred", "in_doubt"):
        await push_parent(runtime, job.parent_id, jlog)
    if outcome.kind == "completed":
        jlog.info("job_completed", state=outcome.kind)
        if reply is not None:
            await send_reply(runtime, job.id, reply, jlog)
        return outcome.kind
    assert outcome.error is not None
    if outcome.kind == "deferred":
        jlog.info("job_deferred", state=JobState.QUEUED.value, retry_in_s=round(outcome.delay_s, 3))
        raise Retry(defer=timedelta(seconds=outcome.delay_s))
    if outcome.kind != "retry":
        jlog.warning(
            "job_" + outcome.kind, state=outcome.kind, error_class=outcome.error.error_class
        )
        return outcome.kind
    jlog.info(
        "job_retry",
        state=JobState.QUEUED.value,
        error_class=outcome.error.error_class,
        retry_in_s=round(outcome.delay_s, 3),
    )
    raise Retry(defer=timedelta(seconds=outcome.delay_s))


async def patiently(attempt: Callable[[], Awaitable[T]], jlog: Any) -> T:
    """`attempt()`, tried again while the database is briefly unreachable, so that a short
    outage does not cost a claimed job its attempt."""
    for pause in DB_RETRY_PAUSES_S:
        try:
            return await attempt()
        except DATABASE_ERRORS as exc:
            jlog.warning("database_unavailable", error=str(exc), retry_in_s=pause)
            await asyncio.sleep(pause)
    return await attempt()


async def write_outcome(
    runtime: Runtime, job: job_store.Job, outcome: Outcome, *, has_reply: bool
) -> bool:
    """One try at writing `outcome` for the attempt `job.attempts`; False when that attempt
    no longer holds the job (its lease was taken over)."""
    now = _now()
    # A child's completion may queue its parent, in job_store.complete's transaction.
    batchable = not has_reply and job.parent_id is None
    if outcome.kind == "completed" and batchable and runtime.batched is not None:
        assert outcome.result is not None
        return await runtime.batched.complete(job.id, attempt=job.attempts, result=outcome.result)
    async with transaction(runtime.engine) as conn:
        if outcome.kind == "completed":
            assert outcome.result is not None
            done = await job_store.complete(
                conn, job.id, attempt=job.attempts, result=outcome.result, now=now
            )
            if done and has_reply:
                await replies.record_pending(conn, job.id, job.agent, now)
        elif outcome.kind in ("retry", "deferred"):
            assert outcome.error is not None
            requeue = job_store.retry if outcome.kind == "retry" else job_store.defer
            done = await requeue(
                conn,
                job.id,
                attempt=job.attempts,
                error=outcome.error,
                now=now,
                run_after=now + timedelta(seconds=outcome.delay_s),
            )
        elif outcome.kind in ("denied", "in_doubt"):
            assert outcome.error is not None
            park = job_store.deny if outcome.kind == "denied" else job_store.mark_in_doubt
            done = await park(
                conn, job.id, reason=outcome.error.message, now=now, attempt=job.attempts
            )
            if done and outcome.kind == "in_doubt":
                await paid_calls.park_open_calls(conn, job.id)
        else:
            assert outcome.error is not None
            verb = job_store.fail if outcome.kind == "failed" else job_store.dead_letter
            done = await verb(conn, job.id, attempt=job.attempts, error=outcome.error, now=now)
    return done


async def park(runtime: Runtime, job: job_store.Job, outcome: Outcome, jlog: Any) -> str:
    """Park the job `waiting` (no lease, no arq entry, no attempt used); when what it waits
    for is already there, hand it straight back to arq instead."""
    assert outcome.waiting_for is not None
    reason = outcome.waiting_for

    async def write() -> str | None:
        async with transaction(runtime.engine) as conn:
            return await waiting.park(conn, job.id, attempt=job.attempts, reason=reason, now=_now())

    state = await patiently(write, jlog)
    if state is None:
        jlog.warning("outcome_not_recorded_lease_lost", outcome=outcome.kind)
        return "lease_lost"
    jlog.info("job_waiting", state=state, waiting_for=reason)
    if state == "queued":
        raise Retry(defer=0)
    return JobState.WAITING.value


async def push_parent(runtime: Runtime, parent_id: str, jlog: Any) -> None:
    """Push a parent that this child's settling queued (if Redis refuses, recovery will)."""
    async with runtime.engine.connect() as conn:
        parent = await job_store.get_job(conn, parent_id)
    if parent is None or parent.state is not JobState.QUEUED:
        return
    try:
        push = Push(parent.id, parent.lane, priority=parent.priority, agent=parent.agent)
        await runtime.queue.push_many([push])
    except QueueUnavailable as exc:
        jlog.warning("parent_not_pushed", parent_id=parent_id, error=str(exc))


async def send_reply(runtime: Runtime, job_id: str, reply: replies.ReplyFn, jlog: Any) -> None:
    """Send a completed job's reply now; if that fails, recovery sends it later."""
    try:
        await replies.send(runtime.engine, job_id, reply)
    except Exception as exc:  # noqa: BLE001 - the reply stays pending for recovery
        jlog.warning("reply_deferred", error=f"{type(exc).__name__}: {exc}")


def error_info(exc: BaseException) -> job_store.ErrorInfo:
    """The class, message and traceback of `exc`, as stored on the attempt."""
    message = str(exc) or repr(exc)
    if isinstance(exc, TimeoutError) and not str(exc):
        message = "the agent ran past its timeout"
    return job_store.ErrorInfo(
        error_class=type(exc).__name__,
        message=message[:2000],
        traceback="".join(traceback.format_exception(exc))[-8000:],
    )


class Heartbeat:
    """Renews a running attempt's lease every lease_s / 3 until stopped.

    Most jobs end before the first renewal is due, so the renewing task is only started
    when it is: a timer costs far less than a task started and cancelled for every job.
    """

    def __init__(
        self, runtime: Runtime, job: job_store.Job, jlog: Any, admission: Admission = NO_LIMIT
    ) -> None:
        self._runtime = runtime
        self._job = job
        self._admission = admission
        self._log = jlog
        self._interval = runtime.settings.lease_s / 3
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._keep())

    async def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _keep(self) -> None:
        runtime, job = self._runtime, self._job
        while True:
            try:
                async with transaction(runtime.engine) as conn:
                    held = await job_store.heartbeat(
                        conn,
                        job.id,
                        attempt=job.attempts,
                        now=_now(),
                        lease_s=runtime.settings.lease_s,
                    )
            except DATABASE_ERRORS as exc:
                self._log.warning("heartbeat_failed", error=str(exc))
                held = True
            if not held:
                self._log.warning("lease_lost")
                return
            with contextlib.suppress(RedisError, OSError):  # a lost slot is only logged
                await self._admission.renew()
            await asyncio.sleep(self._interval)


def _check_result(result: Any) -> None:
    if not isinstance(result, dict):
        raise InvalidPayload(f"the agent returned {type(result).__name__}, not a dict")
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"the agent's result is not JSON: {exc}") from exc


def _now() -> datetime:
    return datetime.now(UTC)
