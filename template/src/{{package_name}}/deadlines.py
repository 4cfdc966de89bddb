"""Run deadlines: a bound on a job's whole life, from its submit to a terminal state
(template-owned: copier-agent-worker).

`timeout_s` bounds one attempt; a job that retries, is sent back by a rate limit and waits
for an approval or its children can otherwise live for days. A job submitted with a deadline
(`submit --deadline-s`, `deadline_s` in the API and `Submitter.submit`, else its agent's
`deadline_s`) records `deadline_at`; a child finishes by its parent's deadline too (or by its
own agent's, when that is sooner). Past it, the job is `failed` with `DeadlinePassed: ...`:

- a queued or waiting job by the sweep each worker runs every second (`expire_due`), which
  also marks its pending approvals expired: a waiting job is woken to fail, not left waiting;
- a delivery of a job past it, before its agent runs (runner.check_before_running);
- a running attempt, which is bounded by what is left of the deadline, when that runs out
  (a paid call in flight then follows the paid-call rules: not sent, released; sent,
  `in_doubt`); and a retry or deferral that would start after it, at once.

Each failure cancels the job's unsettled descendants that are not running (running ones
reach the same deadline themselves). A failed job is parked: `dlq replay` runs it again
with no deadline, since a person decided to.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import approvals, audit, cancels, job_store, queries
from .db import transaction
from .models import jobs
from .states import JobState

log = structlog.get_logger("deadlines")

# The longest deadline: a year, like the longest delay (submit.MAX_DELAY_S).
MAX_DEADLINE_S = 365 * 24 * 3600
ERROR_CLASS = "DeadlinePassed"
# Who the audit log and a pending approval name as having acted at a deadline.
BY = "deadline"
# How often each worker looks for queued or waiting jobs past their deadline.
SWEEP_EVERY_S = 1.0
# Jobs failed per sweep transaction batch; the rest wait for the next sweep.
SWEEP_LIMIT = 500


class DeadlineRefused(ValueError):
    """A deadline that is not whole seconds in range; the message says what to write."""


def parse_deadline(value: object, *, field: str = "deadline_s") -> int:
    """Whole seconds from 1 to MAX_DEADLINE_S: an int, a float with nothing after the point
    (JSON Schema's integer: `3600.0`), or digits for the command line.

    >>> parse_deadline("3600", field="--deadline-s"), parse_deadline(3600.0)
    (3600, 3600)
    >>> try:
    ...     parse_deadline(0)
    ... except DeadlineRefused as exc:
    ...     print(exc)
    deadline_s must be whole seconds from 1 to 31536000 (365 days), e.g. 3600 (got 0)
    """
    seconds: object = value
    if isinstance(value, str) and value.strip().isdigit():
        seconds = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        seconds = int(value)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        seconds = None
    if seconds is None or not 1 <= seconds <= MAX_DEADLINE_S:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise DeadlineRefused(
            f"{field} must be whole seconds from 1 to {MAX_DEADLINE_S} "
            f"({MAX_DEADLINE_S // 86400} days), e.g. 3600 (got {shown})"
        )
    return seconds


def due(now: datetime, deadline_s: int | None) -> datetime | None:
    """When a job submitted at `now` with `deadline_s` must have finished (None: never)."""
    return None if deadline_s is None else now + timedelta(seconds=deadline_s)


def left_s(deadline_at: datetime | None, now: datetime) -> float | None:
    """Seconds left before `deadline_at` (0 once it has passed); None without a deadline."""
    if deadline_at is None:
        return None
    return max((deadline_at - now).total_seconds(), 0.0)


def when(deadline_at: datetime, created_at: datetime) -> str:
    """The deadline and how long the job had, for its failure's message.

    >>> from datetime import UTC
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> when(at + timedelta(seconds=90), at)
    '2026-01-01T00:01:30+00:00, 90 s after its submit'
    """
    seconds = round((deadline_at - created_at).total_seconds())
    return f"{deadline_at.isoformat()}, {seconds} s after its submit"


def reason(deadline_at: datetime, created_at: datetime) -> str:
    """Why a job failed at its deadline."""
    return f"its run deadline passed at {when(deadline_at, created_at)}"


def error(job: queries.Job, *, after: job_store.ErrorInfo | None = None) -> job_store.ErrorInfo:
    """The error a job past its deadline fails with (`after`: what its last attempt failed
    with, when it would have run again after the deadline)."""
    assert job.deadline_at is not None
    if after is None:
        return job_store.ErrorInfo(ERROR_CLASS, reason(job.deadline_at, job.created_at))
    message = (
        f"its next try would start after its run deadline, {when(job.deadline_at, job.created_at)}"
        f"; that attempt: {after.error_class}: {after.message}"
    )
    return job_store.ErrorInfo(ERROR_CLASS, message, after.traceback)


def _due(now: datetime) -> Any:
    """Queued or waiting jobs whose deadline passed before `now` (the partial index's rows)."""
    return and_(
        jobs.c.deadline_at.is_not(None),
        jobs.c.state.in_([JobState.QUEUED.value, JobState.WAITING.value]),
        jobs.c.deadline_at < now,
    )


async def count_due(engine: AsyncEngine, *, now: datetime) -> int:
    """How many jobs `expire_due` would fail now (recover's dry run)."""
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).where(_due(now))) or 0)


