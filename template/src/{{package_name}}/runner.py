"""The function arq calls: claim, run the agent, record the outcome (template-owned).

The row is written before the work (claim) and after it (outcome), never only in memory.
arq only delivers job ids; whether and how a job runs is decided here, from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import Any, TypeVar

import structlog
from arq.worker import Retry
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import (
    budgets,
    cancels,
    deadlines,
    job_store,
    paid_calls,
    provider_errors,
    queries,
    recovery,
    replies,
    spend,
    versions,
    waiting,
    webhooks,
)
from .agent import AgentContext, bind_logger
from .batched import BatchedWrites, DatabaseUnavailable
from .db import transaction
from .durable import Durable
from .errors import InvalidPayload, RateLimited, RetryLater
from .events import Emitter, EventBuffer
from .limits import CallLimits
from .limits.gate import NO_LIMIT, Admission, Gate
from .observe import tracing
from .observe.metrics import Metrics
from .paid_calls import PaidCallInDoubt, PaidCalls
from .queue import JobQueue, Push, QueueUnavailable
from .registry import Agent, Registry
from .retry import RetryPolicy, is_permanent
from .settings import Settings
from .states import PARKED, SETTLED, TERMINAL, JobState, target

log = structlog.get_logger("runner")
T = TypeVar("T")

DEADLINE = deadlines.ERROR_CLASS
# The error of an attempt a cancel stopped (cancels.py).
STOPPED = job_store.ErrorInfo("Cancelled", cancels.STOPPED)
# Said with a delivery that has no row: the usual cause, and what to do about it.
NOT_FOUND_HINT = (
    "no job has this id here: if another deployment (staging, another region) uses this "
    "Redis database, give each its own (REDIS_URL .../N), or their workers take each "
    "other's jobs"
)
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
    # What agents emit (ctx.emit), written every few hundred ms; None: emits are dropped.
    events: EventBuffer | None = None
    # The agents running now, by job id: what a cancel reaches (cancels.py).
    running: cancels.Running = field(default_factory=cancels.Running)
    # Sends the webhook notifications of settled jobs (webhooks.py); None: none configured.
    deliverer: webhooks.Deliverer | None = None

    def tells(self, agent: str) -> bool:
        """Whether a job of `agent` notifies webhooks when it ends."""
        return self.deliverer is not None and bool(self.deliverer.hooks.for_agent(agent))

    @property
    def agents(self) -> dict[str, Agent]:
        return self.registry.agents


class Requeue(Retry):
    """arq's Retry for a job the database queued again, carrying its priority: arq queues it
    at now plus the delay, and the worker gives it its priority back once it is due
    (lanes.run_job_then_ring)."""

    def __init__(self, defer: timedelta, priority: int) -> None:
        super().__init__(defer=defer)
        self.priority = priority


class Kind(StrEnum):
    """How an attempt ended; the log line says `job_<kind>`."""

    COMPLETED = "completed"
    RETRY = "retry"  # failed, with attempts left: queued again after a backoff
    DEFERRED = "deferred"  # the upstream said "too many requests": queued, no attempt used
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    DENIED = "denied"
    IN_DOUBT = "in_doubt"
    WAITING = "waiting"  # for an approval or the job's children
    CANCELLED = "cancelled"  # an operator's cancel reached the running agent (cancels.py)


class Then(Enum):
    """What the run does once its outcome is written."""

    RETURN = "return"  # the job is settled or parked: the run ends with its state
    REQUEUE = "requeue"  # the job is queued again: arq delivers it after the outcome's delay
    PARK = "park"  # the job waits, with no arq entry (or, if what it waits for is there, queued)


@dataclass(frozen=True)
class Outcome:
    """What one attempt ended with; built by the constructors below, which take what its
    verb writes (an error for every outcome but completed and waiting)."""

    kind: Kind
    error: job_store.ErrorInfo | None = None
    delay_s: float = 0.0  # before arq delivers a retried or deferred job again
    # The keywords of the kind's verb (OUTCOMES) besides the job, its attempt and the time.
    writes: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def state(self) -> JobState:
        """The state this outcome leaves the job in (its verb's target)."""
        return OUTCOMES[self.kind].state

    @property
    def then(self) -> Then:
        return OUTCOMES[self.kind].then

    @classmethod
    def completed(cls, result: dict[str, Any]) -> Outcome:
        return cls(Kind.COMPLETED, writes={"result": result})

    @classmethod
    def retry(cls, error: job_store.ErrorInfo, delay_s: float) -> Outcome:
        return cls(Kind.RETRY, error, delay_s, writes={"error": error})

    @classmethod
    def deferred(cls, error: job_store.ErrorInfo, delay_s: float) -> Outcome:
        return cls(Kind.DEFERRED, error, delay_s, writes={"error": error})

    @classmethod
    def failed(cls, error: job_store.ErrorInfo) -> Outcome:
        return cls(Kind.FAILED, error, writes={"error": error})

    @classmethod
    def dead_lettered(cls, error: job_store.ErrorInfo) -> Outcome:
        return cls(Kind.DEAD_LETTERED, error, writes={"error": error})

    @classmethod
    def denied(cls, error: job_store.ErrorInfo) -> Outcome:
        return cls(Kind.DENIED, error, writes={"reason": error.message})

    @classmethod
    def in_doubt(cls, error: job_store.ErrorInfo) -> Outcome:
        return cls(Kind.IN_DOUBT, error, writes={"reason": error.message})

    @classmethod
    def cancelled(cls) -> Outcome:
        return cls(Kind.CANCELLED, STOPPED, writes={"error": STOPPED})

    @classmethod
    def waiting(cls, reason: str) -> Outcome:
        """Waiting for `reason` ("approval:NAME" or "children")."""
        return cls(Kind.WAITING, writes={"reason": reason})


@dataclass(frozen=True)
class Run:
    """One claimed attempt, as every step after the claim sees it."""

    job: job_store.Job
    agent: Agent | None  # looked up once; None when this worker has no agent of that name
    log: Any  # bound to the job's id, agent and attempt

    @property
    def reply(self) -> replies.ReplyFn | None:
        return self.agent.reply if self.agent is not None else None


async def _record_reply(conn: AsyncConnection, run: Run, now: datetime) -> None:
    """A completed job with a reply step: the reply is pending, in the same transaction."""
    if run.reply is not None:
        await replies.record_pending(conn, run.job.id, run.job.agent, now)


async def _close_asked(conn: AsyncConnection, run: Run, now: datetime) -> None:
    await cancels.close_asked(conn, run.job.id, now=now)


async def _park_open_calls(conn: AsyncConnection, run: Run, now: datetime) -> None:
    await paid_calls.park_open_calls(conn, run.job.id)


@dataclass(frozen=True)
class Fate:
    """How one kind of outcome is written, and what the run does after."""

    transition: str  # its name in states.TRANSITIONS, whose target is the job's new state
    # job_store's function (a bool: whether it moved the job), or waiting.park for a wait
    verb: Callable[..., Awaitable[bool | str | None]]
    then: Then
    # Also written in the verb's transaction, when the verb moved the job.
    also: Callable[[AsyncConnection, Run, datetime], Awaitable[None]] | None = None

    @property
    def state(self) -> JobState:
        return target(self.transition)


# The one table of outcome writes: each kind's verb, called with the outcome's `writes` (plus
# run_after for a requeue) in one place, `write_outcome`.
OUTCOMES: dict[Kind, Fate] = {
    Kind.COMPLETED: Fate("complete", job_store.complete, Then.RETURN, also=_record_reply),
    Kind.RETRY: Fate("retry", job_store.retry, Then.REQUEUE),
    Kind.DEFERRED: Fate("defer", job_store.defer, Then.REQUEUE),
    Kind.FAILED: Fate("fail", job_store.fail, Then.RETURN),
    Kind.DEAD_LETTERED: Fate("dead_letter", job_store.dead_letter, Then.RETURN),
    Kind.DENIED: Fate("deny", job_store.deny, Then.RETURN),
    Kind.IN_DOUBT: Fate("mark_in_doubt", job_store.mark_in_doubt, Then.RETURN, _park_open_calls),
    Kind.WAITING: Fate("wait", waiting.park, Then.PARK),
    Kind.CANCELLED: Fate("stop", job_store.stop, Then.RETURN, _close_asked),
}


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
    run = Run(job, runtime.agents.get(job.agent), bind_logger(job.id, job.agent, job.attempts))
    run.log.debug("job_claimed", lane=job.lane, max_attempts=job.max_attempts)
    # Observed: the claim on entry, the recorded state on exit (observe/metrics.py); traced as a
    # CONSUMER span joined to the submit's trace (observe/tracing.py, when on).
    with runtime.metrics.run(job, due_ms=ctx.get("score")) as observed, tracing.run_span(job):
        check = await patiently(lambda: check_before_running(runtime, run), run.log)
        outcome = check or await call_agent(runtime, run, admission, ctx.get("take_slot"))
        free_slot(ctx)  # the agent is done: the lane may start its next job meanwhile
        # What the agent emitted is written before its outcome's event; a job that may now
        # hold more events than it keeps is trimmed once the outcome is written.
        emitted = 0 if runtime.events is None else await runtime.events.settle(job.id)
        try:
            observed.state = await record_outcome(runtime, run, outcome)
        finally:
            if runtime.events is not None and (emitted or job.event_seq > runtime.events.keep):
                await trim_events(runtime.events, run)
        return observed.state


def free_slot(ctx: dict[str, Any]) -> None:
    """Tell the lane worker (lanes.LaneWorker.release_slot) that this job's agent no longer
    runs, so its slot may take the next job while the outcome is written."""
    release = ctx.get("release_slot")
    if release is not None:
        release()


async def trim_events(buffer: EventBuffer, run: Run) -> None:
    """Bring a job that may hold more events than it keeps back to its bound: one that
    emitted this attempt, or had more when claimed (its children's events, its steps')."""
    try:
        await buffer.trim(run.job.id)
    except DATABASE_ERRORS as exc:  # the next claim tries again
        run.log.warning("events_not_trimmed", error=str(exc))


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
                versions=runtime.registry.versions,
            )
    except DATABASE_ERRORS as exc:
        log.warning("claim_failed_database_unavailable", job_id=job_id, error=str(exc))
        raise Retry(defer=DB_UNAVAILABLE_RETRY_S) from exc


