"""Operator actions, one implementation for the CLI, the HTTP API and the web console:
cancel a job (running or not), replay parked jobs, resolve an in-doubt job, decide an
approval, say which caps may be set (template-owned: copier-agent-worker).

Each caller only reads its input and shows the outcome; the rules (an approver, a limit with
a cause, never a possibly-spent job without the explicit override) and the audit rows live
here and in `dlq.py`. The actor is whoever the caller authenticated: a name given on the
command line, or the name of the API token or console session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from . import approvals, cancels, catalog, dlq, queries, registry, reruns, spend
from .db import transaction
from .models import GLOBAL
from .queue import JobQueue, Push, QueueUnavailable
from .settings import Settings
from .states import JobState


@dataclass
class ReplayOutcome:
    """What a replay did: the plan, the ids put back, and a warning when Redis was down."""

    plan: dlq.ReplayPlan
    replayed: list[str] = field(default_factory=list)
    push_warning: str | None = None


def cap_target(agent: str) -> str:
    """The agent whose daily cap may be set: a paid agent, or GLOBAL ('*'). An unpaid
    agent makes no paid calls, so a cap on it would limit nothing: refused with why.

    >>> try:
    ...     cap_target("no_such_agent")
    ... except spend.CapChangeRefused as exc:
    ...     print(str(exc).split(";")[0])
    unknown agent 'no_such_agent'
    """
    paid = [name for name, config in catalog.AGENTS.items() if config.paid]
    choices = ", ".join([*paid, "'*' (the global cap)"])
    if agent == GLOBAL or agent in paid:
        return agent
    if agent in catalog.AGENTS:
        raise spend.CapChangeRefused(
            f"agent {agent} is not paid: it makes no paid calls, so a cap would limit nothing; "
            f"caps are for {choices}"
        )
    raise spend.CapChangeRefused(f"unknown agent {agent!r}; caps are for {choices}")


async def cancel(
    settings: Settings,
    engine: AsyncEngine,
    job_id: str,
    *,
    actor: str,
    with_children: bool = False,
) -> cancels.Reach:
    """Cancel a job wherever it is (and, `with_children`, its tree), one audit row each:
    queued, waiting and parked jobs at once, running ones by their workers within a second
    (cancels.py). Nothing reached: the job is finished or unknown. A parent that a
    cancelled child was the last to settle is queued: it is pushed too."""
    try:
        queue: JobQueue | None = await JobQueue.connect(settings, conn_retries=0)
    except QueueUnavailable:
        queue = None  # the workers find a running job's request in its row
    try:
        reach = await cancels.cancel(
            engine, job_id, by=actor, with_children=with_children, queue=queue
        )
        if queue is not None:  # else recovery pushes them once Redis is back
            parents = await queued_parents(engine, reach.cancelled)
            await push(settings, engine, parents, queue=queue)
    finally:
        if queue is not None:
            await queue.close()
    return reach


async def decide(
    settings: Settings,
    engine: AsyncEngine,
    job_id: str,
    *,
    approved: bool,
    by: str,
    reason: str | None,
    raise_micros: int | None = None,
) -> JobState:
    """Approve or reject what a waiting job asked for (approvals.decide, audited), then push
    a resumed job; when Redis does not answer the decision still counts and recovery pushes
    it. Raises approvals.ApprovalError for a job with nothing to decide (nothing changed).
    `raise_micros` adds to the budget or cap a job waiting on its `budget` stopped on."""
    try:
        queue: JobQueue | None = await JobQueue.connect(settings, conn_retries=0)
    except QueueUnavailable:
        queue = None
    try:
        return await approvals.decide(
            engine,
            job_id,
            approved=approved,
            by=by,
            reason=reason,
            queue=queue,
            raise_micros=raise_micros,
        )
    finally:
        if queue is not None:
            await queue.close()


async def replay(
    settings: Settings,
    engine: AsyncEngine,
    *,
    job_ids: Sequence[str] = (),
    cause: str | None = None,
    limit: int | None = None,
    approved_by: str,
    reason: str | None,
    allow_spent: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], AbstractContextManager[Callable[[int], None]]] | None = None,
) -> ReplayOutcome:
    """Plan a replay (by ids, or by cause with a limit), then put the chosen jobs back to
    `queued`, one audited transaction each, and push them; `progress(total)` may show a
    bar. Raises dlq.ReplayRefused for a
    request that breaks a rule (nothing changed)."""
    if not approved_by:
        raise dlq.ReplayRefused("a replay needs an approver (who approved running these again)")
    async with engine.connect() as conn:
        plan = await dlq.plan_replay(
            conn, job_ids=job_ids, cause=cause, limit=limit, allow_spent=allow_spent
        )
    outcome = ReplayOutcome(plan)
    if dry_run:
        return outcome
    bar = progress(len(plan.replay)) if progress else nullcontext(lambda _n: None)
    with bar as advance:
        for job in plan.replay:
            outcome.replayed += await dlq.replay(
                engine, [job], budget=budget(job.agent), approved_by=approved_by, reason=reason
            )
            advance(1)
    outcome.push_warning = await push(settings, engine, outcome.replayed)
    return outcome


async def resolve(
    settings: Settings,
    engine: AsyncEngine,
    job_id: str,
    *,
    outcome: str,
    approved_by: str,
    note: str,
) -> JobState:
    """Settle an `in_doubt` job as completed, failed or retry (audited); a retry is pushed,
    and so is the parent that a settled child's resolution queued."""
    async with engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    state = await dlq.resolve(
        engine,
        job_id,
        outcome=outcome,
        approved_by=approved_by,
        note=note,
        budget=budget(job.agent) if job is not None else 1,
    )
    await push(settings, engine, [job_id] if state is JobState.QUEUED else [])
    await push(settings, engine, await queued_parents(engine, [job_id]))
    return state


