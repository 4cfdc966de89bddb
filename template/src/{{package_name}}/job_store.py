"""The only writer of job rows: one guarded function per transition verb (template-owned).

Every verb is `UPDATE jobs SET state=:to ... WHERE id=:id AND state IN (:from...)`, with the
source states taken from `states.TRANSITIONS`. A verb that matches no row returns False (or
None): someone else moved the job, and the caller stops. Verbs that act for a running
attempt also match its attempt number, so a worker whose lease was taken over cannot write.
Reads (rows, listings, counts) are queries.py's; a verb reads only what its guard needs.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, case, exists, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from . import budgets, events, queries, webhooks
from .models import approvals as approvals_table
from .models import attempts, in_states, job_events, jobs, webhook_deliveries
from .models import budgets as budgets_table
from .models import paid_calls as paid_calls_table
from .models import replies as replies_table
from .models import steps as steps_table
from .queries import CHILDREN, unsettled_children

# The rows the verbs give back (`claim` returns a Job), importable from here as they always
# were; they are defined beside the reads (queries.py).
from .queries import Attempt as Attempt
from .queries import Job as Job

# A plain name, no warning: the generated agent tests of earlier releases (user-owned, kept
# by updates) read jobs with `job_store.get_job` under `filterwarnings = error`.
from .queries import get_job as get_job
from .states import RUNNABLE, SETTLED, WAITING, JobState, sources, target

LEASE_EXPIRED = "the lease expired with no outcome recorded"
ALL_ATTEMPTS_LOST = "the last attempt's worker stopped before recording an outcome"
STOPPED_LOST = "asked to stop; its worker stopped before recording an outcome"


@dataclass(frozen=True)
class ErrorInfo:
    """What went wrong in one attempt."""

    error_class: str
    message: str
    traceback: str | None = None


# The version (7) and the variant (0b10) of a UUIDv7; the 74 bits around them are random.
UUID7_MARKS = 0x7 << 76 | 0b10 << 62
RANDOM_BITS = (0xFFF << 64) | ((1 << 62) - 1)


def new_job_id() -> str:
    """A fresh job id, also the job's arq id: a UUIDv7 (RFC 9562) in 32 hex digits, its first
    48 bits the Unix time in milliseconds and 74 of the rest random. Ids made later sort
    later, so a new job's key goes to the right edge of the primary key's index (and of every
    table keyed by job id), not to a random page of it: at millions of rows a random id costs
    each insert a page PostgreSQL must read and log whole after each checkpoint.

    >>> a, b = new_job_id(), new_job_id()
    >>> len(a), a[12], a < b or a[:12] == b[:12]
    (32, '7', True)
    """
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10)) & RANDOM_BITS
    return f"{value | UUID7_MARKS:032x}"


async def enqueue(
    conn: AsyncConnection,
    *,
    agent: str,
    lane: str,
    payload: dict[str, Any],
    max_attempts: int,
    now: datetime,
    owner: str | None = None,
    idempotency_key: str | None = None,
    run_after: datetime | None = None,
    priority: int = 0,
    budget_micros: int | None = None,
    deadline_at: datetime | None = None,
) -> tuple[str, bool]:
    """Insert a `queued` job; return (id, created). A repeated idempotency key returns the
    existing job's id with created=False."""
    job = NewJob(
        agent,
        lane,
        payload,
        max_attempts,
        owner,
        idempotency_key,
        run_after=run_after,
        priority=priority,
        budget_micros=budget_micros,
        deadline_at=deadline_at,
    )
    ((job_id, created),) = await enqueue_many(conn, [job], now=now)
    return job_id, created


