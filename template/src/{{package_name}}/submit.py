"""Submit jobs: the row is committed first, then its id is pushed to arq (template-owned).

Usable from a web app: `job_id = await submit("summarize", {"text": ...})`. If Redis is down
the row stays `queued` and recovery pushes it later; the caller gets the id either way.
Many jobs at once: `await submitter.submit_many([Submission("summarize", {...}), ...])`
commits every row in one transaction and pushes the ids in batches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import structlog
from sqlalchemy.exc import OperationalError

from . import deadlines, job_store
from .batched import INSERT_SQL, DatabaseUnavailable, PostgresInserts
from .budgets import BudgetRefused, parse_budget
from .db import create_engine, one_statement, transaction
from .observe import tracing
from .queries import PRIORITIES
from .queue import JobQueue, Push, QueueUnavailable
from .registry import Agent, load_agents
from .settings import Settings, check_redis_tls, get_settings

log = structlog.get_logger("submit")


class SubmitError(ValueError):
    """The job was refused before anything was written; the message says why."""


class RecordedNotQueued(QueueUnavailable):
    """The job rows are committed as `queued` but Redis did not take their ids.

    `job_id` is the (first) job; `job_ids` every job of the call that Redis may lack.
    """

    def __init__(self, job_id: str, reason: str, *, job_ids: Sequence[str] = ()) -> None:
        self.job_id = job_id
        self.job_ids = list(job_ids) or [job_id]
        if len(self.job_ids) == 1:
            what, it = f"job {job_id} is", "it"
        else:
            what, it = f"{len(self.job_ids)} jobs (the first {job_id}) are", "them"
        super().__init__(
            f"{what} recorded as queued, but Redis did not take {it} ({reason}); "
            f"a worker's recovery will queue {it} once Redis accepts {it}"
        )


@dataclass(frozen=True)
class Submission:
    """One job for `Submitter.submit_many`."""

    agent: str
    payload: dict[str, Any]
    owner: str | None = None
    idempotency_key: str | None = None
    budget_usd: Decimal | str | None = None  # else the agent's job_budget_usd
    deadline_s: int | None = None  # else the agent's deadline_s


class Submitter:
    """Holds a database engine and a Redis pool for repeated submits."""

    def __init__(self, settings: Settings, agents: dict[str, Agent] | None = None) -> None:
        # A Redis set-up the TLS mode refuses must fail before a row is written.
        check_redis_tls(settings)
        self.settings = settings
        self.agents = agents if agents is not None else load_agents(settings)
        self.engine = create_engine(settings)
        self._inserts = (
            PostgresInserts(settings.database_url, pooling=settings.database_pooling)
            if self.engine.dialect.name == "postgresql"
            else None
        )
        self._queue: JobQueue | None = None
        self._connecting = asyncio.Lock()

    def check(self, agent: str, payload: Any) -> dict[str, Any]:
        """Refuse an unknown agent or a payload that is not a small JSON object."""
        if agent not in self.agents:
            known = ", ".join(sorted(self.agents)) or "none"
            raise SubmitError(f"unknown agent {agent!r}; known agents: {known}")
        if not isinstance(payload, dict):
            raise SubmitError(f"the payload must be a JSON object, not {_json_type(payload)}")
        try:
            size = len(json.dumps(payload).encode())
        except (TypeError, ValueError) as exc:
            raise SubmitError(f"the payload is not JSON-serialisable: {exc}") from exc
        limit = self.settings.max_payload_bytes
        if size > limit:
            raise SubmitError(
                f"the payload is {size} bytes, over the {limit}-byte limit "
                f"(raise it with {self.settings.model_config.get('env_prefix')}MAX_PAYLOAD_BYTES)"
            )
        return payload

    async def submit(
        self,
        agent: str,
        payload: Any,
        *,
        owner: str | None = None,
        idempotency_key: str | None = None,
        delay_s: float | None = None,
        run_at: datetime | None = None,
        priority: str = "normal",
        budget_usd: Decimal | str | None = None,
        deadline_s: int | None = None,
    ) -> str:
        """Record the job, then queue it; returns the job id. `delay_s` or `run_at` (aware
        UTC, in the future) delays it; `priority` is "high", "normal" or "low"; `budget_usd`
        is what it and its children may spend in all (else the agent's `job_budget_usd`);
        `deadline_s` the seconds it has to finish in (else the agent's `deadline_s`)."""
        job_id, _created = await self.submit_or_get(
            agent,
            payload,
            owner=owner,
            idempotency_key=idempotency_key,
            delay_s=delay_s,
            run_at=run_at,
            priority=priority,
            budget_usd=budget_usd,
            deadline_s=deadline_s,
        )
        return job_id

    async def submit_or_get(
        self,
        agent: str,
        payload: Any,
        *,
        owner: str | None = None,
        idempotency_key: str | None = None,
        delay_s: float | None = None,
        run_at: datetime | None = None,
        priority: str = "normal",
        budget_usd: Decimal | str | None = None,
        deadline_s: int | None = None,
    ) -> tuple[str, bool]:
        """`submit`, also saying whether the job is new: (job id, created). A repeated
        (owner, idempotency key) gives the existing job with created=False, not queued again."""
        checked = self.check(agent, payload)
        check_keys(owner, idempotency_key)
        now = datetime.now(UTC)
        run_after = due_at(now, delay_s=delay_s, run_at=run_at)
        rank = priority_rank(priority)
        budget = self.budget(agent, budget_usd)
        deadline_at = self.deadline(agent, deadline_s, now=now)
        row = job_store.NewJob(
            agent=agent,
            lane=self.agents[agent].config.lane,
            payload=checked,
            max_attempts=self.agents[agent].max_attempts,
            owner=owner,
            idempotency_key=idempotency_key,
            run_after=run_after,
            priority=rank,
            budget_micros=budget,
            deadline_at=deadline_at,
        )
        with tracing.submit_span(agent, row.lane) as span:
            return await self._submit(replace(row, trace_context=span.context), span, now)

    async def _record(self, row: job_store.NewJob, now: datetime) -> tuple[str, bool]:
        """Write the job's row: (its id, True), or (the id of the job that holds its
        idempotency key, False)."""
        if self._inserts is not None and row.budget_micros is None:
            # PostgreSQL, no budget: one INSERT with the concurrent callers' rows.
            job_id = job_store.new_job_id()
            try:
                written = await self._inserts.insert(job_id, row, now)
            except DatabaseUnavailable as exc:
                # What SQLAlchemy raises for the same failure: callers catch one family.
                raise OperationalError(INSERT_SQL, None, exc.__cause__ or exc) from exc
            if written:
                return job_id, True
            async with self.engine.connect() as conn:
                return await job_store.holder(conn, row.owner, row.idempotency_key), False
        # Without a budget the job is one INSERT, which commits on its own; a budget is a
        # second row, written in the same transaction.
        if row.budget_micros is None:
            recording = one_statement(self.engine, self.settings.database_pooling)
        else:
            recording = transaction(self.engine)
        async with recording as conn:
            ((job_id, created),) = await job_store.enqueue_many(conn, [row], now=now)
        return job_id, created

    def budget(self, agent: str, budget_usd: Decimal | str | None) -> int | None:
        """The new job's budget in micro-dollars: the one given, else its agent's
        `job_budget_usd`, else None (SubmitError for one that is not a budget)."""
        if budget_usd is None:
            return self.agents[agent].route.budget_micros
        try:
            return parse_budget(budget_usd)
        except BudgetRefused as exc:
            raise SubmitError(str(exc)) from None

    def deadline(self, agent: str, deadline_s: int | None, *, now: datetime) -> datetime | None:
        """When a job of `agent` submitted `now` must have finished: `deadline_s` from now,
        else its agent's `deadline_s`, else None (SubmitError for one out of range). A
        delayed job whose deadline comes first is taken, and fails at its deadline."""
        if deadline_s is None:
            deadline_s = self.agents[agent].route.deadline_s
        else:
            try:
                deadline_s = deadlines.parse_deadline(deadline_s)
            except deadlines.DeadlineRefused as exc:
                raise SubmitError(str(exc)) from None
        return deadlines.due(now, deadline_s)

    async def _submit(
        self, row: job_store.NewJob, span: tracing.Submit, now: datetime
    ) -> tuple[str, bool]:
        job_id, created = await self._record(row, now)
        span.recorded(job_id)
        if not created:
            log.info("job_exists", job_id=job_id, agent=row.agent)
            return job_id, False
        try:
            queue = await self._get_queue()
            await queue.push_many([Push(job_id, row.lane, row.run_after, row.priority, row.agent)])
        except QueueUnavailable as exc:
            log.warning("job_recorded_not_queued", job_id=job_id, agent=row.agent, error=str(exc))
            raise RecordedNotQueued(job_id, str(exc)) from exc
        log.info("job_submitted", job_id=job_id, agent=row.agent, lane=row.lane)
        return job_id, True

    async def submit_many(self, submissions: Iterable[Submission]) -> list[str]:
        """Record many jobs in one transaction, then queue them in batches; returns their
        ids in order.

        All or nothing before Redis: one bad submission raises SubmitError and writes no
        row. A repeated (owner, idempotency key), in the batch or already recorded, gives the
        existing job's id and is not queued again. When Redis refuses the ids the rows stay
        committed as `queued` and RecordedNotQueued names them (recovery queues them).
        """
        batch = list(submissions)
        for item in batch:
            self.check(item.agent, item.payload)
            check_keys(item.owner, item.idempotency_key)
        now = datetime.now(UTC)
        rows = [
            job_store.NewJob(
                agent=item.agent,
                lane=self.agents[item.agent].config.lane,
                payload=item.payload,
                max_attempts=self.agents[item.agent].max_attempts,
                owner=item.owner,
                idempotency_key=item.idempotency_key,
                budget_micros=self.budget(item.agent, item.budget_usd),
                deadline_at=self.deadline(item.agent, item.deadline_s, now=now),
            )
            for item in batch
        ]
        async with transaction(self.engine) as conn:
            recorded = await job_store.enqueue_many(conn, rows, now=now)
        ids = [job_id for job_id, _ in recorded]
        new = [
            Push(job_id, row.lane, agent=row.agent)
            for (job_id, created), row in zip(recorded, rows, strict=True)
            if created
        ]
        if not new:
            return ids
        try:
            queue = await self._get_queue()
            await queue.push_many(new)
        except QueueUnavailable as exc:
            log.warning("jobs_recorded_not_queued", jobs=len(new), error=str(exc))
            raise RecordedNotQueued(
                new[0].job_id, str(exc), job_ids=[push.job_id for push in new]
            ) from exc
        log.info("jobs_submitted", jobs=len(new), existing=len(ids) - len(new))
        return ids

    async def _get_queue(self) -> JobQueue:
        # One pool however many first submits run at once (each would make one, and all but
        # the last would never be closed).
        async with self._connecting:
            if self._queue is None:
                self._queue = await JobQueue.connect(self.settings, conn_retries=0)
        return self._queue

    async def close(self) -> None:
        if self._queue is not None:
            await self._queue.close()
            self._queue = None
        if self._inserts is not None:
            await self._inserts.close()
        await self.engine.dispose()


_default: dict[asyncio.AbstractEventLoop, Submitter] = {}


def check_keys(owner: str | None, idempotency_key: str | None) -> None:
    """Refuse a NUL character in the owner or the idempotency key: a text column cannot hold
    one on PostgreSQL, and the insert failed as an unexpected error (a 500 from the API).

    >>> check_keys("team-a", None)
    >>> try:
    ...     check_keys("team\\x00a", None)
    ... except SubmitError as exc:
    ...     print(exc)
    the owner holds a NUL character (\\u0000); remove it
    """
    for name, value in (("owner", owner), ("idempotency key", idempotency_key)):
        if value is not None and "\x00" in value:
            raise SubmitError(nul_refused(f"the {name}"))


def nul_refused(what: str) -> str:
    """What a text with a NUL character is told, `what` naming it (here and in the API)."""
    return f"{what} holds a NUL character (\\u0000); remove it"


async def submit(
    agent: str,
    payload: dict[str, Any],
    *,
    owner: str | None = None,
    idempotency_key: str | None = None,
    delay_s: float | None = None,
    run_at: datetime | None = None,
    priority: str = "normal",
    deadline_s: int | None = None,
) -> str:
    """Submit with a process-wide `Submitter` (one per event loop); returns the job id.

    Raises SubmitError for bad input (nothing written) and QueueUnavailable when the row is
    recorded but Redis could not take it (RecordedNotQueued, with .job_id; recovery
    queues it).
    """
    loop = asyncio.get_running_loop()
    submitter = _default.get(loop)
    if submitter is None:
        submitter = _default[loop] = Submitter(get_settings())
    return await submitter.submit(
        agent,
        payload,
        owner=owner,
        idempotency_key=idempotency_key,
        delay_s=delay_s,
        run_at=run_at,
        priority=priority,
        deadline_s=deadline_s,
    )


# A longer wait is a schedule (schedules.py), not a delay; the bound also keeps every due
# time far inside what a datetime, the database and Redis can hold.
MAX_DELAY_S = 365 * 24 * 3600


def priority_rank(priority: str) -> int:
    """The stored rank of a priority name (`queries.PRIORITIES`).

    >>> priority_rank("high")
    1
    """
    if priority not in PRIORITIES:
        raise SubmitError(f"priority {priority!r} is not one of high, normal, low; write e.g. high")
    return PRIORITIES[priority]


def parse_delay(value: float | str, *, field: str = "delay_s") -> float:
    """Seconds to wait before the first run, from 0 to MAX_DELAY_S; SubmitError names
    `field` and the range. The CLI (`--delay`, text) and the API (`delay_s`, a JSON
    number) both read a delay here.

    >>> parse_delay("90", field="--delay")
    90.0
    >>> try:
    ...     parse_delay(1e12)
    ... except SubmitError as exc:
    ...     print(exc)
    delay_s must be from 0 to 31536000 seconds (365 days), e.g. 60 (got 1000000000000.0)
    """
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            raise SubmitError(
                f"{field} must be a number of seconds, e.g. 60 (got {shown(value)})"
            ) from None
    else:
        seconds = value  # an int stays exact: 10**400 compares, float() would overflow
    if not 0 <= seconds <= MAX_DELAY_S:  # NaN fails both comparisons
        raise SubmitError(
            f"{field} must be from 0 to {MAX_DELAY_S} seconds ({MAX_DELAY_S // 86400} days), "
            f"e.g. 60 (got {shown(value)})"
        )
    return float(seconds)


def due_at(now: datetime, *, delay_s: float | None, run_at: datetime | None) -> datetime | None:
    """When a delayed job may first run (None: now); refuses a past, naive, doubled or more
    than MAX_DELAY_S away time.

    >>> due_at(datetime(2026, 1, 1, tzinfo=UTC), delay_s=90, run_at=None).isoformat()
    '2026-01-01T00:01:30+00:00'
    """
    if delay_s is not None and run_at is not None:
        raise SubmitError("give either a delay or a time to run at, not both")
    if delay_s is not None:
        seconds = parse_delay(delay_s)
        return now + timedelta(seconds=seconds) if seconds else None
    if run_at is None:
        return None
    if run_at.tzinfo is None:
        raise SubmitError(
            f"run_at {run_at.isoformat()} has no time zone; write it in UTC, "
            "e.g. 2026-12-24T18:00:00+00:00"
        )
    if run_at <= now:
        raise SubmitError(
            f"run_at {run_at.isoformat()} is in the past; write a future time, "
            f"e.g. {(now + timedelta(hours=1)).replace(microsecond=0).isoformat()}"
        )
    if run_at - now > timedelta(seconds=MAX_DELAY_S):
        raise SubmitError(
            f"run_at {run_at.isoformat()} is more than {MAX_DELAY_S // 86400} days away; "
            "use a schedule for jobs that far ahead"
        )
    return run_at.astimezone(UTC)


def shown(value: object, most: int = 40) -> str:
    """`repr(value)` cut to `most` characters, for quoting an input back in an error.

    >>> shown("x" * 100, most=10)
    "'xxxxxx..."
    """
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return "a number too long to show"
    return text if len(text) <= most else text[: most - 3] + "..."


def _json_type(value: Any) -> str:
    return {
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)
