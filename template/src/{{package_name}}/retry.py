"""Retry rules: capped exponential backoff with jitter; permanent vs retryable errors
(template-owned: copier-agent-worker).

The database's attempt count is the authority (arq's counters vanish with Redis). A job may
run `max_attempts` times; after the last failure it is dead-lettered.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from pydantic import ValidationError

from .errors import GiveUp, InvalidPayload

__all__ = ["PERMANENT_ERRORS", "InvalidPayload", "RetryPolicy", "backoff", "is_permanent"]


# Errors that fail a job at once. Agents add their own with a module-level
# PERMANENT_ERRORS = (MyBadInputError, ...).
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    GiveUp,
    InvalidPayload,
    ValidationError,
    json.JSONDecodeError,
)


def backoff(attempt: int, base_s: float, max_s: float) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based), before jitter.

    >>> [backoff(n, base_s=2, max_s=30) for n in range(1, 7)]
    [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    """
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    return float(min(base_s * 2 ** (attempt - 1), max_s))


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again, and how long to wait."""

    max_attempts: int
    base_s: float
    max_s: float
    jitter: float = 0.5  # the share of each delay that is randomised
    max_deferrals: int = 100  # RateLimited deferrals of one job before it is dead-lettered

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait after failed attempt `attempt`, with "equal jitter": between
        (1 - jitter) and 1 times the backoff, so concurrent failures spread out.

        >>> policy = RetryPolicy(max_attempts=5, base_s=2, max_s=30)
        >>> 4 * 0.5 <= policy.delay(2, random.Random(7)) <= 4
        True
        """
        full = backoff(attempt, self.base_s, self.max_s)
        return full * (1 - self.jitter) + full * self.jitter * (rng or random).random()

    def exhausted(self, attempt: int, max_attempts: int | None = None) -> bool:
        """Whether attempt number `attempt` was the last one allowed.

        >>> RetryPolicy(max_attempts=3, base_s=1, max_s=1).exhausted(3)
        True
        """
        return attempt >= (max_attempts or self.max_attempts)


def is_permanent(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether `exc` should fail the job at once rather than be retried.

    >>> is_permanent(GiveUp("no text")), is_permanent(TimeoutError())
    (True, False)
    """
    return isinstance(exc, PERMANENT_ERRORS + extra)