async def resolve_cause(
    settings: Settings,
    engine: AsyncEngine,
    cause: str,
    *,
    limit: int,
    outcome: str,
    approved_by: str,
    note: str,
) -> list[tuple[str, JobState]]:
    """Settle up to `limit` in_doubt jobs of one cause the same way, each audited; each job
    resolved with its new state (a job another operator settled meanwhile is skipped).
    Jobs queued again are pushed."""
    dlq.check_resolution(outcome, approved_by, note)  # before the loop, which skips refusals
    if limit < 1:
        raise dlq.ReplayRefused("--limit must be at least 1")
    async with engine.connect() as conn:
        found = await dlq.in_doubt_of_cause(conn, cause, limit)
    resolved: list[tuple[str, JobState]] = []
    for job in found:
        try:
            state = await dlq.resolve(
                engine,
                job.id,
                outcome=outcome,
                approved_by=approved_by,
                note=note,
                budget=budget(job.agent),
            )
        except dlq.ReplayRefused:
            continue  # settled by someone else since it was listed
        resolved.append((job.id, state))
    await push(settings, engine, [job_id for job_id, s in resolved if s is JobState.QUEUED])
    await push(settings, engine, await queued_parents(engine, [job_id for job_id, _ in resolved]))
    return resolved


@dataclass
class RerunOutcome:
    """What a rerun did: its plan, the new job's id (None on a dry run), and a warning when
    Redis was down."""

    plan: reruns.RerunPlan
    job_id: str | None = None
    push_warning: str | None = None


async def rerun(
    settings: Settings,
    engine: AsyncEngine,
    job_id: str,
    *,
    from_step: str,
    payload: Any,
    approved_by: str,
    reason: str,
    dry_run: bool = False,
) -> RerunOutcome:
    """Plan a rerun of `job_id` from `from_step` (reruns.py); unless `dry_run`, make the new
    job with the reused records, audited, and push it. Raises reruns.RerunRefused (nothing
    written) for a request that breaks a rule, a spending one without an approver included."""
    if payload is not None:
        reruns.check_payload(payload, settings.max_payload_bytes)
    async with engine.connect() as conn:
        plan = await reruns.plan(conn, job_id, from_step)
    outcome = RerunOutcome(plan)
    if dry_run:
        return outcome
    route = registry.load(settings).routes.get(plan.job.agent)
    if route is None:
        raise reruns.RerunRefused(
            f"agent {plan.job.agent!r} of job {job_id} is not one this service runs any more"
        )
    async with transaction(engine) as conn:
        outcome.job_id = await reruns.rerun(
            conn,
            plan,
            route=route,
            payload=payload,
            approved_by=approved_by,
            reason=reason,
            now=datetime.now(UTC),
        )
    outcome.push_warning = await push(settings, engine, [outcome.job_id])
    return outcome


def budget(agent: str) -> int:
    """A replay's fresh attempts: the agent's own limit, else the answered default."""
    return registry.attempts_of(catalog.AGENTS.get(agent))


async def queued_parents(engine: AsyncEngine, job_ids: Sequence[str]) -> list[str]:
    """The parents of `job_ids` that are `queued`: settling their last child queued them in
    its transaction (job_store), and arq does not know yet."""
    async with engine.connect() as conn:
        found = [await queries.get_job(conn, job_id) for job_id in job_ids]
        parents = {job.parent_id for job in found if job is not None and job.parent_id}
        return [
            parent.id
            for parent in [await queries.get_job(conn, p) for p in sorted(parents)]
            if parent is not None and parent.state is JobState.QUEUED
        ]


async def push(
    settings: Settings,
    engine: AsyncEngine,
    job_ids: Sequence[str],
    *,
    queue: JobQueue | None = None,
) -> str | None:
    """Queue re-queued jobs now (through `queue` when the caller has one open); when Redis
    is down they stay queued for recovery to push, and the returned warning says so."""
    if not job_ids:
        return None
    async with engine.connect() as conn:
        found = [await queries.get_job(conn, job_id) for job_id in job_ids]
    pushes = [
        Push(job.id, job.lane, priority=job.priority, agent=job.agent)
        for job in found
        if job is not None
    ]
    if queue is not None:
        await queue.push_many(pushes)
        return None
    try:
        queue = await JobQueue.connect(settings, conn_retries=0)
    except QueueUnavailable as exc:
        return f"{exc}; the jobs stay queued until recovery pushes them"
    try:
        await queue.push_many(pushes)
    finally:
        await queue.close()
    return None
