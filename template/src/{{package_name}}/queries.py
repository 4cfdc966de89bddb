"""Every read of the job table: rows, pages and counts (template-owned: copier-agent-worker).

The CLI, the API and the console list and show jobs with these; stats and `/metrics` count
with them; recovery and the fan-in pages walk with them. None of them changes a row: every
write is a guarded verb of `job_store`, which returns the same `Job` these read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, case, func, literal, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import attempts, in_states, jobs, webhook_deliveries
from .states import SETTLED, TERMINAL, JobState

# `waiting_for` of a parent waiting for its children; an approval's is "approval:NAME".
CHILDREN = "children"
# A priority is stored as its rank (higher runs first) and shown by its name, in and out.
PRIORITIES = {"high": 1, "normal": 0, "low": -1}
PRIORITY_NAMES = {rank: name for name, rank in PRIORITIES.items()}


@dataclass(frozen=True)
class Job:
    """A job row as read from the database."""

    id: str
    agent: str
    lane: str
    state: JobState
    payload: dict[str, Any]
    result: dict[str, Any] | None
    owner: str
    idempotency_key: str | None
    attempts: int
    max_attempts: int
    run_after: datetime | None
    lease_expires_at: datetime | None
    worker: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    trace_context: dict[str, str] | None = None
    parent_id: str | None = None  # set on a child job (ctx.spawn)
    child_key: str | None = None
    waiting_for: str | None = None  # "approval:NAME" or "children" while `waiting`
    # How often an upstream's rate limit sent the job back to wait (RateLimited), and its
    # priority (-1 low, 0 normal, 1 high): both from 0005_flow_control.
    deferrals: int = 0
    priority: int = 0
    budget_id: str | None = None  # the job whose budget covers this one (budgets.py)
    event_seq: int = 0  # the seq of its last event (events.py)
    deadline_at: datetime | None = None  # when it must have finished (deadlines.py)
    cancel_requested_at: datetime | None = None  # asked to stop while running (cancels.py)
    cancel_children: bool | None = None  # ...with its descendants (jobs cancel --children)
    rerun_of: str | None = None  # the job this one reruns from a step (reruns.py)
    code_version: str | None = None  # its agent's code version at its first claim (versions.py)

    @classmethod
    def from_row(cls, row: Any) -> Job:
        values = dict(row._mapping)
        values["state"] = JobState(values["state"])
        return cls.of(values)

    @classmethod
    def of(cls, values: dict[str, Any]) -> Job:
        """`Job(**values)` for a whole row, in a fifth of the time: a frozen dataclass's
        `__init__` sets each of its 31 fields with a call of its own (10 µs a job, claimed
        by the thousand). Any other set of keys goes through `__init__`, and its errors."""
        if values.keys() != JOB_FIELDS:
            return cls(**values)
        job = object.__new__(cls)
        job.__dict__.update(values)
        return job

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: states as strings, times as ISO 8601 UTC, the priority by its name
        ("high", "normal", "low": what a submit takes)."""
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobState):
                value = value.value
            out[key] = value
        out["priority"] = PRIORITY_NAMES.get(self.priority, str(self.priority))
        return out

    def scheduled_for(self, now: datetime) -> datetime | None:
        """When a `queued` job becomes due, if that is still in the future (a delay, a
        backoff or a deferral); None when it is due now or not queued."""
        if self.state is JobState.QUEUED and self.run_after is not None and self.run_after > now:
            return self.run_after
        return None


JOB_FIELDS = frozenset(field.name for field in fields(Job))


@dataclass(frozen=True)
class Attempt:
    """One start of a job, with its outcome."""

    number: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error_class: str | None
    error_message: str | None
    traceback: str | None


@dataclass(frozen=True)
class Delivery:
    """One notification of a job's end to a webhook endpoint (webhooks.py), as sent so far."""

    endpoint: str
    state: str  # pending / sending / sent / failed (given up)
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    sent_at: datetime | None
    last_error: str | None


# One job ----------------------------------------------------------------------------------


async def get_job(conn: AsyncConnection, job_id: str) -> Job | None:
    """The job with this id; None when there is none (or it was pruned)."""
    row = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).first()
    return Job.from_row(row) if row is not None else None


