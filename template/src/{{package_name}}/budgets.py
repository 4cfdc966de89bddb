"""Budgets of jobs and job trees: reserve before a paid call, settle after
(template-owned: copier-agent-worker).

A job may carry a budget (`submit --budget-usd`, `budget_usd` in the API, the agent's
`job_budget_usd`, or `ctx.spawn(..., budget_usd=...)` for a child). A child with no budget
of its own draws on its parent's (so on its root's): `jobs.budget_id` names the job whose
budget covers a job, and a budget made inside a tree names the budget above it
(`budgets.parent_job_id`). A sub-budget is a limit inside the one above it, never beside
it: a child's calls count against its own budget and every budget above it, so a tree
never spends more than its root's budget, however its children are carved.

A reservation is one guarded UPDATE per budget of the chain, leaf first
(`... WHERE spent + reserved + :max <= budget`), in the paid call's transaction and before
the daily caps (spend.py), so concurrent workers wait on the row lock and re-check: no
budget is ever overshot. Money is integer micro-dollars, as in spend.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import budgets, jobs, paid_calls
from .spend import CapChangeRefused, SpendDenied, Stop, parse_usd, to_micros, to_usd

# A call that was or may have been charged counts as spent; an open one as reserved.
SPENT_STATES = ("closed", "in_doubt")


class BudgetRefused(ValueError):
    """A budget given to a new job was refused before anything was written."""


def parse_budget(value: Decimal | str | int | None, *, field: str = "budget_usd") -> int | None:
    """A job's budget in dollars as micro-dollars, or None for no budget; above 0, at most
    the largest cap (spend.MAX_CAP_USD), in whole micro-dollars.

    >>> parse_budget("0.20"), parse_budget(None)
    (200000, None)
    >>> for text in ("0", "ten"):
    ...     try:
    ...         parse_budget(text)
    ...     except BudgetRefused as exc:
    ...         print(exc)
    budget_usd must be above 0 dollars, like "2.00" (got '0')
    budget_usd must be a number of dollars from 0 to 1000000, like "25.00" (got 'ten')
    """
    if value is None:
        return None
    try:
        amount = parse_usd(str(value), field=field)
    except CapChangeRefused as exc:
        raise BudgetRefused(str(exc)) from None
    if amount <= 0:
        raise BudgetRefused(f'{field} must be above 0 dollars, like "2.00" (got {str(value)!r})')
    return to_micros(amount)


@dataclass(frozen=True)
class Budget:
    """One budget row: its amount and what is reserved and spent under it."""

    job_id: str
    parent_job_id: str | None
    budget_usd: Decimal
    reserved_usd: Decimal
    spent_usd: Decimal

    @property
    def remaining_usd(self) -> Decimal:
        return max(self.budget_usd - self.reserved_usd - self.spent_usd, Decimal(0))

    def as_dict(self) -> dict[str, str | None]:
        return {
            "job_id": self.job_id,
            "parent_job_id": self.parent_job_id,
            "budget_usd": str(self.budget_usd),
            "reserved_usd": str(self.reserved_usd),
            "spent_usd": str(self.spent_usd),
            "remaining_usd": str(self.remaining_usd),
        }


async def open_budget(
    conn: AsyncConnection,
    job_id: str,
    budget_micros: int | None,
    *,
    covering: str | None,
    now: datetime,
) -> str | None:
    """Give the new job `job_id` its budget (a row, carved inside `covering`, the budget
    that covered its parent) and return the id of the budget that covers it: its own, or
    `covering` when it has none. Call in the transaction that inserts the job."""
    if budget_micros is None:
        return covering
    await conn.execute(
        insert(budgets).values(
            job_id=job_id,
            parent_job_id=covering,
            budget_micros=budget_micros,
            reserved_micros=0,
            spent_micros=0,
            created_at=now,
            updated_at=now,
        )
    )
    return job_id


async def reserve(
    conn: AsyncConnection, job_id: str, budget_id: str | None, max_micros: int
) -> None:
    """Reserve `max_micros` under `budget_id` (the job's `jobs.budget_id`) and every budget
    above it, or raise SpendDenied (call inside the paid call's transaction, so a refusal
    rolls back the budgets below). A job no budget covers costs no read at all."""
    now = datetime.now(UTC)
    c = budgets.c
    for key in await chain_from(conn, budget_id):
        result = await conn.execute(
            update(budgets)
            .where(
                c.job_id == key, c.spent_micros + c.reserved_micros + max_micros <= c.budget_micros
            )
            .values(reserved_micros=c.reserved_micros + max_micros, updated_at=now)
        )
        if result.rowcount == 1:
            continue
        row = (await conn.execute(select(budgets).where(c.job_id == key))).first()
        if row is None:  # pruned with its job: nothing left to hold the tree to
            continue
        whose = "this job's budget" if key == job_id else f"the budget of job {key}"
        used = row.reserved_micros + row.spent_micros
        stop = Stop("job" if key == job_id else "tree", key, max_micros, row.budget_micros - used)
        raise SpendDenied(
            f"{whose} is reached: ${to_usd(row.budget_micros)} budget, "
            f"${to_usd(used)} reserved or spent, ${to_usd(max_micros)} more asked",
            stop,
        )


async def settle(
    conn: AsyncConnection, budget_id: str | None, *, reserved_micros: int, cost_micros: int
) -> None:
    """Turn a reservation into spend under `budget_id` (a job's `jobs.budget_id`, see
    `covering`) and every budget above it; nothing for None."""
    now = datetime.now(UTC)
    c = budgets.c
    for key in await chain_from(conn, budget_id):
        await conn.execute(
            update(budgets)
            .where(c.job_id == key)
            .values(
                reserved_micros=c.reserved_micros - reserved_micros,
                spent_micros=c.spent_micros + cost_micros,
                updated_at=now,
            )
        )


async def raise_budget(conn: AsyncConnection, job_id: str, micros: int) -> bool:
    """Add `micros` to the budget of job `job_id` (a person approved more spend); False
    when the job has no budget (pruned)."""
    result = await conn.execute(
        update(budgets)
        .where(budgets.c.job_id == job_id)
        .values(budget_micros=budgets.c.budget_micros + micros, updated_at=datetime.now(UTC))
    )
    return result.rowcount == 1


async def chain_from(conn: AsyncConnection, budget_id: str | None) -> list[str]:
    """`budget_id` and the budgets it is carved inside, up to the root's; [] for None."""
    found: list[str] = []
    key = budget_id
    while key is not None and key not in found:
        found.append(str(key))
        key = await conn.scalar(select(budgets.c.parent_job_id).where(budgets.c.job_id == key))
    return found


async def covering(conn: AsyncConnection, job_id: str) -> str | None:
    """The id of the budget that covers `job_id` (what a child of it inherits), or None."""
    value = await conn.scalar(select(jobs.c.budget_id).where(jobs.c.id == job_id))
    return None if value is None else str(value)


async def budget_of(conn: AsyncConnection, job_id: str) -> Budget | None:
    row = (await conn.execute(select(budgets).where(budgets.c.job_id == job_id))).first()
    if row is None:
        return None
    return Budget(
        row.job_id,
        row.parent_job_id,
        to_usd(row.budget_micros),
        to_usd(row.reserved_micros),
        to_usd(row.spent_micros),
    )


@dataclass(frozen=True)
class Cost:
    """What one job's paid calls spent and hold reserved, from its own paid-call rows."""

    job_id: str
    spent_usd: Decimal
    reserved_usd: Decimal

    def as_dict(self) -> dict[str, str]:
        return {
            "job_id": self.job_id,
            "spent_usd": str(self.spent_usd),
            "reserved_usd": str(self.reserved_usd),
        }


async def costs(conn: AsyncConnection, job_ids: list[str]) -> dict[str, Cost]:
    """Each job's own cost (jobs with no paid call cost $0), one GROUP BY for a page."""
    c = paid_calls.c
    spent = func.sum(func.coalesce(c.cost_micros, 0)).filter(c.state.in_(SPENT_STATES))
    held = func.sum(c.max_cost_micros).filter(c.state == "open")
    rows = await conn.execute(
        select(c.job_id, spent.label("spent"), held.label("held"))
        .where(c.job_id.in_(job_ids))
        .group_by(c.job_id)
    )
    found = {row.job_id: (int(row.spent or 0), int(row.held or 0)) for row in rows}
    none = (0, 0)
    return {
        job_id: Cost(job_id, to_usd(found.get(job_id, none)[0]), to_usd(found.get(job_id, none)[1]))
        for job_id in job_ids
    }


async def tree_of(conn: AsyncConnection, root_id: str) -> list[str]:
    """`root_id` and every descendant (children through `ctx.spawn`), root first."""
    tree = (
        select(jobs.c.id, literal(0).label("depth"))
        .where(jobs.c.id == root_id)
        .cte("tree", recursive=True)
    )
    tree = tree.union_all(
        select(jobs.c.id, (tree.c.depth + 1).label("depth")).where(jobs.c.parent_id == tree.c.id)
    )
    rows = await conn.execute(select(tree.c.id).order_by(tree.c.depth, tree.c.id))
    return [str(row.id) for row in rows]


@dataclass(frozen=True)
class TreeCost:
    """A job tree's spend as one number, with each job's share (the root first)."""

    root_id: str
    spent_usd: Decimal
    reserved_usd: Decimal
    shares: list[Cost]

    def as_dict(self) -> dict[str, object]:
        return {
            "root_id": self.root_id,
            "spent_usd": str(self.spent_usd),
            "reserved_usd": str(self.reserved_usd),
            "jobs": [share.as_dict() for share in self.shares],
        }


async def tree_cost(conn: AsyncConnection, root_id: str) -> TreeCost:
    ids = await tree_of(conn, root_id)
    found = await costs(conn, ids)
    shares = [found[job_id] for job_id in ids]
    return TreeCost(
        root_id,
        sum((share.spent_usd for share in shares), Decimal(0)),
        sum((share.reserved_usd for share in shares), Decimal(0)),
        shares,
    )


async def cost_of(conn: AsyncConnection, job_id: str, budget_id: str | None) -> dict[str, Any]:
    """What `jobs show`, the API's job and the console's job page say of a job's money:
    its own spend and reservations, the budget that covers it (`budget_id`, the job's
    column), and its tree's spend with each job's share when it has children."""
    tree = await tree_cost(conn, job_id)
    own = tree.shares[0] if tree.shares else Cost(job_id, Decimal(0), Decimal(0))
    budget = None if budget_id is None else await budget_of(conn, budget_id)
    return {
        "spent_usd": str(own.spent_usd),
        "reserved_usd": str(own.reserved_usd),
        "budget": None if budget is None else budget.as_dict(),
        "tree": tree.as_dict() if len(tree.shares) > 1 else None,
    }
