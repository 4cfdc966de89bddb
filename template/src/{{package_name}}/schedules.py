"""Schedules: jobs made on a cron or an interval by any worker (template-owned:
copier-agent-worker).

Every worker may run the scheduler. A tick's job has the idempotency key
`schedule:NAME:TICK` (with the schedule's owner), so the database makes exactly one job per
tick however many workers race for it. After downtime only the latest missed tick makes a
job (one catch-up job, not a burst). A schedule seen for the first time starts at its next
tick. The schedules are answers (`catalog.SCHEDULES`); their state (paused, last tick and
job) is a row in `schedules`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from cronsim import CronSim
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import audit, job_store
from .db import transaction
from .models import schedules as schedules_table
from .queue import JobQueue, Push
from .routes import Routes

log = structlog.get_logger("scheduler")

# How often each worker's scheduler looks for due ticks.
TICK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Schedule:
    """One answer of `schedules`: an agent's job on a cron expression or every N seconds."""

    agent: str
    cron: str | None = None
    every_s: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    owner: str = ""

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before `now`.

        >>> at = datetime(2026, 12, 1, 3, 0, 5, tzinfo=UTC)
        >>> Schedule("a", every_s=60).latest_tick(at).isoformat()
        '2026-12-01T03:00:00+00:00'
        >>> Schedule("a", cron="0 3 * * *").latest_tick(at).isoformat()
        '2026-12-01T03:00:00+00:00'
        """
        if self.every_s is not None:
            seconds = int(now.timestamp()) // self.every_s * self.every_s
            return datetime.fromtimestamp(seconds, UTC)
        assert self.cron is not None
        start = now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
        return next(iter(CronSim(self.cron, start, reverse=True))).astimezone(UTC)

    def next_tick(self, now: datetime) -> datetime:
        """The first tick after `now`.

        >>> Schedule("a", cron="0 3 * * *").next_tick(datetime(2026, 12, 1, 3, tzinfo=UTC))
        datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.timezone.utc)
        """
        if self.every_s is not None:
            return self.latest_tick(now) + timedelta(seconds=self.every_s)
        assert self.cron is not None
        return next(iter(CronSim(self.cron, now.astimezone(UTC)))).astimezone(UTC)


@dataclass(frozen=True)
class ScheduleState:
    """A schedule with its recorded state, as `schedules list` shows it."""

    name: str
    schedule: Schedule
    paused: bool
    paused_by: str | None
    last_tick_at: datetime | None
    last_job_id: str | None
    next_tick_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "agent": self.schedule.agent,
            "cron": self.schedule.cron,
            "every_s": self.schedule.every_s,
            "owner": self.schedule.owner,
            "paused": self.paused,
            "paused_by": self.paused_by,
            "last_tick_at": self.last_tick_at.isoformat() if self.last_tick_at else None,
            "last_job_id": self.last_job_id,
            "next_tick_at": self.next_tick_at.isoformat(),
        }


def key_of(name: str, tick: datetime) -> str:
    """The idempotency key of a schedule's job for one tick.

    >>> key_of("nightly", datetime(2026, 12, 1, 3, tzinfo=UTC))
    'schedule:nightly:2026-12-01T03:00:00+00:00'
    """
    return f"schedule:{name}:{tick.isoformat()}"


async def states(
    conn: AsyncConnection, schedules: Mapping[str, Schedule], now: datetime
) -> list[ScheduleState]:
    """Every schedule with its row (paused, last tick and job), in name order."""
    rows = {row.name: row for row in await conn.execute(select(schedules_table))}
    found = []
    for name, schedule in sorted(schedules.items()):
        row = rows.get(name)
        found.append(
            ScheduleState(
                name=name,
                schedule=schedule,
                paused=bool(row.paused) if row else False,
                paused_by=row.paused_by if row else None,
                last_tick_at=row.last_tick_at if row else None,
                last_job_id=row.last_job_id if row else None,
                next_tick_at=schedule.next_tick(now),
            )
        )
    return found


async def tick(
    engine: AsyncEngine,
    queue: JobQueue,
    schedules: Mapping[str, Schedule],
    routes: Routes,
    now: datetime,
) -> list[str]:
    """Make the job of each schedule's latest tick unless it exists; returns the jobs made.

    `routes` gives each agent's lane, attempts and per-job budget; a schedule whose agent
    this worker does not have is left to a worker that has it.
    """
    made: list[Push] = []
    async with transaction(engine) as conn:
        for current in await states(conn, schedules, now):
            name, schedule = current.name, current.schedule
            due = schedule.latest_tick(now)
            if current.paused or schedule.agent not in routes:
                continue
            if current.last_tick_at is None:
                await _first_sight(conn, name, due, now)  # starts at its next tick
                continue
            if current.last_tick_at >= due:
                continue
            route = routes[schedule.agent]
            lane = route.lane
            job_id, created = await job_store.enqueue(
                conn,
                agent=schedule.agent,
                lane=lane,
                payload=dict(schedule.payload),
                max_attempts=route.max_attempts,
                owner=schedule.owner or None,
                idempotency_key=key_of(name, due),
                now=now,
                budget_micros=route.budget_micros,
            )
            await conn.execute(
                update(schedules_table)
                .where(
                    schedules_table.c.name == name,
                    schedules_table.c.last_tick_at < due,
                )
                .values(last_tick_at=due, last_job_id=job_id, updated_at=now)
            )
            if created:
                made.append(Push(job_id, lane, agent=schedule.agent))
                log.info("schedule_ticked", schedule=name, tick=due.isoformat(), job_id=job_id)
    if made:
        await queue.push_many(made)  # lost pushes are recovered from the queued rows
    return [push.job_id for push in made]


async def _first_sight(conn: AsyncConnection, name: str, due: datetime, now: datetime) -> None:
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    await conn.execute(
        dialect_insert(schedules_table)
        .values(name=name, paused=False, last_tick_at=due, updated_at=now)
        .on_conflict_do_nothing()
    )


async def set_paused(
    conn: AsyncConnection,
    schedules: Mapping[str, Schedule],
    name: str,
    *,
    paused: bool,
    approved_by: str,
    now: datetime,
) -> bool:
    """Pause or resume a schedule, audited; False when it already was so. A resumed
    schedule starts again at its next tick (the ticks it missed make no job)."""
    if name not in schedules:
        known = ", ".join(sorted(schedules)) or "none"
        raise KeyError(f"no schedule named {name!r}; the schedules are: {known}")
    due = schedules[name].latest_tick(now)
    await _first_sight(conn, name, due, now)
    changed = await conn.execute(
        update(schedules_table)
        .where(schedules_table.c.name == name, schedules_table.c.paused != paused)
        .values(
            paused=paused,
            paused_by=approved_by if paused else None,
            last_tick_at=due,
            updated_at=now,
        )
    )
    if changed.rowcount != 1:
        return False
    await audit.record(
        conn,
        actor=approved_by,
        action="schedule_pause" if paused else "schedule_resume",
        target=name,
        details={},
        now=now,
    )
    return True


async def run_scheduler(
    engine: AsyncEngine,
    queue: JobQueue,
    schedules: Mapping[str, Schedule],
    routes: Routes,
) -> None:
    """Tick every TICK_INTERVAL_S until cancelled; a failure is logged and retried."""
    while True:
        try:
            await tick(engine, queue, schedules, routes, datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - the next tick tries again
            log.warning("schedule_tick_failed", error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(TICK_INTERVAL_S)