async def job_attempts(conn: AsyncConnection, job_id: str) -> list[Attempt]:
    """A job's attempts, first first, each with its outcome."""
    stmt = (
        select(*(attempts.c[name] for name in Attempt.__dataclass_fields__))
        .where(attempts.c.job_id == job_id)
        .order_by(attempts.c.number)
    )
    return [Attempt(**row._mapping) for row in await conn.execute(stmt)]


async def job_deliveries(conn: AsyncConnection, job_id: str) -> list[Delivery]:
    """A job's webhook notifications, oldest first (none when no endpoint is set)."""
    stmt = (
        select(*(webhook_deliveries.c[name] for name in Delivery.__dataclass_fields__))
        .where(webhook_deliveries.c.job_id == job_id)
        .order_by(webhook_deliveries.c.id)
    )
    return [Delivery(**row._mapping) for row in await conn.execute(stmt)]


async def children_of(conn: AsyncConnection, parent_id: str) -> list[Job]:
    """A parent's children, oldest first."""
    stmt = select(jobs).where(jobs.c.parent_id == parent_id).order_by(jobs.c.created_at, jobs.c.id)
    return [Job.from_row(row) for row in await conn.execute(stmt)]


async def asked_to_stop(conn: AsyncConnection, job_ids: Sequence[str]) -> list[str]:
    """The ids among `job_ids` of running jobs an operator asked to stop (cancels.py)."""
    stmt = select(jobs.c.id).where(
        jobs.c.id.in_(job_ids),
        in_states(JobState.ACTIVE.value),
        jobs.c.cancel_requested_at.is_not(None),
    )
    return list((await conn.scalars(stmt)).all())


async def existing_ids(conn: AsyncConnection, job_ids: Sequence[str]) -> set[str]:
    """The ids among `job_ids` that have a row here."""
    if not job_ids:
        return set()
    return set((await conn.scalars(select(jobs.c.id).where(jobs.c.id.in_(job_ids)))).all())


async def unsettled_children(conn: AsyncConnection, parent_id: str) -> int:
    """How many of a parent's children have not settled yet."""
    stmt = select(func.count()).where(
        jobs.c.parent_id == parent_id, jobs.c.state.not_in([s.value for s in SETTLED])
    )
    return int(await conn.scalar(stmt) or 0)


# Listings and pages -----------------------------------------------------------------------


async def list_jobs(
    conn: AsyncConnection,
    *,
    state: JobState | None = None,
    agent: str | None = None,
    owner: str | None = None,
    since: datetime | None = None,
    before: str | None = None,
    limit: int = 50,
) -> list[Job]:
    """Newest first, created at or after `since`; `before` (a job id) pages on after that
    job (keyset paging)."""
    stmt = select(jobs).order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state.value)
    if agent is not None:
        stmt = stmt.where(jobs.c.agent == agent)
    if owner is not None:
        stmt = stmt.where(jobs.c.owner == owner)
    if since is not None:
        stmt = stmt.where(jobs.c.created_at >= since)
    if before is not None:
        mark = select(jobs.c.created_at).where(jobs.c.id == before).scalar_subquery()
        stmt = stmt.where(
            or_(jobs.c.created_at < mark, and_(jobs.c.created_at == mark, jobs.c.id < before))
        )
    return [Job.from_row(row) for row in await conn.execute(stmt)]


async def queued_page(
    conn: AsyncConnection, *, after_id: str, limit: int
) -> Sequence[tuple[str, str, datetime | None, int, str]]:
    """(id, lane, run_after, priority, agent) of `queued` jobs after `after_id`, in id
    order (keyset paging)."""
    stmt = (
        select(jobs.c.id, jobs.c.lane, jobs.c.run_after, jobs.c.priority, jobs.c.agent)
        .where(jobs.c.state == JobState.QUEUED.value, jobs.c.id > after_id)
        .order_by(jobs.c.id)
        .limit(limit)
    )
    return [
        (row.id, row.lane, row.run_after, row.priority, row.agent)
        for row in await conn.execute(stmt)
    ]


