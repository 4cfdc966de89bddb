"""Rerun a job from one of its steps, priced first (template-owned: copier-agent-worker).

`jobs rerun JOB --from-step NAME [--input JSON] [--dry-run] --approved-by NAME --reason TEXT`
makes a new job of the same agent that starts with JOB's record up to step NAME. The steps
JOB recorded before NAME, the paid calls it closed before them and the approvals decided
before them are copied to the new job, so its run returns them from the record: their side
effects are not repeated and nothing is paid again for them (a copied call costs the new job
$0). NAME and everything after it runs again, on `--input` as the new job's payload (or
JOB's own). Children are never copied: a child JOB spawned is spawned again. JOB itself is
left as it is; the new job's `rerun_of` names it.

Priced first: `plan` lists the paid calls the rerun will make again (by JOB's record: the
ones not copied) with the reservation each made and what it cost. A rerun whose plan reserves
more than $0 needs an approver and a reason; it then draws on the caps and budgets like any
job (its calls reserve again, so a cap or a budget still stops them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import audit, job_store, queries, spend
from .models import approvals, jobs, paid_calls, steps
from .routes import Route
from .states import SETTLED, JobState
from .steps import steps_of

CENT = Decimal("0.01")
# A job may be rerun once it has stopped: settled, or parked in doubt.
RERUNNABLE = SETTLED | {JobState.IN_DOUBT}


class RerunRefused(ValueError):
    """A rerun that breaks a rule; the message says what to do. Nothing was written."""


class NoSuchJob(RerunRefused):
    """A rerun of a job that does not exist (the API's 404; every other refusal is a 409)."""


@dataclass(frozen=True)
class Call:
    """A paid call of the original job that the rerun will make again."""

    name: str
    state: str  # closed / in_doubt / open, in the original
    reserved_usd: Decimal  # what it reserved (its max cost)
    cost_usd: Decimal | None  # what it cost the original (None: unknown)


@dataclass(frozen=True)
class RerunPlan:
    """What a rerun of `job` from `from_step` reuses and what it does again."""

    job: queries.Job
    from_step: str
    reused_steps: list[str]
    steps_again: list[str]
    reused_calls: list[str]
    calls_again: list[Call]
    reused_approvals: list[str]
    children_again: int
    boundary: datetime | None = field(repr=False)  # when the last reused step was recorded

    @property
    def reserved_usd(self) -> Decimal:
        """What the calls made again reserve in all."""
        return dollars(sum((call.reserved_usd for call in self.calls_again), start=Decimal(0)))

    @property
    def needs_approval(self) -> bool:
        return self.reserved_usd > 0

    def as_dict(self) -> dict[str, Any]:
        """The `--dry-run --json` document (money as decimal strings)."""
        return {
            "job_id": self.job.id,
            "agent": self.job.agent,
            "from_step": self.from_step,
            "reused_steps": self.reused_steps,
            "steps_again": self.steps_again,
            "reused_paid_calls": self.reused_calls,
            "paid_calls_again": [
                {
                    "name": call.name,
                    "state": call.state,
                    "reserved_usd": str(call.reserved_usd),
                    "cost_usd": None if call.cost_usd is None else str(call.cost_usd),
                }
                for call in self.calls_again
            ],
            "reserved_usd": str(self.reserved_usd),
            "reused_approvals": self.reused_approvals,
            "children_again": self.children_again,
            "needs_approval": self.needs_approval,
        }


def check_payload(payload: Any, limit: int) -> None:
    """Refuse a new payload that is not a JSON object of at most `limit` bytes."""
    if not isinstance(payload, dict):
        raise RerunRefused(f"--input must be a JSON object, not {type(payload).__name__}")
    size = len(json.dumps(payload).encode())
    if size > limit:
        raise RerunRefused(f"--input is {size} bytes, over the {limit}-byte payload limit")


async def plan(conn: AsyncConnection, job_id: str, from_step: str) -> RerunPlan:
    """What a rerun of `job_id` from `from_step` would reuse and do again; RerunRefused for
    an unknown job, one still running or waiting, or a step it never recorded."""
    found = await plans(conn, job_id)
    for one in found:
        if one.from_step == from_step:
            return one
    names = ", ".join(one.from_step for one in found)
    raise RerunRefused(
        f"job {job_id} recorded no step {from_step!r}; its steps: "
        f"{names or 'none (replay it instead: dlq replay)'}"
    )


async def plans(conn: AsyncConnection, job_id: str) -> list[RerunPlan]:
    """The plan of a rerun from each step the job recorded, in order, from one read of its
    record; RerunRefused for an unknown job or one still running or waiting."""
    job = await queries.get_job(conn, job_id)
    if job is None:
        raise NoSuchJob(f"no job with id {job_id}")
    if job.state not in RERUNNABLE:
        raise RerunRefused(
            f"job {job_id} is {job.state.value}: rerun a job once it has ended (wait for it, "
            "or cancel it first)"
        )
    recorded = await steps_of(conn, job_id)
    calls = (
        await conn.execute(
            select(paid_calls).where(paid_calls.c.job_id == job_id).order_by(paid_calls.c.id)
        )
    ).all()
    decided = (
        await conn.execute(
            select(approvals.c.name, approvals.c.decided_at)
            .where(approvals.c.job_id == job_id, approvals.c.state.in_(["approved", "rejected"]))
            .order_by(approvals.c.id)
        )
    ).all()
    children = int(
        await conn.scalar(select(func.count()).select_from(jobs).where(jobs.c.parent_id == job_id))
        or 0
    )
    names = [step.name for step in recorded]
    priced = [
        (
            call,
            Call(
                call.name,
                call.state,
                dollars(spend.to_usd(call.max_cost_micros)),
                None if call.cost_micros is None else dollars(spend.to_usd(call.cost_micros)),
            ),
        )
        for call in calls
    ]
    found = []
    for cut, from_step in enumerate(names):
        boundary = recorded[cut - 1].created_at if cut else None
        found.append(
            RerunPlan(
                job=job,
                from_step=from_step,
                reused_steps=names[:cut],
                steps_again=names[cut:],
                reused_calls=[row.name for row, _ in priced if _reused_call(row, boundary)],
                calls_again=[one for row, one in priced if not _reused_call(row, boundary)],
                reused_approvals=[
                    row.name
                    for row in decided
                    if boundary is not None
                    and row.decided_at is not None
                    and row.decided_at <= boundary
                ],
                children_again=children,
                boundary=boundary,
            )
        )
    return found


async def rerun(
    conn: AsyncConnection,
    rerun_plan: RerunPlan,
    *,
    route: Route,
    payload: dict[str, Any] | None,
    approved_by: str,
    reason: str,
    now: datetime,
) -> str:
    """Make the new job, `queued`, with the reused records copied, and audit it; returns its
    id (the caller pushes it after the commit). RerunRefused when the plan spends and no
    approver or reason is given."""
    if rerun_plan.needs_approval and not (approved_by.strip() and reason.strip()):
        raise RerunRefused(
            f"this rerun makes {len(rerun_plan.calls_again)} paid call(s) again, reserving up "
            f"to ${rerun_plan.reserved_usd}: it needs an approver and a reason (--approved-by "
            "NAME --reason TEXT; a dry run lists the calls)"
        )
    job = rerun_plan.job
    # A new run: the agent's own run deadline counts from now, as for a submit.
    deadline = None if route.deadline_s is None else now + timedelta(seconds=route.deadline_s)
    new = job_store.NewJob(
        job.agent,
        route.lane,
        job.payload if payload is None else payload,
        route.max_attempts,
        owner=job.owner or None,
        priority=job.priority,
        budget_micros=route.budget_micros,
        deadline_at=deadline,
        rerun_of=job.id,
        code_version=job.code_version,  # the reused records' code (versions.py)
    )
    ((new_id, _),) = await job_store.enqueue_many(conn, [new], now=now)
    await _copy(conn, rerun_plan, new_id, now)
    await audit.record(
        conn,
        actor=approved_by.strip() or "operator",
        action="rerun",
        target=new_id,
        details={
            "rerun_of": job.id,
            "from_step": rerun_plan.from_step,
            "reason": reason.strip() or None,
            "reserved_usd": str(rerun_plan.reserved_usd),
            "paid_calls_again": [call.name for call in rerun_plan.calls_again],
            "payload_changed": payload is not None,
        },
        now=now,
    )
    return new_id


async def _copy(conn: AsyncConnection, rerun_plan: RerunPlan, new_id: str, now: datetime) -> None:
    """Copy the reused steps, paid calls and approvals of the original to `new_id`."""
    old = rerun_plan.job.id
    if rerun_plan.reused_steps:
        rows = await conn.execute(
            select(steps.c.name, steps.c.result)
            .where(steps.c.job_id == old, steps.c.name.in_(rerun_plan.reused_steps))
            .order_by(steps.c.id)
        )
        await conn.execute(
            insert(steps),
            [
                {"job_id": new_id, "name": row.name, "attempt": 0, "result": row.result}
                | {"created_at": now}
                for row in rows
            ],
        )
    if rerun_plan.reused_calls:
        rows = await conn.execute(
            select(paid_calls.c.name, paid_calls.c.agent, paid_calls.c.result)
            .where(paid_calls.c.job_id == old, paid_calls.c.name.in_(rerun_plan.reused_calls))
            .order_by(paid_calls.c.id)
        )
        day = spend.utc_day(now)
        await conn.execute(
            insert(paid_calls),
            [
                {
                    "job_id": new_id,
                    "name": r.name,
                    "agent": r.agent,
                    "attempt": 0,
                    "day": day,
                    "state": "closed",
                    "max_cost_micros": 0,
                    "cost_micros": 0,  # paid by the original: the rerun spends nothing on it
                    "result": r.result,
                    "started_at": now,
                    "finished_at": now,
                }
                for r in rows
            ],
        )
    if rerun_plan.reused_approvals:
        rows = await conn.execute(
            select(approvals).where(
                approvals.c.job_id == old, approvals.c.name.in_(rerun_plan.reused_approvals)
            )
        )
        copied = [dict(r._mapping) for r in rows]
        for row in copied:
            del row["id"]
            row["job_id"] = new_id
        await conn.execute(insert(approvals), copied)


def dollars(amount: Decimal) -> Decimal:
    """`amount` with at least two decimals, as money is shown (micro-dollars kept).

    >>> dollars(Decimal("0.2")), dollars(Decimal("0.123456")), dollars(Decimal(0))
    (Decimal('0.20'), Decimal('0.123456'), Decimal('0.00'))
    """
    exponent = amount.as_tuple().exponent
    return amount if isinstance(exponent, int) and exponent < -2 else amount.quantize(CENT)


def _reused_call(call: Any, boundary: datetime | None) -> bool:
    """A paid call is reused when it closed before the last reused step was recorded."""
    return (
        boundary is not None
        and call.state == "closed"
        and call.finished_at is not None
        and call.finished_at <= boundary
    )
