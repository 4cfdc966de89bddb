"""Bring lost jobs back: at worker start-up and on a timer (template-owned).

The database is the record, so recovery only ever re-pushes ids it finds there: `queued`
rows that Redis forgot are pushed again with the same id, and `active` rows whose lease
expired (and that no arq worker still holds) go back to `queued`. Pushing the same id twice
is harmless: arq refuses a duplicate id and the claim refuses a job that is not due.
Recovery re-enqueues rather than running jobs itself, so a job always runs in its lane's
worker with that lane's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from . import job_store
from .db import transaction
from .queue import JobQueue, Push

log = structlog.get_logger("recovery")
PAGE = 1000


@dataclass
class ReconcileReport:
    """What one reconcile pass did."""

    rescued: int = 0
    pushed: int = 0
    scanned: int = 0


async def reconcile(engine: AsyncEngine, queue: JobQueue) -> ReconcileReport:
    """One pass over the job table; safe to run from many workers at once."""
    report = ReconcileReport()
    await _rescue_expired_leases(engine, queue, report)
    await _push_queued(engine, queue, report)
    if report.rescued or report.pushed:
        log.info("reconciled", rescued=report.rescued, pushed=report.pushed, scanned=report.scanned)
    return report


async def _rescue_expired_leases(
    engine: AsyncEngine, queue: JobQueue, report: ReconcileReport
) -> None:
    after = ""
    while True:
        now = datetime.now(UTC)
        async with engine.connect() as conn:
            ids = await job_store.expired_leases(conn, now=now, after_id=after, limit=PAGE)
        if not ids:
            return
        after = ids[-1]
        still_running = await queue.running(ids)
        for job_id in ids:
            if job_id in still_running:
                continue
            async with transaction(engine) as conn:
                report.rescued += await job_store.rescue(conn, job_id, now=now)


async def _push_queued(engine: AsyncEngine, queue: JobQueue, report: ReconcileReport) -> None:
    after = ""
    while True:
        async with engine.connect() as conn:
            page = await job_store.queued_page(conn, after_id=after, limit=PAGE)
        if not page:
            return
        after = page[-1][0]
        report.scanned += len(page)
        known = await queue.known([job_id for job_id, _, _ in page])
        missing = [
            Push(job_id, lane, run_after) for job_id, lane, run_after in page if job_id not in known
        ]
        report.pushed += await queue.push_many(missing)