async def waiting_for_children_page(
    conn: AsyncConnection, *, after_id: str, limit: int
) -> Sequence[tuple[str, str, int, str]]:
    """(id, lane, priority, agent) of jobs `waiting` for their children after `after_id`, in
    id order."""
    stmt = (
        select(jobs.c.id, jobs.c.lane, jobs.c.priority, jobs.c.agent)
        .where(
            jobs.c.state == JobState.WAITING.value,
            jobs.c.waiting_for == CHILDREN,
            jobs.c.id > after_id,
        )
        .order_by(jobs.c.id)
        .limit(limit)
    )
    return [(row.id, row.lane, row.priority, row.agent) for row in await conn.execute(stmt)]


async def expired_leases(
    conn: AsyncConnection, *, now: datetime, after_id: str, limit: int
) -> list[str]:
    """Ids of `active` jobs whose lease has expired, in id order."""
    stmt = (
        select(jobs.c.id)
        .where(
            jobs.c.state == JobState.ACTIVE.value,
            jobs.c.lease_expires_at < now,
            jobs.c.id > after_id,
        )
        .order_by(jobs.c.id)
        .limit(limit)
    )
    return list((await conn.scalars(stmt)).all())


# Counts -----------------------------------------------------------------------------------


async def count_by_state(conn: AsyncConnection) -> dict[str, int]:
    """How many jobs each state holds, row by row; a state with none is left out. It reads
    the whole table: what runs every few seconds (stats, `/metrics`, the console) reads
    `state_counts`."""
    rows = await conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))
    return {str(state): int(count) for state, count in rows}


# A finished state past this many rows is counted from PostgreSQL's statistics of the table
# (what ANALYZE and autovacuum keep: within a percent or so), not row by row.
ESTIMATE_PAST = 100_000


@dataclass(frozen=True)
class StateCounts:
    """Jobs per state (a state with none left out), and the states whose count is
    PostgreSQL's estimate rather than a count of rows."""

    counts: dict[str, int]
    estimated: frozenset[str] = frozenset()


async def state_counts(conn: AsyncConnection) -> StateCounts:
    """Jobs per state at a cost that does not grow with the history: every state a job can
    leave is counted exactly (through the (state, lane) index: as many rows as are live or
    parked); `completed` and `cancelled`, which only grow until retention prunes them, are
    counted exactly up to `ESTIMATE_PAST` rows and estimated past it on PostgreSQL. SQLite
    counts every state exactly."""
    estimates = await _history_estimates(conn)
    estimated = {state: n for state, n in estimates.items() if n >= ESTIMATE_PAST}
    exact = [state.value for state in JobState if state.value not in estimated]
    rows = await conn.execute(
        select(jobs.c.state, func.count()).where(jobs.c.state.in_(exact)).group_by(jobs.c.state)
    )
    counts = {**{str(state): int(count) for state, count in rows}, **estimated}
    return StateCounts(counts, frozenset(estimated))


async def _history_estimates(conn: AsyncConnection) -> dict[str, int]:
    """Per terminal state, the planner's estimate of its rows (the table's row estimate times
    the state's share in its statistics); empty on SQLite and before the first ANALYZE."""
    if conn.dialect.name != "postgresql":
        return {}
    found = (
        await conn.execute(
            text(
                "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " LEFT JOIN pg_stats s ON s.schemaname = n.nspname"
                " AND s.tablename = c.relname AND s.attname = 'state'"
                " WHERE c.oid = CAST(:table AS regclass)"
            ),
            {"table": jobs.name},
        )
    ).first()
    if found is None or found[0] < 0 or found[1] is None:
        return {}
    rows, states, shares = found
    wanted = {state.value for state in TERMINAL}
    return {
        state: round(rows * share)
        for state, share in zip(states, shares, strict=True)
        if state in wanted
    }


async def count_in_state(conn: AsyncConnection, state: JobState) -> int:
    """How many jobs are in `state` (through the (state, lane) index)."""
    return int(await conn.scalar(select(func.count()).where(jobs.c.state == state.value)) or 0)


