"""Named limits inside a job: `ctx.limit(...)` and `ctx.paid_call(..., limit=...)` wait for a
place under a limit of the answer `limits` (template-owned: copier-agent-worker).

Each call counts: a job making three model calls counts three requests. A wait longer than
what the job has left raises `RateLimited`, which puts the job back in the queue without
using an attempt.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from ..errors import RateLimited
from .limiter import Grant, LimitConfig, Limiter, Slot, note_waiting, to_ms

# A call waiting for a full concurrency slot looks again after the first value times the
# number of looks so far, up to the second (with jitter).
SLOT_POLL_S = (0.02, 0.5)
# Told "<kind>:<name>" each time a job (kind agent) or a call (kind call) finds its limit full.
WaitObserver = Callable[[str], None]


class CallLimits:
    """The named limits (catalog.LIMITS) as one worker uses them: wait, take, release."""

    def __init__(
        self,
        limiter: Limiter,
        configs: Mapping[str, LimitConfig],
        on_wait: WaitObserver | None = None,
    ) -> None:
        self.limiter = limiter
        self.configs = dict(configs)
        self.on_wait = on_wait

    @asynccontextmanager
    async def hold(
        self, name: str, *, tokens: int = 0, left_s: float | None = None
    ) -> AsyncIterator[Grant]:
        """Wait for a place under limit `name` (concurrency slot and rate windows), then hold
        it for the block. A wait longer than `left_s` (what the job has left) raises
        `RateLimited`, which puts the job back in the queue without using an attempt."""
        config = self.configs.get(name)
        if config is None:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ValueError(f"no limit named {name!r}; the limits are: {known}")
        most = config.tokens_per_minute
        if tokens < 0 or (most is not None and tokens > most):
            raise ValueError(
                f"tokens={tokens} can never fit limit {name!r} "
                f"(tokens_per_minute {config.tokens_per_minute})"
            )
        windows = config.windows(name)
        holder = secrets.token_hex(8)
        lease_ms = to_ms(left_s if left_s is not None else 3600)
        waited = 0.0
        loop = asyncio.get_running_loop()
        began = loop.time()
        polls = 0
        while True:
            wait_ms, full, now_ms = await self.limiter.take(windows, holder, lease_ms, tokens)
            if wait_ms == 0 and not full:
                break
            polls += 0 if wait_ms else 1
            wait_s = pause_s(wait_ms, polls, random.random())
            if polls <= 1:
                await note_waiting(self.limiter.redis, f"call:{name}", holder)
            if waited == 0.0 and self.on_wait is not None:
                self.on_wait(f"call:{name}")  # once per call that had to wait
            if left_s is not None and (loop.time() - began) + wait_s > left_s:
                raise RateLimited(
                    after_s=wait_s,
                    reason=f"limit {name!r} is full for {wait_s:.1f}s, more than the job has left",
                )
            await asyncio.sleep(wait_s)
            waited = loop.time() - began
        grant = Grant(name, tokens, now_ms, waited)
        try:
            yield grant
        finally:
            concurrency = [Slot(key, size) for key, kind, size, _ in windows if kind == "c"]
            if concurrency:
                await self.limiter.release(concurrency, holder)
            if grant.tokens_used is not None and config.tokens_per_minute is not None:
                key = next(key for key, kind, _, _ in windows if kind == "t")
                await self.limiter.settle(key, holder, tokens, grant.tokens_used)


def pause_s(wait_ms: int, polls: int, jitter: float) -> float:
    """How long a call waits before it looks again: the wait the rate windows name (plus up
    to 10 %), or, for a full concurrency slot, a poll that grows with each look (±20 %).

    >>> pause_s(1000, 0, 0.0), pause_s(0, 1, 0.5) == SLOT_POLL_S[0]
    (1.0, True)
    """
    if wait_ms:  # the rate windows name the wait exactly
        return wait_ms / 1000 * (1 + 0.1 * jitter)
    # a full slot frees when a call ends: look again soon
    return min(SLOT_POLL_S[1], SLOT_POLL_S[0] * polls) * (0.8 + 0.4 * jitter)
