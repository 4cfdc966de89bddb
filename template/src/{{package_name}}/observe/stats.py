"""What the whole service looks like right now, read from the database and Redis
(template-owned: copier-agent-worker).

One set of queries for two readers: `stats` prints it, and `/metrics` exports it as the
`agent_worker_*` gauges, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from .. import dlq, limits, queries, registry, replies, spend, webhooks
from ..queue import JobQueue
from ..settings import Settings
from ..states import JobState


@dataclass(frozen=True)
class ServiceStats:
    """The database's view of the whole service (every worker, not one process)."""

    jobs_by_state: dict[str, int]
    estimated_states: frozenset[str]  # counted from PostgreSQL's statistics (queries.py)
    oldest_queued: dict[str, datetime]  # per lane: since when its oldest due job is due
    scheduled: dict[str, int]  # per lane: queued jobs not due yet (delay, backoff, deferral)
    parked_by_cause: list[dlq.CauseGroup]
    caps: list[spend.Cap]
    unsent_replies: int
    webhooks: webhooks.Backlog
    read_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def oldest_queued_age_s(self, lane: str) -> float | None:
        """Seconds the lane's longest-waiting due `queued` job has been due, or None when
        none is due (a job delayed an hour starts counting in an hour)."""
        since = self.oldest_queued.get(lane)
        return None if since is None else max((self.read_at - since).total_seconds(), 0.0)


async def read_service_stats(conn: AsyncConnection, *, causes: bool = True) -> ServiceStats:
    """Counts by state, each lane's oldest due and its scheduled queued jobs, parked causes,
    today's spend against the caps, unsent replies and webhook notifications, in one
    connection."""
    now = datetime.now(UTC)
    by_state = await queries.state_counts(conn)
    return ServiceStats(
        jobs_by_state={s.value: by_state.counts.get(s.value, 0) for s in JobState},
        estimated_states=by_state.estimated,
        oldest_queued=await queries.oldest_queued(conn, now=now),
        scheduled=await queries.scheduled_counts(conn, now=now),
        parked_by_cause=await dlq.causes(conn) if causes else [],
        caps=await spend.caps_for_day(conn, datetime.now(UTC).date()),
        unsent_replies=await replies.unsent(conn),
        webhooks=await webhooks.backlog(conn),
        read_at=now,
    )


async def lane_depths(queue: JobQueue, lanes: Iterable[str]) -> dict[str, int]:
    """How many job ids wait in each lane's arq queue."""
    return {lane: await queue.depth(lane) for lane in lanes}


def as_json(stats: ServiceStats, depths: dict[str, int], lanes: Iterable[str]) -> dict[str, Any]:
    """The `stats --json` document."""
    return {
        "jobs_by_state": dict(stats.jobs_by_state),
        "estimated_states": sorted(stats.estimated_states),
        "lanes": {
            lane: {
                "redis_depth": depths[lane],
                "oldest_queued_age_s": _round(stats.oldest_queued_age_s(lane)),
                "scheduled": stats.scheduled.get(lane, 0),
            }
            for lane in lanes
        },
        "parked_by_cause": [
            {"cause_id": g.cause_id, "count": g.count, "cause": g.cause}
            for g in stats.parked_by_cause
        ],
        "spend_today": [
            {
                "agent": c.agent,
                "cap_usd": str(c.cap_usd),
                "spent_usd": str(c.spent_usd),
                "reserved_usd": str(c.reserved_usd),
            }
            for c in stats.caps
        ],
        "unsent_replies": stats.unsent_replies,
        "unsent_webhooks": stats.webhooks.unsent,
        "failed_webhooks": stats.webhooks.failed,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def limits_usage(queue: JobQueue, settings: Settings) -> list[dict[str, Any]]:
    """Each agent and named limit: running now, its sizes, and how many wait on it."""
    found = registry.load(settings)
    return await limits.usage(limits.Limiter(queue.pool), found.concurrency, found.limits)