async def count_expired_leases(conn: AsyncConnection, *, now: datetime) -> int:
    """How many `active` jobs have a lease that expired before `now`."""
    stmt = select(func.count()).where(
        jobs.c.state == JobState.ACTIVE.value, jobs.c.lease_expires_at < now
    )
    return int(await conn.scalar(stmt) or 0)


async def oldest_queued(conn: AsyncConnection, *, now: datetime) -> dict[str, datetime]:
    """Per lane, since when its longest-waiting due `queued` job has been due. Jobs whose
    run_after is still ahead (delayed, backing off, deferred) are not waiting yet: see
    `scheduled_counts`."""
    rows = await conn.execute(oldest_queued_query(now))
    return {lane: _utc(since) for lane, since in rows if since is not None}


async def scheduled_counts(conn: AsyncConnection, *, now: datetime) -> dict[str, int]:
    """Per lane, how many `queued` jobs are not due yet (run_after in the future: a delayed
    submit, a retry backing off, a rate-limit deferral)."""
    return {lane: int(count) for lane, count in await conn.execute(scheduled_query(now))}


FINISHED_BADLY = frozenset({JobState.FAILED, JobState.DEAD_LETTERED, JobState.DENIED})


async def finished_per_bucket(
    conn: AsyncConnection, *, start: datetime, width: timedelta, buckets: int
) -> list[tuple[int, int, int]]:
    """(completed, failed, in_doubt) per bucket of `width` from `start`, oldest first: jobs
    that finished (or went in_doubt) then, counted by the database in one GROUP BY (the
    console's last-hour chart). A job that finished after the last bucket's end counts in
    the last one; failed means failed, dead_lettered or denied; completed is the rest
    (cancelled too)."""
    bounds = [(jobs.c.finished_at < start + width * (i + 1), i) for i in range(buckets - 1)]
    slot = case(*bounds, else_=buckets - 1) if bounds else literal(0)
    kind = case(
        (jobs.c.state.in_([s.value for s in FINISHED_BADLY]), 1),
        (jobs.c.state == JobState.IN_DOUBT.value, 2),
        else_=0,
    )
    # Grouped over a subquery's labels: PostgreSQL sees the CASE in SELECT and GROUP BY as
    # two expressions when their bound times are separate parameters.
    finished = (
        select(slot.label("slot"), kind.label("kind")).where(jobs.c.finished_at >= start).subquery()
    )
    rows = await conn.execute(
        select(finished.c.slot, finished.c.kind, func.count()).group_by(
            finished.c.slot, finished.c.kind
        )
    )
    counts = [[0, 0, 0] for _ in range(buckets)]
    for index, which, count in rows:
        counts[int(index)][int(which)] += int(count)
    return [(done, bad, doubt) for done, bad, doubt in counts]


# `/metrics` runs these two every few seconds: each reads `queued` rows only, through the
# (state, lane) index, never the whole table (tests/integration/test_delay_priority.py).


def oldest_queued_query(now: datetime) -> Select[Any]:
    """(lane, due since) of the due `queued` rows, grouped by lane."""
    return (
        select(jobs.c.lane, func.min(_due_since()))
        .where(
            jobs.c.state == JobState.QUEUED.value,
            or_(jobs.c.run_after.is_(None), jobs.c.run_after <= now),
        )
        .group_by(jobs.c.lane)
    )


def scheduled_query(now: datetime) -> Select[Any]:
    """(lane, count) of the `queued` rows not due yet, grouped by lane."""
    return (
        select(jobs.c.lane, func.count())
        .where(jobs.c.state == JobState.QUEUED.value, jobs.c.run_after > now)
        .group_by(jobs.c.lane)
    )


def _due_since() -> Any:
    """When a `queued` row became due: its run_after, or when it entered `queued` (every
    move sets updated_at) if that is later or there is no run_after."""
    return case((jobs.c.run_after > jobs.c.updated_at, jobs.c.run_after), else_=jobs.c.updated_at)


def _utc(value: Any) -> datetime:
    # min() over a UTCDateTime column comes back untyped on SQLite: a naive UTC string.
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    assert isinstance(moment, datetime)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
