"""Child jobs: fan out with `ctx.spawn`, fan in with `ctx.wait_children` (template-owned).

A child is an ordinary job with `parent_id` and a `child_key` unique per parent, so
`spawn(agent, payload, key=...)` creates it at most once whatever happens to the parent: a
re-run (after a crash, a retry or a wait) gets the same child back. `wait_children()` parks
the parent `waiting` until every child has settled (completed, failed, dead-lettered,
denied or cancelled), then returns each child's state, result and error by key; a child's
failure is data for the parent, never an exception raised into it.

The last child to settle queues its parent in the transaction that settles it (see
`job_store._settle`); recovery's `resume_settled` catches a parent left waiting by a crash
between the two, and `park` one whose children all settled while it was still running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from . import deadlines, job_store, queries
from .db import transaction
from .errors import InvalidPayload
from .queue import JobQueue, Push, QueueUnavailable
from .routes import Routes
from .states import RUNNABLE, JobState
from .steps import check_name
from .waiting import Wait

log = structlog.get_logger("children")
PAGE = 1000


@dataclass(frozen=True)
class ChildOutcome:
    """How one settled child ended."""

    job_id: str
    agent: str
    state: str
    result: dict[str, Any] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.state == JobState.COMPLETED.value


async def spawn(
    engine: AsyncEngine,
    queue: JobQueue | None,
    *,
    parent_id: str,
    routes: Routes,
    agent: str,
    payload: dict[str, Any],
    key: str,
    budget_micros: int | None = None,
) -> str:
    """The id of the child of `parent_id` under `key`, created (and queued) the first time.

    The child draws on its parent's budget; `budget_micros` (else its agent's
    `job_budget_usd`) is a budget of its own, carved inside the parent's (budgets.py).
    """
    check_name(key, "child key")
    route = routes.get(agent)
    if route is None:
        raise InvalidPayload(f"cannot spawn unknown agent {agent!r}")
    lane = route.lane
    if not isinstance(payload, dict):
        raise InvalidPayload("a child's payload must be a dict")
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        child_id, created = await job_store.enqueue_child(
            conn,
            parent_id=parent_id,
            key=key,
            agent=agent,
            lane=lane,
            payload=payload,
            max_attempts=route.max_attempts,
            now=now,
            budget_micros=route.budget_micros if budget_micros is None else budget_micros,
            deadline_at=deadlines.due(now, route.deadline_s),
        )
        state = None if created else (await queries.get_job(conn, child_id))
    # A child recorded by a run that died before pushing it is pushed now (arq refuses a
    # second copy of a job it holds); recovery would push it too.
    if queue is not None and (created or (state is not None and state.state in RUNNABLE)):
        try:
            await queue.push_many([Push(child_id, lane, agent=agent)])
        except QueueUnavailable as exc:
            log.warning("child_recorded_not_queued", job_id=child_id, error=str(exc))
    if created:
        log.info("child_spawned", job_id=child_id, parent_id=parent_id, key=key, agent=agent)
    return child_id


async def wait_children(engine: AsyncEngine, parent_id: str) -> dict[str, ChildOutcome]:
    """Every child's outcome by key once all have settled; until then raise `Wait`."""
    async with engine.connect() as conn:
        if await queries.unsettled_children(conn, parent_id):
            raise Wait(queries.CHILDREN)
        children = await queries.children_of(conn, parent_id)
    return {
        str(child.child_key): ChildOutcome(
            job_id=child.id,
            agent=child.agent,
            state=child.state.value,
            result=child.result,
            error=None if child.state is JobState.COMPLETED else child.last_error,
        )
        for child in children
    }


async def resume_settled(engine: AsyncEngine, *, dry_run: bool = False) -> list[Push]:
    """Recovery: queue every parent that still waits although all its children settled
    (its last child's worker died between settling and queueing it); the jobs to push."""
    pushes: list[Push] = []
    after = ""
    while True:
        async with engine.connect() as conn:
            page = await queries.waiting_for_children_page(conn, after_id=after, limit=PAGE)
            ready = [
                Push(job_id, lane, priority=priority, agent=agent)
                for job_id, lane, priority, agent in page
                if not await queries.unsettled_children(conn, job_id)
            ]
        if not page:
            return pushes
        after = page[-1][0]
        for push in ready:
            if dry_run:
                pushes.append(push)
                continue
            async with transaction(engine) as conn:
                now = datetime.now(UTC)
                if await job_store.resume_if_children_settled(conn, push.job_id, now=now):
                    pushes.append(push)