@dataclass(frozen=True)
class NewJob:
    """One row for `enqueue_many`."""

    agent: str
    lane: str
    payload: dict[str, Any]
    max_attempts: int
    owner: str | None = None
    idempotency_key: str | None = None
    trace_context: dict[str, str] | None = None
    run_after: datetime | None = None  # not before (a delayed job)
    priority: int = 0  # -1 low, 0 normal, 1 high
    budget_micros: int | None = None  # what the job (and its children) may spend in all
    deadline_at: datetime | None = None  # when it must have finished (deadlines.py)
    rerun_of: str | None = None  # the job it reruns from a step (reruns.py)
    # The code version its copied records were made by (a rerun's; else its first claim's).
    code_version: str | None = None


# Rows per INSERT: 17 columns each stays under SQLite's and asyncpg's bound-parameter limits.
ENQUEUE_CHUNK = 1000
# One statement per dialect, built once, its rows passed as parameters: SQLAlchemy compiles
# it once and sends many rows as one multi-row INSERT ("insertmanyvalues"). A statement
# built with `.values(rows)` is compiled anew for every call (a millisecond a job).
_INSERT_JOBS = {
    name: insert(jobs).on_conflict_do_nothing().returning(jobs.c.id)
    for name, insert in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}


async def enqueue_many(
    conn: AsyncConnection, new_jobs: Sequence[NewJob], *, now: datetime
) -> list[tuple[str, bool]]:
    """`enqueue` for many jobs, a multi-row INSERT per chunk: (id, created) per job, in
    order. A repeated (owner, idempotency key), already recorded or earlier in the same
    call, gives the first job's id with created=False."""
    ids = [new_job_id() for _ in new_jobs]
    keys = [(job.owner or "", job.idempotency_key) for job in new_jobs]
    rows = [
        {
            "id": job_id,
            "agent": job.agent,
            "lane": job.lane,
            "state": JobState.QUEUED.value,
            "payload": job.payload,
            "owner": owner,
            "idempotency_key": key,
            "attempts": 0,
            "max_attempts": job.max_attempts,
            "trace_context": job.trace_context,
            "run_after": job.run_after,
            "priority": job.priority,
            "budget_id": None if job.budget_micros is None else job_id,
            "deadline_at": job.deadline_at,
            "rerun_of": job.rerun_of,
            "code_version": job.code_version,
            "created_at": now,
            "updated_at": now,
        }
        for job_id, job, (owner, key) in zip(ids, new_jobs, keys, strict=True)
    ]
    stmt = _INSERT_JOBS[conn.dialect.name]
    created: set[str] = set()
    for start in range(0, len(rows), ENQUEUE_CHUNK):
        created.update(await conn.scalars(stmt, rows[start : start + ENQUEUE_CHUNK]))
    for job_id, job in zip(ids, new_jobs, strict=True):
        if job_id in created and job.budget_micros is not None:
            await budgets.open_budget(conn, job_id, job.budget_micros, covering=None, now=now)
    existing: dict[tuple[str, str | None], str] = {}
    for job_id, (owner, key) in zip(ids, keys, strict=True):
        if job_id in created or (owner, key) in existing:
            continue
        existing[(owner, key)] = await holder(conn, owner, key)  # repeated keys: usually none
    return [
        (job_id, True) if job_id in created else (existing[key], False)
        for job_id, key in zip(ids, keys, strict=True)
    ]


async def holder(conn: AsyncConnection, owner: str | None, key: str | None) -> str:
    """The id of the job recorded with (owner, idempotency key), which a new job's INSERT
    conflicted with."""
    found = await conn.scalar(
        select(jobs.c.id).where(jobs.c.owner == (owner or ""), jobs.c.idempotency_key == key)
    )
    if found is None:  # pragma: no cover - an id collision
        raise RuntimeError("job insert conflicted but no existing job was found")
    return str(found)


