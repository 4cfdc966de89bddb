"""What an agent raises to say how its job ends, short of returning a result
(template-owned: copier-agent-worker).

Each error names one fate the runner gives the job (runner.decide); they are also importable
from `agent`, the contract agent modules read. Any other exception is retried with backoff
until the job's attempts run out.
"""

from __future__ import annotations

__all__ = ["GiveUp", "InvalidPayload", "RateLimited", "RetryLater"]


class GiveUp(Exception):
    """Raise from an agent to fail the job permanently: it is never retried automatically."""


class InvalidPayload(ValueError):
    """The job's payload cannot be processed as given; retrying will not help."""


class RetryLater(Exception):
    """Raise from an agent to try again after `after_s` seconds (counts as an attempt)."""

    def __init__(self, after_s: float, reason: str = "") -> None:
        if after_s < 0:
            raise ValueError("after_s must be zero or more seconds")
        super().__init__(reason or f"retry requested in {after_s:g}s")
        self.after_s = after_s


class RateLimited(Exception):
    """Raise from an agent when an upstream limit is hit: the job waits `after_s` seconds in
    `queued` and runs again, using no attempt (a bound turns endless waiting into a dead
    letter, see the setting MAX_DEFERRALS). `upstream.retry_after_s` reads the wait from a
    provider's 429."""

    def __init__(self, after_s: float, reason: str = "") -> None:
        if after_s < 0:
            raise ValueError("after_s must be zero or more seconds")
        super().__init__(reason or f"rate limited; wait {after_s:g}s")
        self.after_s = after_s
