"""The dead-letter path: parked jobs grouped by cause, approval-gated limited replay and
in-doubt resolution (template-owned: copier-agent-worker).

A cause is the error class plus a fingerprint of the message with ids and numbers masked,
so "order 8812 not found" and "order 9127 not found" are one cause. Replays need an
approver, are audited one row per job, and never pick by cause a job that has any paid call:
such a job may already have spent money, so it is replayed only when named by id with
`allow_spent`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import audit, budgets, job_store, spend
from .db import transaction
from .models import attempts, jobs, paid_calls
from .states import PARKED, JobState

_MASKS = [
    (
        re.compile(r"\b[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\b", re.I),
        "<id>",
    ),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I), "<id>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
]
PAGE = 1000


class ReplayRefused(ValueError):
    """A replay request that breaks a rule; nothing was changed."""


def fingerprint(error_class: str, message: str) -> str:
    """The cause of an error: its class and its message with ids and numbers masked.

    >>> fingerprint("KeyError", "order 8812 not found in 3f2a9c1e77b04d55a1e0c2b3d4e5f607")
    'KeyError: order <n> not found in <id>'
    """
    masked = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, replacement in _MASKS:
        masked = pattern.sub(replacement, masked)
    return f"{error_class}: {masked[:300]}"


def cause_id(cause: str) -> str:
    """A short, stable handle for a cause, for `--cause`.

    >>> cause_id("KeyError: order <n> not found")
    'c-f10a2476'
    """
    return "c-" + hashlib.sha256(cause.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ParkedJob:
    """A job waiting for an operator, with the cause of its last failure."""

    id: str
    agent: str
    state: JobState
    cause: str
    cause_id: str
    has_paid_calls: bool
    created_at: datetime
    parked_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent": self.agent,
            "state": self.state.value,
            "cause": self.cause,
            "cause_id": self.cause_id,
            "has_paid_calls": self.has_paid_calls,
            "created_at": self.created_at.isoformat(),
            "parked_at": self.parked_at.isoformat(),
        }


@dataclass
class CauseGroup:
    """Parked jobs that failed the same way."""

    cause_id: str
    cause: str
    count: int = 0
    agents: set[str] = field(default_factory=set)
    states: set[str] = field(default_factory=set)
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    sample_ids: list[str] = field(default_factory=list)
    # What an operator can do with the group: settle its in_doubt jobs (`dlq resolve`), or
    # replay by cause the ones that made no paid call (the rest only by id, allow_spent).
    in_doubt: int = 0
    replayable: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause_id": self.cause_id,
            "cause": self.cause,
            "count": self.count,
            "agents": sorted(self.agents),
            "states": sorted(self.states),
            "first_seen": self.first_seen.isoformat() if self.first_seen else None,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
            "sample_ids": self.sample_ids,
        }


async def parked(
    conn: AsyncConnection,
    *,
    state: JobState | None = None,
    cause: str | None = None,
    agent: str | None = None,
) -> list[ParkedJob]:
    """Parked jobs, oldest first; `cause` matches a cause id or a whole cause."""
    if state is not None and state not in PARKED:
        raise ValueError(f"{state.value} is not a parked state")
    found: list[ParkedJob] = []
    after = ""
    while True:
        page = await _parked_page(conn, after, state, agent)
        if not page:
            break
        after = page[-1].id
        found += [job for job in page if cause is None or cause in (job.cause_id, job.cause)]
    return sorted(found, key=lambda job: (job.parked_at, job.id))


async def causes(conn: AsyncConnection) -> list[CauseGroup]:
    """Parked jobs grouped by cause, largest group first."""
    groups: dict[str, CauseGroup] = {}
    for job in await parked(conn):
        group = groups.setdefault(job.cause_id, CauseGroup(job.cause_id, job.cause))
        group.count += 1
        group.agents.add(job.agent)
        group.states.add(job.state.value)
        if job.state is JobState.IN_DOUBT:
            group.in_doubt += 1
        elif not job.has_paid_calls:
            group.replayable += 1
        group.first_seen = min(filter(None, [group.first_seen, job.parked_at]))
        group.last_seen = max(filter(None, [group.last_seen, job.parked_at]))
        if len(group.sample_ids) < 3:
            group.sample_ids.append(job.id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.cause))


@dataclass
class ReplayPlan:
    """What a replay will do: the jobs it replays and the ones it leaves, with why."""

    replay: list[ParkedJob] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (job id, reason)


async def plan_replay(
    conn: AsyncConnection,
    *,
    job_ids: Sequence[str] = (),
    cause: str | None = None,
    limit: int | None = None,
    allow_spent: bool = False,
) -> ReplayPlan:
    """Choose the jobs a replay may put back, by id or by cause (never both)."""
    if bool(job_ids) == (cause is not None):
        raise ReplayRefused("name job ids, or give --cause with --limit, not both or neither")
    if cause is not None:
        if limit is None or limit < 1:
            raise ReplayRefused("--cause needs --limit N (how many jobs to replay at most)")
        return _plan_by_cause(await parked(conn, cause=cause), limit)
    return _plan_by_id(await parked(conn), job_ids, allow_spent)


def _plan_by_cause(candidates: list[ParkedJob], limit: int) -> ReplayPlan:
    plan = ReplayPlan()
    for job in candidates:
        if job.state is JobState.IN_DOUBT or job.has_paid_calls:
            plan.skipped.append((job.id, "has a paid call: replay it by id with --allow-spent"))
        elif len(plan.replay) < limit:
            plan.replay.append(job)
    return plan


def _plan_by_id(
    candidates: list[ParkedJob], job_ids: Sequence[str], allow_spent: bool
) -> ReplayPlan:
    plan = ReplayPlan()
    by_id = {job.id: job for job in candidates}
    for job_id in job_ids:
        job = by_id.get(job_id)
        if job is None:
            plan.skipped.append((job_id, "not a parked job"))
        elif job.state is JobState.IN_DOUBT:
            plan.skipped.append((job_id, "in doubt: settle it with `dlq resolve`"))
        elif job.has_paid_calls and not allow_spent:
            plan.skipped.append((job_id, "has a paid call: add --allow-spent to replay it"))
        else:
            plan.replay.append(job)
    return plan


async def replay(
    engine: AsyncEngine,
    jobs_to_replay: Sequence[ParkedJob],
    *,
    budget: int,
    approved_by: str,
    reason: str | None,
) -> list[str]:
    """Put jobs back to `queued` with `budget` fresh attempts, one audit row each; returns
    the ids replayed (a job another operator moved meanwhile is left alone)."""
    if not approved_by:
        raise ReplayRefused("a replay needs --approved-by NAME")
    replayed: list[str] = []
    for job in jobs_to_replay:
        now = datetime.now(UTC)
        async with transaction(engine) as conn:
            if not await job_store.replay(conn, job.id, budget=budget, now=now):
                continue
            await audit.record(
                conn,
                actor=approved_by,
                action="replay",
                target=job.id,
                now=now,
                details={
                    "from_state": job.state.value,
                    "cause": job.cause,
                    "reason": reason,
                    "had_paid_calls": job.has_paid_calls,
                },
            )
        replayed.append(job.id)
    return replayed


# How an operator may settle an in_doubt job after checking with the provider.
OUTCOMES = ("completed", "failed", "retry", "not-charged")


def check_resolution(outcome: str, approved_by: str, note: str) -> None:
    """Refuse (ReplayRefused) a resolution with an unknown outcome, no approver or no note."""
    if outcome not in OUTCOMES:
        raise ReplayRefused(f"--outcome must be one of {', '.join(OUTCOMES)}")
    if not approved_by or not note:
        raise ReplayRefused("resolving an in-doubt job needs --approved-by NAME and --note TEXT")


async def resolve(
    engine: AsyncEngine,
    job_id: str,
    *,
    outcome: str,
    approved_by: str,
    note: str,
    budget: int,
) -> JobState:
    """Settle an `in_doubt` job after checking the provider: completed, failed, retry (the
    provider did not do the work; its reserved cost stays spent) or not-charged (it did not
    bill: the cost counted for its in-doubt calls is given back, then as retry)."""
    check_resolution(outcome, approved_by, note)
    now = datetime.now(UTC)
    details: dict[str, Any] = {"note": note}
    async with transaction(engine) as conn:
        if outcome == "completed":
            result = {"resolved_by": approved_by, "note": note}
            done = await job_store.resolve(conn, job_id, result=result, now=now)
            to = JobState.COMPLETED
        elif outcome == "failed":
            done = await job_store.reject(
                conn, job_id, reason=f"resolved as failed: {note}", now=now
            )
            to = JobState.FAILED
        else:
            refund = outcome == "not-charged"
            refunded = await _retry_in_doubt(conn, job_id, budget=budget, now=now, refund=refund)
            done = refunded is not None
            if refund and refunded is not None:
                details["refunded_usd"] = str(spend.to_usd(refunded))
            to = JobState.QUEUED
        if not done:
            raise ReplayRefused(f"job {job_id} is not in_doubt; nothing changed")
        await audit.record(
            conn,
            actor=approved_by,
            action=f"resolve_{outcome.replace('-', '_')}",
            target=job_id,
            details=details,
            now=now,
        )
    return to


async def in_doubt_of_cause(conn: AsyncConnection, cause: str, limit: int) -> list[ParkedJob]:
    """Up to `limit` in_doubt jobs of the cause `cause` (an id or a whole cause), oldest first."""
    return (await parked(conn, state=JobState.IN_DOUBT, cause=cause))[:limit]


async def _retry_in_doubt(
    conn: AsyncConnection, job_id: str, *, budget: int, now: datetime, refund: bool
) -> int | None:
    """Queue an in_doubt job again, dropping its in-doubt calls so the retry may call again;
    their counted cost stays spent unless `refund`. The micro-dollars given back (0 without
    refund), or None when the job is not in_doubt."""
    row = (await conn.execute(select(jobs.c.state).where(jobs.c.id == job_id))).first()
    if row is None or row.state != JobState.IN_DOUBT.value:
        return None
    gone = (
        await conn.execute(
            paid_calls.delete()
            .where(paid_calls.c.job_id == job_id, paid_calls.c.state == "in_doubt")
            .returning(paid_calls.c.agent, paid_calls.c.day, paid_calls.c.cost_micros)
        )
    ).all()
    refunded = 0
    budget_id = await budgets.covering(conn, job_id) if refund and gone else None
    for call in gone if refund else ():
        await budgets.settle(
            conn, budget_id, reserved_micros=0, cost_micros=-(call.cost_micros or 0)
        )
        await spend.refund(conn, agent=call.agent, day=call.day, micros=call.cost_micros or 0)
        refunded += call.cost_micros or 0
    if not await job_store.replay(conn, job_id, budget=budget, now=now):
        return None
    return refunded


async def _parked_page(
    conn: AsyncConnection, after: str, state: JobState | None, agent: str | None
) -> list[ParkedJob]:
    last = attempts.alias("last")
    has_paid = exists().where(paid_calls.c.job_id == jobs.c.id)
    stmt = (
        select(
            jobs.c.id,
            jobs.c.agent,
            jobs.c.state,
            jobs.c.last_error,
            jobs.c.created_at,
            jobs.c.updated_at,
            last.c.error_class,
            last.c.error_message,
            has_paid.label("has_paid"),
        )
        .select_from(
            jobs.outerjoin(last, and_(last.c.job_id == jobs.c.id, last.c.number == jobs.c.attempts))
        )
        .where(jobs.c.id > after)
        .order_by(jobs.c.id)
        .limit(PAGE)
    )
    states = [state] if state is not None else list(PARKED)
    stmt = stmt.where(jobs.c.state.in_([s.value for s in states]))
    if agent is not None:
        stmt = stmt.where(jobs.c.agent == agent)
    found = []
    for row in await conn.execute(stmt):
        error_class = row.error_class or "Error"
        message = row.error_message or row.last_error or ""
        cause = fingerprint(error_class, message)
        found.append(
            ParkedJob(
                row.id,
                row.agent,
                JobState(row.state),
                cause,
                cause_id(cause),
                bool(row.has_paid),
                row.created_at,
                row.updated_at,
            )
        )
    return found