async def claim(
    conn: AsyncConnection,
    job_id: str,
    *,
    worker: str,
    now: datetime,
    lease_s: float,
    versions: Mapping[str, str] | None = None,
) -> Job | None:
    """Take the job for one attempt: `queued` (and due) or `active` with an expired lease.

    Counts the attempt, opens its `attempts` row and closes any attempt a vanished worker
    left open; a job's first claim records its agent's code version from `versions` (by
    agent; versions.py). Returns None when the job is not claimable (running elsewhere,
    finished, parked, not yet due, or lost on its last attempt).
    """
    sql_state = jobs.c.state
    claimable = or_(
        and_(
            sql_state == JobState.QUEUED.value,
            or_(jobs.c.run_after.is_(None), jobs.c.run_after <= now),
        ),
        # A lost attempt is taken over only while attempts remain; a lost last attempt is
        # settled by `exhaust` (or `mark_in_doubt`) instead.
        and_(
            sql_state == JobState.ACTIVE.value,
            jobs.c.lease_expires_at < now,
            jobs.c.attempts < jobs.c.max_attempts,
            jobs.c.cancel_requested_at.is_(None),  # recovery stops it instead
        ),
    )
    row = (
        await conn.execute(
            _move(
                "claim",
                job_id,
                now,
                attempts=jobs.c.attempts + 1,
                worker=worker,
                claimed_at=now,
                lease_expires_at=now + timedelta(seconds=lease_s),
                run_after=None,
                **_first_version(versions),
            )
            .where(claimable)
            .returning(*jobs.c)
        )
    ).first()
    if row is None:
        return None
    job = Job.from_row(row)
    started = events.New("attempt_started", {"worker": worker}, job.attempts)
    await events.record(conn, job_id, job.event_seq, started, now=now)
    if job.attempts > 1:  # a first attempt has no earlier attempt row to close
        reason = "the worker stopped before recording an outcome"
        await _close_open_attempts(conn, job_id, now, "lost", "WorkerLost", reason)
    await conn.execute(
        insert(attempts).values(job_id=job_id, number=job.attempts, worker=worker, started_at=now)
    )
    return job


def _first_version(versions: Mapping[str, str] | None) -> dict[str, Any]:
    """The claim's write of the job's code version: its agent's, kept once recorded."""
    if not versions:
        return {}
    current = case(dict(versions), value=jobs.c.agent, else_=None)
    return {"code_version": func.coalesce(jobs.c.code_version, current)}


async def heartbeat(
    conn: AsyncConnection, job_id: str, *, attempt: int, now: datetime, lease_s: float
) -> bool:
    """Renew the lease of a running attempt; False when the attempt no longer holds it."""
    stmt = _move("heartbeat", job_id, now, lease_expires_at=now + timedelta(seconds=lease_s)).where(
        jobs.c.attempts == attempt
    )
    return (await conn.execute(stmt)).rowcount == 1


async def complete(
    conn: AsyncConnection, job_id: str, *, attempt: int, result: dict[str, Any], now: datetime
) -> bool:
    """Record success: `completed` with its result."""
    return await _finish(
        conn, "complete", job_id, attempt, now, "completed", result=result, finished_at=now
    )


async def retry(
    conn: AsyncConnection,
    job_id: str,
    *,
    attempt: int,
    run_after: datetime,
    error: ErrorInfo,
    now: datetime,
) -> bool:
    """Back to `queued`, not to run before `run_after`."""
    return await _finish(conn, "retry", job_id, attempt, now, "retry", error, run_after=run_after)


async def defer(
    conn: AsyncConnection,
    job_id: str,
    *,
    attempt: int,
    run_after: datetime,
    error: ErrorInfo,
    now: datetime,
) -> bool:
    """An upstream rate limit: back to `queued` until `run_after` without using an attempt
    (the attempt's row says `deferred`; the job's budget grows by the one it used)."""
    return await _finish(
        conn,
        "defer",
        job_id,
        attempt,
        now,
        "deferred",
        error,
        run_after=run_after,
        max_attempts=jobs.c.max_attempts + 1,
        deferrals=jobs.c.deferrals + 1,
    )


