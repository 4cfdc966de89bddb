"""The gate before the claim: agent concurrency limits (template-owned: copier-agent-worker).

A job whose agent (or whose owner's share of it) is at its `max_concurrent` limit is not
claimed, so it uses no attempt: the gate asks arq to deliver it again a little later, and
it starts in whichever worker finds a slot free. arq counts that delivery against its own
`max_tries` (lanes.ARQ_MAX_TRIES, 10,000); the database's attempt count, which is the one
that decides retries and dead letters, is untouched. Should a job wait so long that arq
gives up on it, its row is still `queued` and recovery pushes it again.
"""

from __future__ import annotations

import random
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import structlog
from arq.worker import Retry
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import queries
from ..routes import Routes
from .calls import WaitObserver
from .limiter import Concurrency, Limiter, Slot, agent_slots, note_waiting

log = structlog.get_logger("gate")

# How long a job over its limit waits before arq delivers it again: it starts at the first
# value and grows with arq's delivery count up to the second, but never past the moment the
# oldest holder's lease runs out. Jitter spreads the waiting jobs' rechecks.
RECHECK_S = (0.2, 5.0)
# When Redis or the database cannot answer, the job is delivered again after this long.
UNAVAILABLE_RETRY_S = 2.0
# Jobs whose agent and owner the gate remembers (they never change), saving a read per recheck.
REMEMBERED_JOBS = 10_000


def recheck_delay(wait_s: float, delivery: int, rand: float = 0.5) -> float:
    """Seconds until a job over its limit is delivered again.

    >>> recheck_delay(30.0, 1)
    0.2
    >>> recheck_delay(30.0, 1_000)
    5.0
    >>> recheck_delay(0.05, 1_000)
    0.05
    """
    low, high = RECHECK_S
    grown = min(high, low * (1 + (delivery - 1) / 20))
    return round(min(wait_s, grown) * (0.8 + 0.4 * rand), 3)


@dataclass
class Admission:
    """The slots one job holds while it runs; renewed with its heartbeat, freed when it
    settles. An admission without slots (an unlimited agent) costs nothing."""

    limiter: Limiter | None = None
    slots: list[Slot] = field(default_factory=list)
    holder: str = ""
    lease_s: float = 0.0

    async def renew(self) -> None:
        if self.limiter is not None and self.slots:
            held = await self.limiter.renew(self.slots, self.holder, self.lease_s)
            if held < len(self.slots):
                log.warning("limit_slot_lost", holder=self.holder, held=held)

    async def release(self) -> None:
        if self.limiter is not None and self.slots:
            try:
                await self.limiter.release(self.slots, self.holder)
            except (RedisError, OSError) as exc:  # the lease frees it soon anyway
                log.warning("limit_release_failed", holder=self.holder, error=str(exc))


NO_LIMIT = Admission()


class Gate:
    """Decides, before the claim, whether a delivered job may start now."""

    def __init__(
        self,
        limiter: Limiter,
        limited: Mapping[str, Concurrency],
        routes: Routes,
        lease_s: float,
        on_wait: WaitObserver | None = None,
    ) -> None:
        """`limited`: the agents with a concurrency limit (registry.Registry.concurrency);
        `routes` tells their lanes."""
        self.limiter = limiter
        self.lease_s = lease_s
        self.on_wait = on_wait
        self.limited: dict[str, Concurrency] = {
            name: limit
            for name, limit in limited.items()
            if limit.max_concurrent or limit.per_owner
        }
        self.lanes = {routes[name].lane for name in self.limited if name in routes}
        self._who: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def guards(self, lane: str | None, agent: str = "") -> bool:
        """Whether a job of `agent` delivered on `lane` may need a slot (None or "": not
        known, so maybe). A job whose delivery names an unlimited agent costs nothing here:
        no read of the database, no call to Redis."""
        return (
            bool(self.limited)
            and (lane is None or lane in self.lanes)
            and (not agent or agent in self.limited)
        )

    async def admit(self, engine: AsyncEngine, job_id: str, delivery: int) -> Admission:
        """The job's slots, or `Retry` (no attempt used) when its agent is at a limit."""
        try:
            who = await self._agent_and_owner(engine, job_id)
        except (DBAPIError, OSError) as exc:
            log.warning("limit_check_failed", job_id=job_id, error=str(exc))
            raise Retry(defer=timedelta(seconds=UNAVAILABLE_RETRY_S)) from exc
        limit = self.limited.get(who[0]) if who is not None else None
        if who is None or limit is None:
            return NO_LIMIT  # a missing job or an unlimited agent: the claim decides
        agent, owner = who
        slots = agent_slots(agent, owner, limit.max_concurrent, limit.per_owner)
        holder = f"{job_id}:{secrets.token_hex(4)}"  # one per delivery: a twin never frees ours
        try:
            wait_s = await self.limiter.acquire(slots, holder, self.lease_s)
        except (RedisError, OSError) as exc:
            log.warning("limit_check_failed", job_id=job_id, error=str(exc))
            raise Retry(defer=timedelta(seconds=UNAVAILABLE_RETRY_S)) from exc
        if wait_s == 0:
            return Admission(self.limiter, slots, holder, self.lease_s)
        await note_waiting(self.limiter.redis, f"agent:{agent}", job_id)
        if self.on_wait is not None:
            self.on_wait(f"agent:{agent}")
        recheck = recheck_delay(wait_s, delivery, random.random())
        log.info("job_waits_for_limit", job_id=job_id, agent=agent, recheck_in_s=recheck)
        raise Retry(defer=timedelta(seconds=recheck))

    async def _agent_and_owner(self, engine: AsyncEngine, job_id: str) -> tuple[str, str] | None:
        who = self._who.get(job_id)
        if who is None:
            async with engine.connect() as conn:
                job = await queries.get_job(conn, job_id)
            if job is None:
                return None
            who = self._who[job_id] = (job.agent, job.owner)
            if len(self._who) > REMEMBERED_JOBS:
                self._who.popitem(last=False)
        return who
