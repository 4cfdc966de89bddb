"""Pause and ask: a paid call that a budget or a daily cap cannot cover, for an agent with
`on_budget: wait`, parks its job on an approval named `budget` instead of denying it
(template-owned: copier-agent-worker).

Nothing was reserved and nothing sent: the reservation's transaction rolled back. The job
waits like any other approval (no lease, no arq entry, no attempt used), listed by
`approvals list` with what the call needs and what is left. Then:

- `approvals approve JOB --raise-budget-usd Y` adds Y to what stopped it (the job's budget,
  its tree's, or that UTC day's cap) and queues the job, in one transaction (approvals.py);
  the job re-runs from the top and the call reserves again;
- `approvals reject JOB --reason TEXT` fails the job;
- a daily cap's stop expires at the next UTC midnight: recovery then queues the job by
  itself, and the call reserves against the new day.

A job that is stopped again later asks again: the same approval row goes back to pending
with the new figures (each decision stays in the audit log).
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import NoReturn

import structlog
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from . import events
from .db import transaction
from .models import approvals
from .spend import SpendDenied, Stop, to_usd
from .waiting import Wait, approval_reason

log = structlog.get_logger("budget_asks")
BUDGET = "budget"  # the approval's name


def summary_of(call: str, stop: Stop) -> str:
    """What `approvals list` shows for the stop.

    >>> summary_of("draft", Stop("tree", "r1", 50_000, 20_000))
    "paid call 'draft' needs $0.05; the budget of job r1 (its tree's) has $0.02 left"
    >>> from datetime import date
    >>> summary_of("x", Stop("agent", "a", 1_000_000, 0, date(2026, 12, 4)))
    "paid call 'x' needs $1; agent a's daily cap for 2026-12-04 has $0 left"
    """
    whose = {
        "job": f"this job's budget ({stop.target})",
        "tree": f"the budget of job {stop.target} (its tree's)",
        "agent": f"agent {stop.target}'s daily cap for {stop.day}",
        "global": f"the global daily cap for {stop.day}",
    }[stop.kind]
    needs, left = to_usd(stop.asked_micros), to_usd(max(stop.left_micros, 0))
    return f"paid call {call!r} needs ${needs}; {whose} has ${left} left"


async def ask(engine: AsyncEngine, job_id: str, call: str, denied: SpendDenied) -> NoReturn:
    """Record (or re-arm) the job's `budget` approval for `denied.stop` and raise `Wait`."""
    stop = denied.stop
    assert stop is not None, "only a budget's or a cap's refusal can wait"
    now = datetime.now(UTC)
    expires = None
    if stop.day is not None:  # a daily cap: the next UTC day brings room by itself
        expires = datetime.combine(stop.day + timedelta(days=1), time(0), tzinfo=UTC)
    values = {
        "summary": summary_of(call, stop),
        "state": "pending",
        "requested_at": now,
        "expires_at": expires,
        "decided_at": None,
        "decided_by": None,
        "reason": None,
        "details": {**stop.as_dict(), "call": call},
    }
    async with transaction(engine) as conn:
        found = await conn.scalar(
            select(approvals.c.id).where(approvals.c.job_id == job_id, approvals.c.name == BUDGET)
        )
        if found is None:
            await conn.execute(insert(approvals).values(job_id=job_id, name=BUDGET, **values))
        else:
            await conn.execute(update(approvals).where(approvals.c.id == found).values(**values))
        asked = {"name": BUDGET, "summary": values["summary"]}
        await events.append(conn, job_id, [events.New("approval_requested", asked)], now=now)
    log.warning("job_waits_for_budget", job_id=job_id, call=call, stop=stop.kind, why=str(denied))
    raise Wait(approval_reason(BUDGET))