async def not_claimed(runtime: Runtime, job_id: str) -> str:
    """A delivery we may not run now: log why, and ask arq to deliver it again when a
    retry arrived early or another worker's lease may yet run out."""
    async with runtime.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    if job is None:
        log.warning("job_not_found", job_id=job_id, hint=NOT_FOUND_HINT)
        return "missing"
    due = None
    if job.state is JobState.QUEUED and job.run_after is not None:
        due = job.run_after  # arq delivered before run_after (clock skew between machines)
    elif job.state is JobState.ACTIVE and job.lease_expires_at is not None:
        lost = job.lease_expires_at < _now()
        if lost and (job.attempts >= job.max_attempts or job.cancel_requested_at is not None):
            return await settle_lost_last_attempt(runtime, job_id)
        due = job.lease_expires_at  # a live lease: the holder may still finish, or die
    if due is not None:
        wait = max((due - _now()).total_seconds(), 0.0) + LEASE_RECHECK_MARGIN_S
        log.info("job_not_due", job_id=job_id, state=job.state.value, recheck_in_s=round(wait, 3))
        raise Retry(defer=timedelta(seconds=wait))
    log.info("job_not_claimed", job_id=job_id, state=job.state.value)
    return job.state.value


async def settle_lost_last_attempt(runtime: Runtime, job_id: str) -> str:
    """A delivery of a job whose last attempt was lost, or that was asked to stop: settle it
    as recovery would (in_doubt with a paid call open, else cancelled or dead-lettered),
    never open one attempt more."""
    async with transaction(runtime.engine) as conn:
        state = await recovery.rescue(conn, job_id, now=_now())
    log.warning("job_lost_on_last_attempt", job_id=job_id, state=state and state.value)
    return state.value if state is not None else "not_claimed"


