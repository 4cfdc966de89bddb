"""Limits shared by every worker, held in Redis (template-owned: copier-agent-worker).

A concurrency limit is a sorted set of holders scored by the time their lease runs out:
acquiring drops expired holders, counts the rest and adds one; a running job renews its
holders with its heartbeat and removes them when it settles, so the slots of a worker that
was SIGKILLed come back by themselves when their lease runs out. Each operation is one Lua
script that reads Redis' own clock (`TIME`), so the workers' clocks never matter, and its
reply says how long to wait when the limit is full.

The state is disposable: a FLUSHALL frees every slot at once (a limit may then briefly admit
up to twice its size while the jobs that held the old slots finish); the job record, in the
database, is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

KEY_PREFIX = f"{__package__}:limit:"

# KEYS: the holder sets a job needs all of. ARGV: holder, lease (ms), then each set's size.
# Takes every slot or none; returns 0 when taken, else the milliseconds until the first
# holder of a full set would lose its lease (an upper bound on the wait).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, lease = ARGV[1], tonumber(ARGV[2])
local wait = 0
for i, key in ipairs(KEYS) do
  redis.call('zremrangebyscore', key, '-inf', now)
  if not redis.call('zscore', key, holder)
      and redis.call('zcard', key) >= tonumber(ARGV[i + 2]) then
    local first = redis.call('zrange', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(first[2]) - now)
  end
end
if wait > 0 then return wait end
for _, key in ipairs(KEYS) do
  redis.call('zadd', key, now + lease, holder)
  redis.call('pexpireat', key, redis.call('zrange', key, -1, -1, 'WITHSCORES')[2])
end
return 0
"""

# KEYS: holder sets. ARGV: holder, lease (ms). Extends the holder's lease in the sets that
# still hold it (a lease already lost is not taken back: that could overfill the set).
# Returns how many sets still held it.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, lease, held = ARGV[1], tonumber(ARGV[2]), 0
for _, key in ipairs(KEYS) do
  redis.call('zremrangebyscore', key, '-inf', now)
  held = held + redis.call('zadd', key, 'XX', 'CH', now + lease, holder)
  local last = redis.call('zrange', key, -1, -1, 'WITHSCORES')[2]
  if last then redis.call('pexpireat', key, last) end
end
return held
"""

# KEYS: holder sets. ARGV: holder. Frees the holder's slots.
_RELEASE = """
for _, key in ipairs(KEYS) do redis.call('zrem', key, ARGV[1]) end
return 0
"""

# KEYS: one holder set. Returns how many holders' leases have not run out.
_HOLDERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('zcount', KEYS[1], '(' .. now, '+inf')
"""


@dataclass(frozen=True)
class Slot:
    """One concurrency limit a job or call needs a place in: its Redis key and size."""

    key: str
    size: int


def agent_slots(
    agent: str, owner: str, max_concurrent: int | None, per_owner: int | None
) -> list[Slot]:
    """The slots a job of `agent` submitted by `owner` needs.

    >>> [s.key.rsplit(":", 3)[-3:] for s in agent_slots("a", "acme", 3, 1)]
    [['limit', 'agent', 'a'], ['agent', 'a', 'acme']]
    >>> agent_slots("a", "", None, None)
    []
    """
    slots = []
    if max_concurrent is not None:
        slots.append(Slot(f"{KEY_PREFIX}agent:{agent}", max_concurrent))
    if per_owner is not None:
        slots.append(Slot(f"{KEY_PREFIX}agent:{agent}:{owner}", per_owner))
    return slots


class Limiter:
    """Takes, renews and frees slots in Redis; one instance per worker process."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._holders = redis.register_script(_HOLDERS)

    async def acquire(self, slots: Sequence[Slot], holder: str, lease_s: float) -> float:
        """Take a place in every one of `slots` for `holder`, or none: 0.0 when taken,
        else the seconds after which a full slot's oldest lease runs out."""
        keys = [slot.key for slot in slots]
        args: list[str | int] = [holder, _ms(lease_s), *(slot.size for slot in slots)]
        wait_ms = int(await self._acquire(keys=keys, args=args))
        return wait_ms / 1000

    async def renew(self, slots: Sequence[Slot], holder: str, lease_s: float) -> int:
        """Extend `holder`'s leases; returns how many of `slots` still held it."""
        keys = [slot.key for slot in slots]
        return int(await self._renew(keys=keys, args=[holder, _ms(lease_s)]))

    async def release(self, slots: Sequence[Slot], holder: str) -> None:
        """Free `holder`'s places in `slots` (freeing one not held is harmless)."""
        await self._release(keys=[slot.key for slot in slots], args=[holder])

    async def holders(self, slot: Slot) -> int:
        """How many unexpired holders `slot` has now."""
        return int(await self._holders(keys=[slot.key]))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
