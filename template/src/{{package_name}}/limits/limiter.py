"""The limiter: limits shared by every worker, held in Redis (template-owned:
copier-agent-worker).

A concurrency limit is a sorted set of holders scored by the time their lease runs out:
acquiring drops expired holders, counts the rest and adds one; a running job renews its
holders with its heartbeat and removes them when it settles, so the slots of a worker that
was SIGKILLed come back by themselves when their lease runs out. Each operation is one Lua
script that reads Redis' own clock (`TIME`), so the workers' clocks never matter, and its
reply says how long to wait when the limit is full.

A rate is a sliding-window log: a sorted set of call starts scored by their time (and, for
`tokens_per_minute`, carrying each call's tokens), trimmed to the period, so "N per minute"
means never N+1 starts in any 60 s, across all workers. Tokens are reserved from the
caller's estimate and settled to the real count when the provider reports it.

The state is disposable: a FLUSHALL frees every slot at once (a limit may then briefly admit
up to twice its size while the jobs that held the old slots finish); the job record, in the
database, is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from redis.asyncio import Redis
from redis.exceptions import RedisError

# The service's package name, as before the move into limits/: the Redis keys stay the same.
KEY_PREFIX = f"{__package__.rpartition('.')[0]}:limit:"

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


# One named limit's check-and-take, all or nothing. KEYS: the limit's sets. ARGV: holder,
# lease of a concurrency slot (ms), tokens, then for each key its kind ('c' concurrency,
# 'r' requests, 't' tokens), its size and its period (ms). A start stays in a window while
# now - start <= period, so no closed window of one period ever holds more than the size.
# Returns {0, 0, now_ms} when taken, else {ms until the rate windows have room (0 when they
# have), 1 when a concurrency slot is full (it frees when a call ends: no time known) else 0,
# now_ms}.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, lease, tokens = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function weight(kind, member)
  if kind == 'r' then return 1 end
  return tonumber(string.match(member, ':(%d+)$'))
end
local wait, full = 0, 0
for i, key in ipairs(KEYS) do
  local kind, size, period = ARGV[1 + 3 * i], tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  if kind == 'c' then
    redis.call('zremrangebyscore', key, '-inf', now)
    if redis.call('zcard', key) >= size then full = 1 end
  else
    redis.call('zremrangebyscore', key, '-inf', now - period - 1)
    local entries = redis.call('zrange', key, 0, -1, 'WITHSCORES')
    local used = 0
    for j = 1, #entries, 2 do used = used + weight(kind, entries[j]) end
    local excess = used + (kind == 'r' and 1 or tokens) - size
    local freed = 0
    for j = 1, #entries, 2 do
      if excess <= 0 then break end
      freed = freed + weight(kind, entries[j])
      if freed >= excess then
        wait = math.max(wait, tonumber(entries[j + 1]) + period + 1 - now)
        break
      end
    end
  end
end
if wait > 0 or full == 1 then return {wait, full, now} end
for i, key in ipairs(KEYS) do
  local kind, period = ARGV[1 + 3 * i], tonumber(ARGV[3 + 3 * i])
  if kind == 'c' then
    redis.call('zadd', key, now + lease, holder)
    redis.call('pexpireat', key, redis.call('zrange', key, -1, -1, 'WITHSCORES')[2])
  else
    redis.call('zadd', key, now, kind == 'r' and holder or (holder .. ':' .. tokens))
    redis.call('pexpireat', key, now + period + 1)
  end
end
return {0, 0, now}
"""

# Settles a call's tokens to the real count, keeping its start time. KEYS: the token window.
# ARGV: holder, reserved tokens, real tokens.
_SETTLE = """
local old = ARGV[1] .. ':' .. ARGV[2]
local start = redis.call('zscore', KEYS[1], old)
if start then
  redis.call('zrem', KEYS[1], old)
  redis.call('zadd', KEYS[1], start, ARGV[1] .. ':' .. ARGV[3])
end
return 0
"""

PERIOD_MS = {
    "requests_per_second": 1000,
    "requests_per_minute": 60_000,
    "tokens_per_minute": 60_000,
}


@dataclass(frozen=True)
class LimitConfig:
    """A named limit on the calls agents make (the answer `limits`); at least one field."""

    max_concurrent: int | None = None
    requests_per_second: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def windows(self, name: str) -> list[tuple[str, str, int, int]]:
        """(key, kind, size, period ms) of each part of the limit.

        >>> [w[1:] for w in LimitConfig(max_concurrent=2, tokens_per_minute=9).windows("llm")]
        [('c', 2, 0), ('t', 9, 60000)]
        """
        parts: list[tuple[str, str, int, int]] = []
        if self.max_concurrent is not None:
            parts.append((f"{KEY_PREFIX}call:{name}:concurrent", "c", self.max_concurrent, 0))
        for field_name, kind in (
            ("requests_per_second", "r"),
            ("requests_per_minute", "r"),
            ("tokens_per_minute", "t"),
        ):
            size = getattr(self, field_name)
            if size is not None:
                key = f"{KEY_PREFIX}call:{name}:{field_name}"
                parts.append((key, kind, size, PERIOD_MS[field_name]))
        return parts


