"""Bring lost jobs back: at worker start-up, on a timer and from `recover` (template-owned).

The database is the record, so recovery only ever re-pushes ids it finds there, in two
passes over the table, each paged by id (keyset, never OFFSET):

1. `active` rows whose lease expired and whose arq in-progress key is gone lost their
   worker: `rescue` settles each (back to `queued`, the lost attempt counted);
2. `queued` rows that arq would never deliver (no job key, or no entry in their lane's
   queue; arq's "job expired" results count as lost) are pushed again with the same id,
   respecting `run_after`;
3. `waiting` rows are otherwise left alone (they hold no lease and no arq entry), except
   those whose approval timed out (decided "expired") and parents whose children have all
   settled (a crash between the last child settling and its parent being queued): both
   go back to `queued` and are pushed;
4. `queued` and `waiting` rows past their run deadline are failed (deadlines.py; each
   worker also does this every second);
5. with `keep_days`, completed and cancelled jobs that finished longer ago are deleted in
   short batches, leaves of a tree first (job_store.prune; at most PRUNE_BATCHES a pass).

Redis is asked and pushed to in batches (one script call per thousand rows or more), so a
large table costs few round trips. Any number of reconcilers may run at once (every worker
runs one): a rescue is a guarded UPDATE that only one of them wins, a push is atomic per
job in Redis and refused while arq holds the job, and a delivery the job no longer needs
is refused by the claim. Recovery re-enqueues rather than running jobs itself, so a job
always runs in its lane's worker with that lane's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import (
    approvals,
    cancels,
    children,
    deadlines,
    job_store,
    paid_calls,
    queries,
    registry,
    replies,
)
from .db import create_engine
from .queue import JobQueue, Push
from .settings import Settings
from .states import TERMINAL, JobState

log = structlog.get_logger("recovery")
# Rows read per page; each page costs one query and a few Redis round trips.
PAGE = 2000
LOST_IN_PAID_CALL = "the worker stopped inside a paid call; the provider may have charged"
# Retention: jobs deleted per transaction, and transactions per pass (a backlog of old jobs is
# worked off over several passes, never in one long lock).
PRUNE_BATCH = 500
PRUNE_BATCHES = 20

Progress = Callable[[int], None]
# Opened with the number of rows to examine; yields the Progress of the pass (the CLI's bar).
ProgressBar = Callable[[int], AbstractContextManager[Progress]]


@dataclass
class ReconcileReport:
    """What one reconcile pass found and did (in a dry run: what it would have done)."""

    dry_run: bool = False
    expired: int = 0  # active rows whose lease had expired
    still_held: int = 0  # ...of which an arq worker still holds the in-progress key
    requeued: int = 0  # rescued back to queued (the lost attempt counts)
    in_doubt: int = 0  # rescued to in_doubt: a paid call was open
    dead_lettered: int = 0  # lost on their last attempt: dead-lettered
    stopped: int = 0  # lost after an operator asked to stop them: cancelled (cancels.py)
    queued: int = 0  # queued rows checked against Redis
    pushed: int = 0  # queued rows arq had lost, pushed again
    replies_sent: int = 0  # replies of completed jobs that had not been sent
    resumed: int = 0  # waiting jobs queued: approval timed out, or every child settled
    past_deadline: int = 0  # queued or waiting jobs failed at their run deadline
    pruned: int = 0  # completed or cancelled jobs past the retention, deleted
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def reconcile(
    engine: AsyncEngine,
    queue: JobQueue,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    reply_steps: Mapping[str, replies.ReplyFn] | None = None,
    keep_days: int = 0,
) -> ReconcileReport:
    """One pass over the job table; safe to run from many workers at once.

    `progress` is called with the number of rows each page examined; `dry_run` reads
    everything and changes nothing; `reply_steps` (agent name -> its `reply`) also sends the
    replies of completed jobs that are still pending; `keep_days` (the setting
    `retention_days`; 0 keeps all) deletes completed and cancelled jobs finished before then.
    """
    started = time.monotonic()
    report = ReconcileReport(dry_run=dry_run)
    await _rescue_expired_leases(engine, queue, report, progress)
    await _push_lost_queued(engine, queue, report, progress)
    await _resume_waiting(engine, queue, report)
    if dry_run:
        report.past_deadline = await deadlines.count_due(engine, now=datetime.now(UTC))
    else:
        report.past_deadline = len(await deadlines.expire_due(engine, now=datetime.now(UTC)))
    if reply_steps and not dry_run:
        report.replies_sent = await replies.send_pending(engine, reply_steps)
    if keep_days and not dry_run:
        report.pruned = await job_store.prune(
            engine,
            finished_before=datetime.now(UTC) - timedelta(days=keep_days),
            states=TERMINAL,
            batch=PRUNE_BATCH,
            most_batches=PRUNE_BATCHES,
        )
    report.seconds = round(time.monotonic() - started, 3)
    if not dry_run and (
        report.requeued
        or report.in_doubt
        or report.dead_lettered
        or report.stopped
        or report.pushed
        or report.replies_sent
        or report.resumed
        or report.past_deadline
        or report.pruned
    ):
        log.info("reconciled", **report.as_dict())
    return report


async def rows_to_examine(engine: AsyncEngine) -> int:
    """How many rows a pass would examine now (a progress bar's total)."""
    async with engine.connect() as conn:
        queued = await queries.count_in_state(conn, JobState.QUEUED)
        expired = await queries.count_expired_leases(conn, now=datetime.now(UTC))
    return queued + expired


async def recover(
    settings: Settings, *, dry_run: bool, progress_bar: ProgressBar | None = None
) -> ReconcileReport:
    """One reconcile from the command line. `progress_bar`, when given, is opened with the
    number of rows the pass will examine and yields what to call with each page's count."""
    steps = registry.load(settings).reply_steps
    queue = await JobQueue.connect(settings, conn_retries=0)
    engine = create_engine(settings)
    keep = settings.retention_days
    try:
        if progress_bar is None:
            return await reconcile(
                engine, queue, dry_run=dry_run, reply_steps=steps, keep_days=keep
            )
        with progress_bar(await rows_to_examine(engine)) as progress:
            return await reconcile(
                engine, queue, dry_run=dry_run, progress=progress, reply_steps=steps, keep_days=keep
            )
    finally:
        await queue.close()
        await engine.dispose()


def summary(report: ReconcileReport) -> str:
    """What a pass did, in one line for people.

    >>> report = ReconcileReport(expired=3, still_held=1, requeued=2, queued=9, pushed=4)
    >>> print(summary(report))  # doctest: +NORMALIZE_WHITESPACE
    expired leases: 3, 1 still held by a worker, 2 back to queued, 0 in_doubt,
    0 dead_lettered; queued: 9, 4 missing from Redis pushed again (0.0 s)
    """
    if report.dry_run:
        back, doubt, push = "would go back to queued", "would go in_doubt", "would be pushed"
        dead, stop = "would be dead_lettered", "would be cancelled"
    else:
        back, doubt, push = "back to queued", "in_doubt", "pushed again"
        dead, stop = "dead_lettered", "cancelled"
    line = (
        f"expired leases: {report.expired}, {report.still_held} still held by a worker, "
        f"{report.requeued} {back}, {report.in_doubt} {doubt}, "
        f"{report.dead_lettered} {dead}; "
        f"queued: {report.queued}, {report.pushed} missing from Redis {push} "
        f"({report.seconds:.1f} s)"
    )
    if report.stopped:
        line += f"; {report.stopped} asked to stop {stop}"
    if report.past_deadline:
        failed = "would fail" if report.dry_run else "failed"
        line += f"; {report.past_deadline} past their run deadline {failed}"
    if report.pruned:
        line += f"; {report.pruned} finished jobs past the retention deleted"
    return line + ("; dry run: nothing was changed" if report.dry_run else "")


async def rescue(conn: AsyncConnection, job_id: str, *, now: datetime) -> JobState | None:
    """Settle one attempt whose worker vanished; returns the job's new state, or None when
    someone else moved the job first (another reconciler, or a worker's claim).

    The one place a lost job's fate is decided: back to `queued`, so it runs again. A job
    that was inside a paid call belongs in `in_doubt` instead (the provider may have
    charged), with its reservation counted as spent; one an operator asked to stop is
    `cancelled` (cancels.py); one that was on its last attempt is dead-lettered. Every
    move only matches a lease that expired before `now` (the job may have been claimed
    again since its page was read).
    """
    if await job_store.mark_in_doubt(
        conn, job_id, reason=LOST_IN_PAID_CALL, now=now, lost_inside_paid_call=True
    ):
        await paid_calls.park_open_calls(conn, job_id)
        return JobState.IN_DOUBT
    if await job_store.stop_abandoned(conn, job_id, now=now):
        await cancels.close_asked(conn, job_id, now=now)
        return JobState.CANCELLED
    if await job_store.exhaust(conn, job_id, now=now):
        return JobState.DEAD_LETTERED
    if await job_store.rescue(conn, job_id, now=now):
        return JobState.QUEUED
    return None


async def _rescue_expired_leases(
    engine: AsyncEngine, queue: JobQueue, report: ReconcileReport, progress: Progress | None
) -> None:
    after = ""
    while True:
        # A rescue only matches a lease that expired before `now`, so a job claimed again
        # after this page was read (its new lease ends after `now`) is never taken away.
        now = datetime.now(UTC)
        async with engine.connect() as conn:
            ids = await queries.expired_leases(conn, now=now, after_id=after, limit=PAGE)
        if not ids:
            return
        after = ids[-1]
        held = await queue.running(ids)
        lost = [job_id for job_id in ids if job_id not in held]
        report.expired += len(ids)
        report.still_held += len(held)
        if lost:
            await _rescue_page(engine, lost, now, report)
        if progress is not None:
            progress(len(ids))


async def _rescue_page(
    engine: AsyncEngine, job_ids: list[str], now: datetime, report: ReconcileReport
) -> None:
    """Rescue each job and count where it went; a dry run makes the same moves in a
    transaction it rolls back, so it reports each job's real fate (in doubt, cancelled,
    dead-lettered or queued) and changes nothing."""
    async with engine.connect() as conn, conn.begin() as moves:
        for job_id in job_ids:
            state = await rescue(conn, job_id, now=now)
            report.requeued += state is JobState.QUEUED
            report.in_doubt += state is JobState.IN_DOUBT
            report.dead_lettered += state is JobState.DEAD_LETTERED
            report.stopped += state is JobState.CANCELLED
        if report.dry_run:
            await moves.rollback()


async def _resume_waiting(engine: AsyncEngine, queue: JobQueue, report: ReconcileReport) -> None:
    now = datetime.now(UTC)
    if report.dry_run:
        report.resumed = len(await children.resume_settled(engine, dry_run=True))
        return
    pushes = await approvals.expire_due(engine, now=now)
    pushes += await children.resume_settled(engine)
    report.resumed = len(pushes)
    if pushes:
        await queue.push_many(pushes)


async def _push_lost_queued(
    engine: AsyncEngine, queue: JobQueue, report: ReconcileReport, progress: Progress | None
) -> None:
    after = ""
    while True:
        async with engine.connect() as conn:
            page = await queries.queued_page(conn, after_id=after, limit=PAGE)
        if not page:
            return
        after = page[-1][0]
        report.queued += len(page)
        pushes = [Push(job_id, lane, due, rank, agent) for job_id, lane, due, rank, agent in page]
        lost = await queue.missing(pushes)
        if report.dry_run:
            report.pushed += len(lost)
        elif lost:
            report.pushed += await queue.push_many(lost)
        if progress is not None:
            progress(len(page))
