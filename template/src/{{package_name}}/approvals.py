"""Approvals: a person decides before a job goes on (template-owned: copier-agent-worker).

`decision = await ctx.approval(name, summary=..., timeout_s=...)` records a pending approval
and parks the job `waiting` (it holds no lease and no arq entry, so neither a worker restart
nor a Redis flush can lose it). `decide` is the one implementation of approving and
rejecting, for the CLI (`approvals approve|reject`) and any future API or console:

- approve: the approval is recorded and the job goes back to `queued` in one transaction,
  then is pushed; it re-runs from the top, its steps come back from the record, and
  `ctx.approval` returns the decision (`.approved`, `.by`, `.reason`, `.at`);
- reject: the job ends `failed` with the reason, in the same transaction;
- a timeout (`timeout_s`) expires it: recovery records the decision "expired" (not
  approved) and queues the job, so the agent chooses what an unanswered request means.

Every decision by a person is written to the audit log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import structlog
from sqlalchemy import and_, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import audit, budgets, events, job_store, spend
from .budget_asks import BUDGET
from .db import transaction
from .models import approvals, jobs
from .queue import JobQueue, Push, QueueUnavailable
from .states import JobState
from .steps import check_name
from .waiting import Wait, approval_reason

log = structlog.get_logger("approvals")
EXPIRED_BY = "timeout"

Outcome = Literal["approved", "rejected", "expired"]


class ApprovalError(ValueError):
    """A decision was refused before anything was written; the message says why."""


@dataclass(frozen=True)
class Decision:
    """What was decided about one approval."""

    approved: bool
    by: str
    reason: str | None
    at: datetime
    outcome: Outcome


@dataclass(frozen=True)
class Approval:
    """One approval of a job, pending or decided."""

    job_id: str
    agent: str
    job_state: str
    name: str
    summary: str
    state: str
    requested_at: datetime
    expires_at: datetime | None
    decided_at: datetime | None
    decided_by: str | None
    reason: str | None
    # A `budget` ask's figures (budget_asks.py): what stopped the call ("kind", "target",
    # "day"), what it needs and what was left ("asked_usd", "left_usd"); None otherwise.
    details: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(self).items()}


async def request(
    engine: AsyncEngine, job_id: str, name: str, *, summary: str, timeout_s: float | None
) -> Decision:
    """The decision on approval `name` of `job_id`; the first time, record it as pending
    and raise `Wait` (the runner parks the job)."""
    check_name(name, "approval")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError("timeout_s must be a positive number of seconds, or None")
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        row = (
            await conn.execute(
                select(approvals).where(approvals.c.job_id == job_id, approvals.c.name == name)
            )
        ).first()
        if row is None:
            expires = None if timeout_s is None else now + timedelta(seconds=timeout_s)
            await conn.execute(
                insert(approvals).values(
                    job_id=job_id,
                    name=name,
                    summary=str(summary),
                    state="pending",
                    requested_at=now,
                    expires_at=expires,
                )
            )
            asked = {"name": name, "summary": str(summary)}
            await events.append(conn, job_id, [events.New("approval_requested", asked)], now=now)
    if row is not None and row.state != "pending":
        return Decision(
            approved=row.state == "approved",
            by=row.decided_by or "",
            reason=row.reason,
            at=row.decided_at,
            outcome=row.state,
        )
    raise Wait(approval_reason(name))


async def decide(
    engine: AsyncEngine,
    job_id: str,
    *,
    approved: bool,
    by: str,
    reason: str | None = None,
    queue: JobQueue | None = None,
    raise_micros: int | None = None,
) -> JobState:
    """Approve or reject the approval a `waiting` job waits for; returns the job's new
    state (`queued`, then pushed to `queue` when given, or `failed`). `raise_micros`, with
    an approval of a job waiting on its `budget`, adds that much to what stopped it, in the
    same transaction (budget_asks.py)."""
    if not by or not by.strip():
        raise ApprovalError("a decision needs --approved-by NAME (who decided, for the audit log)")
    if not approved and not (reason and reason.strip()):
        raise ApprovalError("a rejection needs --reason TEXT (the job fails with it)")
    if raise_micros is not None and not approved:
        raise ApprovalError("a raise goes with an approval, not a rejection; nothing changed")
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        push, state = await _decide(
            conn, job_id, "approved" if approved else "rejected", by=by, reason=reason, now=now
        )
        if raise_micros is not None:
            await _raise(conn, job_id, raise_micros, by=by, reason=reason, now=now)
    if state is JobState.QUEUED and queue is not None:
        await push_resumed(queue, [push])
    return state


async def expire_due(engine: AsyncEngine, *, now: datetime) -> list[Push]:
    """Decide every pending approval whose timeout has passed as "expired" and queue its
    job; returns the jobs to push."""
    due = (
        select(approvals.c.job_id)
        .join(jobs, jobs.c.id == approvals.c.job_id)
        .where(
            approvals.c.state == "pending",
            approvals.c.expires_at < now,
            jobs.c.state == JobState.WAITING.value,
        )
        .order_by(approvals.c.job_id)
        .limit(1000)
    )
    async with engine.connect() as conn:
        job_ids = list((await conn.scalars(due)).all())
    pushes: list[Push] = []
    for job_id in job_ids:
        try:
            async with transaction(engine) as conn:
                push, _ = await _decide(
                    conn, job_id, "expired", by=EXPIRED_BY, reason=None, now=now
                )
        except ApprovalError:
            continue  # decided by a person meanwhile
        pushes.append(push)
    return pushes


async def close_pending(
    conn: AsyncConnection, job_id: str, *, by: str, reason: str, now: datetime
) -> None:
    """Decide a job's pending approvals "expired" by `by`, with `reason`, in `conn`'s
    transaction: the job ended without them (its deadline passed, or it was cancelled), so
    nobody is left to decide them."""
    await conn.execute(
        update(approvals)
        .where(approvals.c.job_id == job_id, approvals.c.state == "pending")
        .values(state="expired", decided_at=now, decided_by=by, reason=reason)
    )


async def pending(conn: AsyncConnection, *, limit: int = 1000) -> list[Approval]:
    """Approvals nobody has decided yet, oldest first."""
    return await _list(conn, approvals.c.state == "pending", limit=limit)


async def of_job(conn: AsyncConnection, job_id: str) -> list[Approval]:
    """Every approval of one job, in the order they were requested."""
    return await _list(conn, approvals.c.job_id == job_id, limit=1000)


async def push_resumed(queue: JobQueue, pushes: list[Push]) -> None:
    """Push jobs a decision queued; if Redis refuses, recovery pushes them later."""
    try:
        await queue.push_many(pushes)
    except QueueUnavailable as exc:
        log.warning("resumed_not_pushed", jobs=len(pushes), error=str(exc))


async def _decide(
    conn: AsyncConnection,
    job_id: str,
    outcome: Outcome,
    *,
    by: str,
    reason: str | None,
    now: datetime,
) -> tuple[Push, JobState]:
    """Record the decision; returns the job's push (with its agent and priority, for when it
    is queued) and its new state."""
    # The job's row lock first: a decision and anything else moving the job are serialised.
    job = (
        await conn.execute(
            select(jobs.c.state, jobs.c.waiting_for, jobs.c.lane, jobs.c.agent, jobs.c.priority)
            .where(jobs.c.id == job_id)
            .with_for_update()
        )
    ).first()
    if job is None:
        raise ApprovalError(f"no job with id {job_id}")
    prefix = approval_reason("")
    if job.state != JobState.WAITING.value or not (job.waiting_for or "").startswith(prefix):
        raise ApprovalError(
            f"job {job_id} is {job.state}, not waiting for an approval; nothing changed"
        )
    name = job.waiting_for[len(prefix) :]
    recorded = await conn.execute(
        update(approvals)
        .where(
            and_(
                approvals.c.job_id == job_id,
                approvals.c.name == name,
                approvals.c.state == "pending",
            )
        )
        .values(state=outcome, decided_at=now, decided_by=by, reason=reason)
    )
    if recorded.rowcount != 1:
        raise ApprovalError(f"job {job_id} has no pending approval {name!r}; nothing changed")
    decided = {"name": name, "outcome": outcome, "by": by, "reason": reason}
    await events.append(conn, job_id, [events.New("approval_decided", decided)], now=now)
    if outcome != "expired":
        await audit.record(
            conn,
            actor=by,
            action=f"approval_{outcome}",
            target=job_id,
            details={"approval": name, "reason": reason},
            now=now,
        )
    push = Push(job_id, job.lane, priority=job.priority, agent=job.agent)
    if outcome == "rejected":
        message = f"approval {name!r} rejected by {by}: {reason}"
        await job_store.decline(conn, job_id, reason=message, now=now)
        return push, JobState.FAILED
    await job_store.resume(conn, job_id, now=now)
    return push, JobState.QUEUED


async def _raise(
    conn: AsyncConnection, job_id: str, micros: int, *, by: str, reason: str | None, now: datetime
) -> None:
    """Add `micros` to what stopped the job's paid call: its budget, its tree's, or that
    day's cap (the `budget` approval's details); audited."""
    details = await conn.scalar(
        select(approvals.c.details).where(
            approvals.c.job_id == job_id,
            approvals.c.name == BUDGET,
            approvals.c.decided_at == now,  # the decision just written, not an older one
        )
    )
    if not details:
        raise ApprovalError(
            f"job {job_id} is not waiting on its budget, so there is nothing to raise; "
            "approve it without --raise-budget-usd"
        )
    kind, target = details["kind"], details["target"]
    if kind in ("job", "tree"):
        if not await budgets.raise_budget(conn, target, micros):
            raise ApprovalError(f"the budget of job {target} is gone (pruned); nothing changed")
    else:
        day = date.fromisoformat(details["day"])
        await spend.raise_day(conn, key=target, day=day, micros=micros)
    await audit.record(
        conn,
        actor=by,
        action="budget_raised",
        target=job_id,
        details={**details, "raised_by_usd": str(spend.to_usd(micros)), "reason": reason},
        now=now,
    )


async def _list(conn: AsyncConnection, where: Any, *, limit: int) -> list[Approval]:
    stmt = (
        select(
            approvals.c.job_id,
            jobs.c.agent,
            jobs.c.state.label("job_state"),
            approvals.c.name,
            approvals.c.summary,
            approvals.c.state,
            approvals.c.requested_at,
            approvals.c.expires_at,
            approvals.c.decided_at,
            approvals.c.decided_by,
            approvals.c.reason,
            approvals.c.details,
        )
        .join(jobs, jobs.c.id == approvals.c.job_id)
        .where(where)
        .order_by(approvals.c.requested_at, approvals.c.id)
        .limit(limit)
    )
    return [Approval(**row._mapping) for row in await conn.execute(stmt)]