async def check_before_running(runtime: Runtime, run: Run) -> Outcome | None:
    """An outcome decided before the agent runs: attempts used up, a paid call left open by
    a dead worker (in doubt), a run deadline passed (failed), or a paid agent with no cap,
    or none of it left, for a job with no paid call recorded yet (denied)."""
    job = run.job
    if job.attempts > job.max_attempts:
        lost = job_store.ErrorInfo(
            "AttemptsExhausted", "every attempt was used by workers that stopped mid-job"
        )
        return Outcome.dead_lettered(lost)
    paid = run.agent is not None and run.agent.config.paid
    past = job.deadline_at is not None and job.deadline_at <= _now()
    if job.attempts == 1 and not paid:
        # No earlier attempt could have left a paid call open; no cap to check.
        return Outcome.failed(deadlines.error(job)) if past else None
    async with runtime.engine.connect() as conn:
        calls = await paid_calls.states_of(conn, job.id) if job.attempts > 1 else set()
        if "open" in calls:
            reason = "a paid call was open when its worker stopped; the provider may have charged"
            return Outcome.in_doubt(job_store.ErrorInfo("PaidCallInDoubt", reason))
        if past:
            return Outcome.failed(deadlines.error(job))
        # A retry whose earlier attempts recorded paid calls starts whatever the cap: those
        # come back from the record at no cost, and a new call is held to the cap as it is
        # made. Refused here, the job would lose answers it was charged for.
        if paid and "closed" not in calls:
            refusal = await spend.exhausted(conn, job.agent, spend.utc_day(_now()))
            if refusal is not None:
                return Outcome.denied(job_store.ErrorInfo("SpendDenied", refusal))
    return None