async def expire_due(engine: AsyncEngine, *, now: datetime) -> list[str]:
    """Fail every queued or waiting job whose deadline passed before `now` (at most
    SWEEP_LIMIT per call), each in its own transaction with its tree; returns their ids."""
    found = (
        select(jobs.c.id, jobs.c.parent_id, jobs.c.deadline_at, jobs.c.created_at)
        .where(_due(now))
        .order_by(jobs.c.deadline_at)
        .limit(SWEEP_LIMIT)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(found)).all()
    expired: list[str] = []
    for row in ancestors_first(rows):
        async with transaction(engine) as conn:
            why = f"{ERROR_CLASS}: {reason(row.deadline_at, row.created_at)}"
            if not await job_store.expire(conn, row.id, reason=why, now=now):
                continue  # it ran, was decided or was replayed since it was read
            await approvals.close_pending(conn, row.id, by=BY, reason=why, now=now)
            await audit.record(
                conn, actor=BY, action="expire", target=row.id, details={"reason": why}, now=now
            )
            await cancel_descendants(conn, row.id, now=now)
        expired.append(row.id)
    if expired:
        log.warning("jobs_past_deadline", jobs=len(expired), first=expired[0])
    return expired


def ancestors_first(rows: Sequence[Any]) -> list[Any]:
    """Due jobs with each one after its due ancestors: a parent that fails cancels its
    children (which inherited its deadline) rather than each failing on its own and the
    last one queuing the parent again.

    >>> from collections import namedtuple
    >>> R = namedtuple("R", "id parent_id")
    >>> [r.id for r in ancestors_first([R("c", "b"), R("b", "a"), R("a", None), R("x", "y")])]
    ['a', 'x', 'b', 'c']
    """
    by_id = {row.id: row for row in rows}

    def depth(row: Any) -> int:
        found, parent = 0, row.parent_id
        while parent in by_id and found < len(by_id):
            found, parent = found + 1, by_id[parent].parent_id
        return found

    return sorted(rows, key=depth)


async def cancel_descendants(conn: AsyncConnection, job_id: str, *, now: datetime) -> list[str]:
    """Cancel the queued and waiting descendants of a job that failed at its deadline, one
    audit row each, in `conn`'s transaction; running ones are bounded by the same deadline
    and end by themselves, `in_doubt` ones still need a person. Returns their ids."""
    reach = cancels.Reach()
    await cancels.descendants(conn, job_id, reach, by=BY, now=now, running=False)
    return reach.cancelled


async def end_tree(engine: AsyncEngine, job_id: str, *, now: datetime) -> list[str]:
    """`cancel_descendants` in a transaction of its own: after a runner failed a job at its
    deadline."""
    async with transaction(engine) as conn:
        return await cancel_descendants(conn, job_id, now=now)