@dataclass
class Grant:
    """A call's place under a named limit: `started_ms` is Redis' clock when it was taken;
    set `tokens_used` (or call `used`) to settle the reserved tokens to the real count."""

    name: str
    tokens: int
    started_ms: int
    waited_s: float = 0.0
    tokens_used: int | None = field(default=None)

    def used(self, tokens: int) -> None:
        self.tokens_used = tokens


@dataclass(frozen=True)
class Slot:
    """One concurrency limit a job or call needs a place in: its Redis key and size."""

    key: str
    size: int


class Concurrency(NamedTuple):
    """An agent's limits on its jobs running at once: in all, and per owner (None: none)."""

    max_concurrent: int | None
    per_owner: int | None


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
        self._take = redis.register_script(_TAKE)
        self._settle = redis.register_script(_SETTLE)

    async def acquire(self, slots: Sequence[Slot], holder: str, lease_s: float) -> float:
        """Take a place in every one of `slots` for `holder`, or none: 0.0 when taken,
        else the seconds after which a full slot's oldest lease runs out."""
        keys = [slot.key for slot in slots]
        args: list[str | int] = [holder, to_ms(lease_s), *(slot.size for slot in slots)]
        wait_ms = int(await self._acquire(keys=keys, args=args))
        return wait_ms / 1000

    async def renew(self, slots: Sequence[Slot], holder: str, lease_s: float) -> int:
        """Extend `holder`'s leases; returns how many of `slots` still held it."""
        keys = [slot.key for slot in slots]
        return int(await self._renew(keys=keys, args=[holder, to_ms(lease_s)]))

    async def release(self, slots: Sequence[Slot], holder: str) -> None:
        """Free `holder`'s places in `slots` (freeing one not held is harmless)."""
        await self._release(keys=[slot.key for slot in slots], args=[holder])

    async def take(
        self, windows: Sequence[tuple[str, str, int, int]], holder: str, lease_ms: int, tokens: int
    ) -> tuple[int, bool, int]:
        """One try at a named limit: (ms until the rate windows have room, whether a
        concurrency slot is full, Redis' clock in ms); (0, False, now) when taken."""
        args: list[str | int] = [holder, lease_ms, tokens]
        for _, kind, size, period in windows:
            args += [kind, size, period]
        wait_ms, full, now_ms = await self._take(keys=[w[0] for w in windows], args=args)
        return int(wait_ms), bool(full), int(now_ms)

    async def settle(self, key: str, holder: str, reserved: int, used: int) -> None:
        """Replace a call's reserved tokens with the real count, at its start time."""
        await self._settle(keys=[key], args=[holder, reserved, max(0, used)])

    async def holders(self, slot: Slot) -> int:
        """How many unexpired holders `slot` has now."""
        return int(await self._holders(keys=[slot.key]))


# Who waits on a limit: a sorted set per limit of waiters scored by when they last found it
# full (seconds); `stats` counts those seen in the last WAITING_RECENT_S.
WAITING_RECENT_S = 10.0


def waiting_key(limit: str) -> str:
    return f"{KEY_PREFIX}waiting:{limit}"


async def note_waiting(redis: Redis, limit: str, waiter: str) -> None:
    """Record that `waiter` found `limit` full just now (for `stats`; never fails a job)."""
    key = waiting_key(limit)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {waiter: time.time()})
            pipe.zremrangebyscore(key, "-inf", time.time() - WAITING_RECENT_S)
            pipe.expire(key, int(WAITING_RECENT_S) * 6)
            await pipe.execute()
    except (RedisError, OSError):
        pass


async def usage(
    limiter: Limiter,
    agents: Mapping[str, Concurrency],
    named: Mapping[str, LimitConfig],
) -> list[dict[str, object]]:
    """What each limit holds now and how many wait on it: agent limits (`agents` maps an
    agent to its Concurrency) and named limits."""
    rows: list[dict[str, object]] = []
    since = time.time() - WAITING_RECENT_S
    for agent, (most, per_owner) in sorted(agents.items()):
        if most is None and per_owner is None:
            continue
        slots = agent_slots(agent, "", most, None)
        rows.append(
            {
                "limit": f"agent {agent}",
                "running": await limiter.holders(slots[0]) if slots else None,
                "max_concurrent": most,
                "max_concurrent_per_owner": per_owner,
                "waiting": await limiter.redis.zcount(waiting_key(f"agent:{agent}"), since, "+inf"),
            }
        )
    for name, config in sorted(named.items()):
        windows = config.windows(name)
        running = None
        if config.max_concurrent is not None:
            running = await limiter.holders(Slot(windows[0][0], config.max_concurrent))
        rows.append(
            {
                "limit": name,
                "running": running,
                **{k: v for k, v in vars(config).items() if v is not None},
                "waiting": await limiter.redis.zcount(waiting_key(f"call:{name}"), since, "+inf"),
            }
        )
    return rows


def to_ms(seconds: float) -> int:
    """Seconds as the whole milliseconds a Lua script takes (at least 1)."""
    return max(1, round(seconds * 1000))