async def call_agent(
    runtime: Runtime,
    run: Run,
    admission: Admission = NO_LIMIT,
    take_slot: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Run the agent under its timeout, or what is left of its run deadline when that is
    sooner, while a heartbeat keeps the lease; a job claimed ahead first waits for an agent
    slot (`take_slot`)."""
    job, agent, jlog = run.job, run.agent, run.log
    if agent is None:
        error = InvalidPayload(f"no agent named {job.agent!r} is installed in this worker")
        return within_deadline(job, decide(runtime.policy, job, error, ()))
    if take_slot is not None:
        stopped_waiting = await wait_for_slot(runtime, run, admission, take_slot)
        if stopped_waiting is not None:
            return stopped_waiting
    paid = PaidCalls(
        runtime.engine,
        job.id,
        job.agent,
        job.attempts,
        observe=runtime.metrics.paid_call,
        max_paid_calls=agent.config.max_paid_calls,
        on_budget=agent.config.on_budget,
        budget_id=job.budget_id,
    )
    replay = await patiently(lambda: replay_of(runtime, job, agent), jlog)
    durable = Durable(
        runtime.engine, job.id, job.attempts, runtime.registry.routes, runtime.queue, replay
    )
    timeout: float = min(
        agent.config.timeout_s, runtime.lane_timeouts.get(job.lane, agent.config.timeout_s)
    )
    left = deadlines.left_s(job.deadline_at, _now())
    if left is not None and left < timeout:
        timeout = left  # the run deadline comes first: its end fails the job, no retry
    scope = asyncio.timeout(timeout)
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
        events=None if runtime.events is None else Emitter(runtime.events, job.id, job.attempts),
    )
    heartbeat = Heartbeat(runtime, job, jlog, admission)
    interrupt = runtime.running.enter(job.id)
    try:
        async with scope:
            result = await agent.run(ctx, dict(job.payload))
        _check_result(result)
        outcome = Outcome.completed(result)
    except waiting.Wait as wait:
        outcome = Outcome.waiting(wait.reason)
    except asyncio.CancelledError:
        if not interrupt.stopped:
            raise  # the worker is stopping, or arq ended the job: not ours to record
        runtime.running.leave(interrupt)
        return await patiently(lambda: stopped(runtime, run), jlog)
    except (Exception, spend.SpendDenied, PaidCallInDoubt) as exc:  # noqa: BLE001 - all recorded
        if timeout == left and scope.expired() and isinstance(exc, TimeoutError):
            outcome = Outcome.failed(deadlines.error(job))  # the deadline ended it, no retry
        else:
            outcome = within_deadline(job, decide(runtime.policy, job, exc, agent.permanent_errors))
    finally:
        runtime.running.leave(interrupt)
        await heartbeat.stop()
        report_version_change(ctx, replay)
    return await settled(runtime, run, paid, outcome)


async def wait_for_slot(
    runtime: Runtime, run: Run, admission: Admission, take_slot: Callable[[], Awaitable[None]]
) -> Outcome | None:
    """Wait for an agent slot (lanes.LaneWorker.take_slot) while a heartbeat keeps the
    lease; the outcome when an operator stopped the job meanwhile."""
    heartbeat = Heartbeat(runtime, run.job, run.log, admission)
    interrupt = runtime.running.enter(run.job.id)
    try:
        await take_slot()
    except asyncio.CancelledError:
        if not interrupt.stopped:
            raise  # the worker is stopping: not ours to record
        runtime.running.leave(interrupt)
        return await patiently(lambda: stopped(runtime, run), run.log)
    finally:
        runtime.running.leave(interrupt)
        await heartbeat.stop()
    return None


async def settled(runtime: Runtime, run: Run, paid: PaidCalls, outcome: Outcome) -> Outcome:
    """The attempt's outcome, unless it leaves a paid call recorded `open`: the write of
    the call's cost or refusal failed (the database went away), or the agent caught that
    error and went on. The call was sent, so the job is `in_doubt` whatever the agent did,
    with the reservation counted as spent; ended or retried, it would keep the reservation
    or lose the doubt. The record is read only after such a failure."""
    if not paid.unsettled or outcome.kind is Kind.IN_DOUBT:
        return outcome

    async def still_open() -> bool:
        async with runtime.engine.connect() as conn:
            return await paid_calls.has_open_call(conn, run.job.id)

    if not await patiently(still_open, run.log):
        return outcome  # the settle was written after all; only its answer was lost
    calls = ", ".join(sorted(paid.unsettled))
    reason = f"paid call {calls} has no recorded outcome; the provider may have charged"
    return Outcome.in_doubt(job_store.ErrorInfo("PaidCallInDoubt", reason))


async def replay_of(runtime: Runtime, job: job_store.Job, agent: Agent) -> versions.Replay:
    """What the run replays: the job's record (read only when it can have one), the code it
    started on and the code this worker runs (versions.py)."""
    record = versions.NOTHING
    if versions.may_have_record(job):
        async with runtime.engine.connect() as conn:
            record = await versions.record_of(conn, job.id)
    on_change = agent.config.on_version_change
    return versions.Replay(record, job.code_version, agent.code_version, on_change)


def report_version_change(ctx: AgentContext, replay: versions.Replay) -> None:
    """A run of other code than the job started on that left recorded work unreached or
    made new paid calls: logged, and a `version_changed` event for `jobs show`."""
    report = replay.report()
    if report is None:
        return
    ctx.log.warning("job_version_changed", **report)
    if ctx.events is not None:
        ctx.events.note(versions.EVENT, report)


async def stopped(runtime: Runtime, run: Run) -> Outcome:
    """A cancel reached the agent: `cancelled`, or `in_doubt` when it stopped the agent
    with a paid call open (between sending and recording it, the charge is unknown). A
    call the stop caught while it was being sent is in doubt already (PaidCalls.call)."""
    async with runtime.engine.connect() as conn:
        open_call = await paid_calls.has_open_call(conn, run.job.id)
    if open_call:
        reason = "cancelled with a paid call open; the provider may have charged"
        return Outcome.in_doubt(job_store.ErrorInfo("PaidCallInDoubt", reason))
    return Outcome.cancelled()


def decide(
    policy: RetryPolicy,
    job: job_store.Job,
    exc: BaseException,
    permanent: tuple[type[BaseException], ...],
) -> Outcome:
    """Map an agent's exception to the next state, using the database's attempt count."""
    error = error_info(exc)
    if isinstance(exc, spend.SpendDenied):
        return Outcome.denied(error)
    if isinstance(exc, PaidCallInDoubt):
        return Outcome.in_doubt(error)
    verdict = provider_errors.read(exc)
    if isinstance(exc, RateLimited) or (verdict is not None and verdict.next == "wait"):
        if job.deferrals >= policy.max_deferrals:
            why = f"rate limited for too long: sent back {job.deferrals} times; last: {exc}"
            return Outcome.dead_lettered(job_store.ErrorInfo("RateLimited", why))
        return Outcome.deferred(error, wait_s(policy, job, exc, verdict))
    if is_permanent(exc, permanent) or (verdict is not None and verdict.next == "fail"):
        return Outcome.failed(error)
    if policy.exhausted(job.attempts, job.max_attempts):
        return Outcome.dead_lettered(error)
    delay = exc.after_s if isinstance(exc, RetryLater) else policy.delay(job.attempts)
    return Outcome.retry(error, delay)


def within_deadline(job: job_store.Job, outcome: Outcome) -> Outcome:
    """A retry or deferral that would start at or after the job's run deadline fails now,
    saying what its attempt failed with."""
    if outcome.then is not Then.REQUEUE or job.deadline_at is None:
        return outcome
    if _now() + timedelta(seconds=outcome.delay_s) < job.deadline_at:
        return outcome
    return Outcome.failed(deadlines.error(job, after=outcome.error))


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


async def record_outcome(runtime: Runtime, run: Run, outcome: Outcome) -> str:
    """Write the outcome, guarded by the attempt number, and do what comes next: push a
    parent its settling child queued, log it, send a reply, hand a requeued job to arq."""
    state = await patiently(lambda: write_outcome(runtime, run, outcome), run.log)
    if state is None:
        run.log.warning("outcome_not_recorded_lease_lost", outcome=outcome.kind.value)
        return "lease_lost"
    if run.job.parent_id is not None and state in SETTLED:
        await push_parent(runtime, run.job.parent_id, run.log)
    log_outcome(run.log, outcome, state)
    if state is JobState.FAILED and outcome.error and outcome.error.error_class == DEADLINE:
        await patiently(lambda: deadlines.end_tree(runtime.engine, run.job.id, now=_now()), run.log)
    if state is JobState.CANCELLED:
        await patiently(lambda: stop_tree(runtime, run.job.id), run.log)
    if state in PARKED | TERMINAL and run.agent is not None and run.agent.config.paid:
        await observe_cost(runtime, run)
    if state is JobState.COMPLETED and run.reply is not None:
        await send_reply(runtime, run.job.id, run.reply, run.log)
    if state in SETTLED and runtime.deliverer is not None:
        runtime.deliverer.poke()  # its webhook notifications were recorded with the outcome
    if state is JobState.QUEUED:  # requeued, or parked when what it waits for was there
        raise Requeue(timedelta(seconds=outcome.delay_s), run.job.priority)
    return state.value


async def stop_tree(runtime: Runtime, job_id: str) -> None:
    """A job stopped with its children: reach what it spawned since the request."""
    async with runtime.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    if job is not None:
        await cancels.after_stop(runtime.engine, runtime.queue, job)


async def observe_cost(runtime: Runtime, run: Run) -> None:
    """A paid agent's finished job: what it spent over all its attempts, for the per-agent
    cost histogram (one read; jobs of unpaid agents never get here)."""
    try:
        async with runtime.engine.connect() as conn:
            cost = (await budgets.costs(conn, [run.job.id]))[run.job.id]
    except DBAPIError as exc:  # the outcome is written; only the histogram misses it
        run.log.warning("job_cost_not_observed", error=type(exc).__name__)
        return
    runtime.metrics.job_cost(run.job.agent, cost.spent_usd)


def log_outcome(jlog: Any, outcome: Outcome, state: JobState) -> None:
    """One line, `job_<kind>`: a warning when the job is parked for a person, else info."""
    fields: dict[str, Any] = {"state": state.value}
    if outcome.error is not None and outcome.kind is not Kind.DEFERRED:  # a 429 is no error
        fields["error_class"] = outcome.error.error_class
    if outcome.then is Then.REQUEUE:
        fields["retry_in_s"] = round(outcome.delay_s, 3)
    if outcome.then is Then.PARK:
        fields["waiting_for"] = outcome.writes["reason"]
    (jlog.warning if state in PARKED else jlog.info)("job_" + outcome.kind.value, **fields)


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


async def write_outcome(runtime: Runtime, run: Run, outcome: Outcome) -> JobState | None:
    """One try at writing `outcome` for the attempt `run.job.attempts` with its verb
    (OUTCOMES): the state it left the job in, or None when that attempt no longer holds the
    job (its lease was taken over)."""
    job, fate = run.job, OUTCOMES[outcome.kind]
    # A child's completion may queue its parent, and a completion may record a reply or
    # webhook notifications, in job_store.complete's transaction.
    batchable = run.reply is None and job.parent_id is None and not runtime.tells(job.agent)
    if outcome.kind is Kind.COMPLETED and batchable and runtime.batched is not None:
        done = await runtime.batched.complete(job.id, attempt=job.attempts, **outcome.writes)
        return fate.state if done else None
    now = _now()
    keywords = dict(outcome.writes, attempt=job.attempts, now=now)
    if fate.then is Then.REQUEUE:
        keywords["run_after"] = now + timedelta(seconds=outcome.delay_s)
    async with transaction(runtime.engine) as conn:
        written = await fate.verb(conn, job.id, **keywords)
        if written and fate.also is not None:
            await fate.also(conn, run, now)
        if not written and fate.then is not Then.RETURN:
            # Refused to queue or park a job asked to stop (cancels.py): stop it instead.
            if await job_store.stop(conn, job.id, attempt=job.attempts, error=STOPPED, now=now):
                await cancels.close_asked(conn, job.id, now=now)
                return JobState.CANCELLED
    if not written:
        return None
    # waiting.park says which state: a parent whose children all settled meanwhile is queued.
    return JobState(written) if isinstance(written, str) else fate.state


async def push_parent(runtime: Runtime, parent_id: str, jlog: Any) -> None:
    """Push a parent that this child's settling queued (if Redis refuses, recovery will)."""
    async with runtime.engine.connect() as conn:
        parent = await queries.get_job(conn, parent_id)
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
    """The class, message and traceback of `exc`, as stored on the attempt. A NUL character
    (a parser quoting the bytes it choked on) is written `\\x00`: PostgreSQL's text columns
    refuse it, and the outcome's write failed until recovery ran the job again.

    >>> error_info(ValueError("bad \\x00 byte")).message
    'bad \\\\x00 byte'
    """
    message = str(exc) or repr(exc)
    if isinstance(exc, TimeoutError) and not str(exc):
        message = "the agent ran past its timeout"
    return job_store.ErrorInfo(
        error_class=type(exc).__name__,
        message=_storable(message)[:2000],
        traceback=_storable("".join(traceback.format_exception(exc)))[-8000:],
    )


def _storable(text: str) -> str:
    return text.replace("\x00", "\\x00")


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