async def fail(
    conn: AsyncConnection, job_id: str, *, attempt: int, error: ErrorInfo, now: datetime
) -> bool:
    """Permanent failure: `failed`, never retried automatically."""
    return await _finish(conn, "fail", job_id, attempt, now, "failed", error, finished_at=now)


async def dead_letter(
    conn: AsyncConnection, job_id: str, *, attempt: int, error: ErrorInfo, now: datetime
) -> bool:
    """Retries exhausted: `dead_lettered`, kept with every attempt's error."""
    return await _finish(
        conn, "dead_letter", job_id, attempt, now, "dead_lettered", error, finished_at=now
    )


async def rescue(conn: AsyncConnection, job_id: str, *, now: datetime) -> bool:
    """Recovery: an `active` job whose lease expired, with attempts left, goes back to
    `queued`."""
    stmt = _move("rescue", job_id, now, lease_expires_at=None, run_after=None).where(
        jobs.c.lease_expires_at < now,
        jobs.c.attempts < jobs.c.max_attempts,
        jobs.c.cancel_requested_at.is_(None),
    )
    if not await _moved(conn, stmt, job_id, _state("rescue", reason=LEASE_EXPIRED), now):
        return False
    await _close_open_attempts(conn, job_id, now, "lost", "WorkerLost", LEASE_EXPIRED)
    return True


async def exhaust(conn: AsyncConnection, job_id: str, *, now: datetime) -> bool:
    """Recovery: an `active` job whose lease expired on its last attempt is dead-lettered;
    that attempt is recorded as lost, and no attempt beyond `max_attempts` is ever opened."""
    stmt = _move(
        "dead_letter",
        job_id,
        now,
        finished_at=now,
        lease_expires_at=None,
        last_error=_summary(ErrorInfo("AttemptsExhausted", ALL_ATTEMPTS_LOST)),
    ).where(jobs.c.lease_expires_at < now, jobs.c.attempts >= jobs.c.max_attempts)
    if not await _settle(conn, stmt, job_id, _state("dead_letter", reason=ALL_ATTEMPTS_LOST), now):
        return False
    await _close_open_attempts(conn, job_id, now, "lost", "WorkerLost", LEASE_EXPIRED)
    return True


async def cancel(conn: AsyncConnection, job_id: str, *, now: datetime) -> bool:
    """An operator stops a job that is queued, waiting or parked."""
    stmt = _move("cancel", job_id, now, finished_at=now, waiting_for=None)
    return await _settle(conn, stmt, job_id, _state("cancel"), now)


async def request_cancel(
    conn: AsyncConnection, job_id: str, *, now: datetime, children: bool = False
) -> bool:
    """An operator asks to stop a running job: the job stays `active` until the worker that
    runs it stops it (`stop`) or recovery does for a vanished worker (`stop_abandoned`); its
    attempt can no longer queue it again or park it waiting. False when it is not running."""
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id, in_states(JobState.ACTIVE.value))
        .values(
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, now),
            cancel_children=True if children else jobs.c.cancel_children,
            updated_at=now,
            event_seq=jobs.c.event_seq + 1,
        )
    )
    asked = events.New("cancel_requested", {"children": children})
    return await _moved(conn, stmt, job_id, asked, now)


async def stop(
    conn: AsyncConnection, job_id: str, *, attempt: int, error: ErrorInfo, now: datetime
) -> bool:
    """A cancel reached running attempt `attempt` before it recorded another outcome:
    `cancelled`, with why (only a job asked to stop)."""
    asked = jobs.c.cancel_requested_at.is_not(None)
    return await _finish(
        conn, "stop", job_id, attempt, now, "cancelled", error, guard=asked, finished_at=now
    )


async def stop_abandoned(conn: AsyncConnection, job_id: str, *, now: datetime) -> bool:
    """Recovery: a job asked to stop whose worker vanished (its lease expired before `now`)
    is `cancelled`, never queued again; one with a paid call open went `in_doubt` first."""
    stmt = _move("stop", job_id, now, finished_at=now, lease_expires_at=None).where(
        jobs.c.lease_expires_at < now, jobs.c.cancel_requested_at.is_not(None)
    )
    if not await _settle(conn, stmt, job_id, _state("stop", reason=STOPPED_LOST), now):
        return False
    await _close_open_attempts(conn, job_id, now, "cancelled", "Cancelled", STOPPED_LOST)
    return True


async def deny(
    conn: AsyncConnection, job_id: str, *, reason: str, now: datetime, attempt: int | None = None
) -> bool:
    """Spend policy refused the job before any paid call: `denied`, with the reason."""
    stmt = _move("deny", job_id, now, finished_at=now, lease_expires_at=None, last_error=reason)
    if attempt is not None:
        stmt = stmt.where(jobs.c.attempts == attempt)
    if not await _settle(conn, stmt, job_id, _state("deny", reason=reason, attempt=attempt), now):
        return False
    await _close_open_attempts(conn, job_id, now, "denied", "SpendDenied", reason)
    return True


async def mark_in_doubt(
    conn: AsyncConnection,
    job_id: str,
    *,
    reason: str,
    now: datetime,
    attempt: int | None = None,
    lost_inside_paid_call: bool = False,
) -> bool:
    """A paid call may have been charged but has no recorded outcome: park the job.

    With `lost_inside_paid_call` (recovery), only an `active` job whose lease expired before
    `now` and that has an open paid call matches.
    """
    stmt = _move(
        "mark_in_doubt", job_id, now, finished_at=now, lease_expires_at=None, last_error=reason
    )
    if attempt is not None:
        stmt = stmt.where(jobs.c.attempts == attempt)
    if lost_inside_paid_call:
        open_call = exists().where(
            paid_calls_table.c.job_id == jobs.c.id, paid_calls_table.c.state == "open"
        )
        stmt = stmt.where(jobs.c.lease_expires_at < now, open_call)
    event = _state("mark_in_doubt", reason=reason, attempt=attempt)
    if not await _moved(conn, stmt, job_id, event, now):
        return False
    await _close_open_attempts(conn, job_id, now, "in_doubt", "PaidCallInDoubt", reason)
    return True


async def replay(conn: AsyncConnection, job_id: str, *, budget: int, now: datetime) -> bool:
    """An approved replay: back to `queued` with `budget` fresh attempts and no deadline (a
    person decided to run it again, whenever that is)."""
    stmt = _move(
        "replay",
        job_id,
        now,
        max_attempts=jobs.c.attempts + budget,
        finished_at=None,
        run_after=None,
        lease_expires_at=None,
        deadline_at=None,
        cancel_requested_at=None,
        cancel_children=None,
    )
    return await _moved(conn, stmt, job_id, _state("replay", attempts=budget), now)


async def resolve(
    conn: AsyncConnection, job_id: str, *, result: dict[str, Any], now: datetime
) -> bool:
    """An operator checked the provider and records an `in_doubt` job as completed."""
    stmt = _move("resolve", job_id, now, result=result, finished_at=now)
    return await _settle(conn, stmt, job_id, _state("resolve"), now)


async def reject(conn: AsyncConnection, job_id: str, *, reason: str, now: datetime) -> bool:
    """An operator checked the provider and records an `in_doubt` job as failed."""
    stmt = _move("reject", job_id, now, finished_at=now, last_error=reason)
    return await _settle(conn, stmt, job_id, _state("reject", reason=reason), now)


async def wait(
    conn: AsyncConnection, job_id: str, *, attempt: int, reason: str, now: datetime
) -> bool:
    """The running attempt reached an undecided approval or unsettled children: `waiting`,
    with no lease. The attempt is recorded (outcome `waiting`) but not counted: the job gets
    one attempt more, so waiting never brings it nearer `max_attempts`."""
    return await _finish(
        conn,
        "wait",
        job_id,
        attempt,
        now,
        "waiting",
        waiting_for=reason,
        max_attempts=jobs.c.max_attempts + 1,
    )


async def resume(conn: AsyncConnection, job_id: str, *, now: datetime) -> bool:
    """The approval was decided or the children settled: back to `queued`, to run from the
    top (its steps come back from the record)."""
    stmt = _move("resume", job_id, now, waiting_for=None, run_after=None)
    return await _moved(conn, stmt, job_id, _state("resume"), now)


async def decline(conn: AsyncConnection, job_id: str, *, reason: str, now: datetime) -> bool:
    """A person rejected the waiting job's approval: `failed`, with the reason."""
    stmt = _move("decline", job_id, now, waiting_for=None, finished_at=now, last_error=reason)
    return await _settle(conn, stmt, job_id, _state("decline", reason=reason), now)


async def expire(conn: AsyncConnection, job_id: str, *, reason: str, now: datetime) -> bool:
    """The run deadline of a queued or waiting job passed: `failed`, with the reason (only
    a job whose deadline is before `now`: one replayed since it was read has none)."""
    stmt = _move(
        "expire", job_id, now, waiting_for=None, finished_at=now, run_after=None, last_error=reason
    ).where(jobs.c.deadline_at < now)
    return await _settle(conn, stmt, job_id, _state("expire", reason=reason), now)


async def enqueue_child(
    conn: AsyncConnection,
    *,
    parent_id: str,
    key: str,
    agent: str,
    lane: str,
    payload: dict[str, Any],
    max_attempts: int,
    now: datetime,
    budget_micros: int | None = None,
    deadline_at: datetime | None = None,
) -> tuple[str, bool]:
    """Insert a `queued` child of `parent_id` under `key`, at most once per (parent, key);
    return (id, created). The child draws on its parent's budget, inside `budget_micros`
    of its own when given (budgets.py), and finishes by its parent's deadline, or by its
    own `deadline_at` when that is sooner (deadlines.py)."""
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    child_id = new_job_id()
    # What the child inherits, in one read of the parent: the budget covering it, its deadline.
    parent = (
        await conn.execute(
            select(jobs.c.budget_id, jobs.c.deadline_at).where(jobs.c.id == parent_id)
        )
    ).first()
    above = None if parent is None or parent.budget_id is None else str(parent.budget_id)
    inherited = None if parent is None else parent.deadline_at
    deadline_at = min((d for d in (inherited, deadline_at) if d is not None), default=None)
    stmt = (
        dialect_insert(jobs)
        .values(
            id=child_id,
            agent=agent,
            lane=lane,
            state=JobState.QUEUED.value,
            payload=payload,
            owner="",
            attempts=0,
            max_attempts=max_attempts,
            parent_id=parent_id,
            child_key=key,
            budget_id=above if budget_micros is None else child_id,
            deadline_at=deadline_at,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing()
        .returning(jobs.c.id)
    )
    created = await conn.scalar(stmt)
    if created is not None:
        await budgets.open_budget(conn, child_id, budget_micros, covering=above, now=now)
        spawned = {"child_id": child_id, "key": key, "agent": agent}
        await events.append(conn, parent_id, [events.New("child_spawned", spawned)], now=now)
        return str(created), True
    found = await conn.scalar(
        select(jobs.c.id).where(jobs.c.parent_id == parent_id, jobs.c.child_key == key)
    )
    if found is None:  # pragma: no cover - a uuid4 collision
        raise RuntimeError("child insert conflicted but no existing child was found")
    return str(found), False


async def resume_if_children_settled(
    conn: AsyncConnection, parent_id: str, *, now: datetime, settled: events.New | None = None
) -> bool:
    """Queue a parent that waits for its children once none is left unsettled (`settled`:
    the `child_settled` event of the child whose settling calls this, for the parent).

    Takes the parent's row lock first (PostgreSQL), so that of two children settling at
    once, or a child settling while its parent parks, the second to commit sees the first.
    """
    parent = (
        await conn.execute(
            select(jobs.c.state, jobs.c.waiting_for).where(jobs.c.id == parent_id).with_for_update()
        )
    ).first()
    if parent is not None and settled is not None:
        await events.append(conn, parent_id, [settled], now=now)
    if parent is None or parent.state != JobState.WAITING.value or parent.waiting_for != CHILDREN:
        return False
    if await unsettled_children(conn, parent_id):
        return False
    return await resume(conn, parent_id, now=now)


async def prune(
    engine: Any,
    *,
    finished_before: datetime,
    states: frozenset[JobState],
    batch: int = 1000,
    most_batches: int | None = None,
) -> int:
    """Delete jobs in `states` that finished before `finished_before`, `batch` jobs per
    short transaction, with everything that is theirs (attempts, paid calls, replies, steps,
    approvals, budgets, events, webhook deliveries); returns how many. `most_batches` bounds
    one call (the recovery loop's share). The audit log is kept: it is the record of who did what.

    A tree goes leaves first: a job is deleted only once its children are gone, and a child
    only with its parent due too, so no kept job ever misses a child (a replayed parent
    would spawn it again) and none points at a parent that is gone.
    """
    wanted = [state.value for state in states]
    child, parent = jobs.alias("child"), jobs.alias("parent")
    due = and_(jobs.c.state.in_(wanted), jobs.c.finished_at < finished_before)
    parent_due = exists().where(
        parent.c.id == jobs.c.parent_id,
        parent.c.state.in_(wanted),
        parent.c.finished_at < finished_before,
    )
    leaves = (
        select(jobs.c.id)
        .where(
            due,
            ~exists().where(child.c.parent_id == jobs.c.id),
            or_(jobs.c.parent_id.is_(None), parent_due),
        )
        .limit(batch)
    )
    deleted = batches = 0
    while most_batches is None or batches < most_batches:
        batches += 1
        async with engine.begin() as conn:
            ids = (await conn.scalars(leaves)).all()
            if not ids:
                return deleted
            for table in (
                job_events,
                paid_calls_table,
                replies_table,
                webhook_deliveries,
                steps_table,
                approvals_table,
                attempts,
                budgets_table,
            ):
                await conn.execute(table.delete().where(table.c.job_id.in_(ids)))
            deleted += (await conn.execute(jobs.delete().where(jobs.c.id.in_(ids)))).rowcount
    return deleted


# Internals --------------------------------------------------------------------------------


def _move(verb: str, job_id: str, now: datetime, **values: Any) -> Any:
    """The guarded UPDATE for `verb`: only from its source states, to its target state. Every
    verb but a heartbeat takes the seq of the event that records it (events.py)."""
    if verb != "heartbeat":
        values["event_seq"] = jobs.c.event_seq + 1
    return (
        update(jobs)
        .where(jobs.c.id == job_id, in_states(*(s.value for s in sources(verb))))
        .values(state=target(verb).value, updated_at=now, **values)
    )


def _state(verb: str, **data: Any) -> events.New:
    """The `state` event of an operator's or recovery's move (no attempt of its own)."""
    known = {key: value for key, value in data.items() if value is not None}
    return events.New("state", {"verb": verb, "state": target(verb).value, **known})


async def _moved(
    conn: AsyncConnection, stmt: Any, job_id: str, event: events.New, now: datetime
) -> bool:
    """Run a move and record its event; False when the guard matched no row."""
    seq = await conn.scalar(stmt.returning(jobs.c.event_seq))
    if seq is None:
        return False
    await events.record(conn, job_id, seq, event, now=now)
    return True


async def _settle(
    conn: AsyncConnection, stmt: Any, job_id: str, event: events.New, now: datetime
) -> bool:
    """Run a move into a settled state and record its event; when the job is a child,
    tell its parent and queue it if this was the last child it waited for; when webhooks are
    configured, record the notifications of its end (webhooks.py). All in the same
    transaction."""
    returned: tuple[Any, ...] = (jobs.c.event_seq, jobs.c.parent_id, jobs.c.child_key, jobs.c.state)
    hooks = webhooks.of(conn)
    if hooks is not None:
        returned += webhooks.JOB_COLUMNS
    row = (await conn.execute(stmt.returning(*returned))).first()
    if row is None:
        return False
    await events.record(conn, job_id, row.event_seq, event, now=now)
    if hooks is not None:
        await webhooks.record(conn, hooks, job_id, row.event_seq, row, now)
    if row.parent_id is not None:
        child = {"child_id": job_id, "key": row.child_key, "state": row.state}
        await resume_if_children_settled(
            conn, row.parent_id, now=now, settled=events.New("child_settled", child)
        )
    return True


async def _finish(
    conn: AsyncConnection,
    verb: str,
    job_id: str,
    attempt: int,
    now: datetime,
    outcome: str,
    error: ErrorInfo | None = None,
    guard: Any = None,
    **values: Any,
) -> bool:
    """Record the outcome of running attempt `attempt`: move the job with `verb` (only if
    that attempt still holds it, and, to `queued` or `waiting`, only if nobody asked to stop
    it) and close the attempt's row."""
    if error is not None:
        values["last_error"] = _summary(error)
    stmt = _move(verb, job_id, now, lease_expires_at=None, **values).where(
        jobs.c.attempts == attempt
    )
    if target(verb) in RUNNABLE | WAITING:  # a job asked to stop is stopped, not run again
        stmt = stmt.where(jobs.c.cancel_requested_at.is_(None))
    if guard is not None:
        stmt = stmt.where(guard)
    ended: dict[str, Any] = {"outcome": outcome, "state": target(verb).value}
    if error is not None:
        ended["error"] = _summary(error)
    if isinstance(values.get("run_after"), datetime):
        ended["run_after"] = values["run_after"].isoformat()
    if isinstance(values.get("waiting_for"), str):
        ended["waiting_for"] = values["waiting_for"]
    event = events.New("attempt_ended", ended, attempt)
    settles = target(verb) in SETTLED
    if not await (_settle if settles else _moved)(conn, stmt, job_id, event, now):
        return False
    await conn.execute(
        update(attempts)
        .where(attempts.c.job_id == job_id, attempts.c.number == attempt)
        .values(
            finished_at=now,
            outcome=outcome,
            error_class=error.error_class if error else None,
            error_message=error.message if error else None,
            traceback=error.traceback if error else None,
        )
    )
    return True


async def _close_open_attempts(
    conn: AsyncConnection, job_id: str, now: datetime, outcome: str, error_class: str, message: str
) -> None:
    await conn.execute(
        update(attempts)
        .where(attempts.c.job_id == job_id, attempts.c.finished_at.is_(None))
        .values(finished_at=now, outcome=outcome, error_class=error_class, error_message=message)
    )


def _summary(error: ErrorInfo) -> str:
    return f"{error.error_class}: {error.message}"


# The reads this module carried before they moved to queries.py: importable from here for
# one release, with a warning, so code written against the old layout (a service's own
# tests, an older release's generated ones) keeps running. (`Job`, `Attempt`, `CHILDREN` and
# `unsettled_children` stay plain names here: the verbs use them.)
_MOVED = frozenset(
    {
        "FINISHED_BADLY",
        "PRIORITIES",
        "PRIORITY_NAMES",
        "children_of",
        "count_by_state",
        "count_expired_leases",
        "expired_leases",
        "finished_per_bucket",
        "job_attempts",
        "list_jobs",
        "oldest_queued",
        "oldest_queued_query",
        "queued_page",
        "scheduled_counts",
        "scheduled_query",
        "waiting_for_children_page",
    }
)


# Hidden from mypy, which then still refuses a misspelt verb or a moved read used from here.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name not in _MOVED:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"{__name__}.{name} moved to {queries.__name__}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(queries, name)
