"""An upstream's "too many requests", as the runner understands it (template-owned:
copier-agent-worker).

Raise `RateLimited(after_s=...)` (errors.py; also importable from `agent`) from an agent when a
provider answers 429: the job goes back to `queued` for `after_s` seconds **without using an
attempt**. `retry_after_s(error)` reads the wait from the error's HTTP headers, as the common
HTTP and model SDKs expose them (`error.response.headers` or `error.headers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from ..errors import RateLimited

__all__ = ["RateLimited", "retry_after_s"]  # RateLimited lives in errors.py


# OpenAI-style durations: "1s", "6m0s", "20ms", "1h2m3.5s".
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Headers that give a wait, most specific first.
_RESET_HEADERS = (
    "retry-after-ms",
    "retry-after",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-reset",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)


def retry_after_s(
    error_or_headers: BaseException | Mapping[str, str], *, now: datetime | None = None
) -> float | None:
    """The wait an upstream asked for, in seconds, or None when it named none.

    >>> retry_after_s({"Retry-After": "7"})
    7.0
    >>> retry_after_s({"x-ratelimit-reset-requests": "6m0s"})
    360.0
    >>> retry_after_s({"retry-after-ms": "250"})
    0.25
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> retry_after_s({"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z"}, now=at)
    30.0
    >>> retry_after_s({"content-type": "application/json"}) is None
    True
    """
    headers = _headers_of(error_or_headers)
    if not headers:
        return None
    lowered = {str(key).lower(): str(value).strip() for key, value in headers.items()}
    for name in _RESET_HEADERS:
        value = lowered.get(name)
        if value:
            wait = _parse_wait(name, value, now or datetime.now(UTC))
            if wait is not None:
                return max(wait, 0.0)
    return None


def _headers_of(source: BaseException | Mapping[str, str]) -> Mapping[str, Any] | None:
    if isinstance(source, Mapping):
        return source
    response = getattr(source, "response", None)
    headers = getattr(response, "headers", None) or getattr(source, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "items") else None


def _parse_wait(name: str, value: str, now: datetime) -> float | None:
    if name == "retry-after-ms":
        return _number(value, 0.001)
    seconds = _number(value, 1.0)
    if seconds is not None:
        # x-ratelimit-reset may be an epoch time rather than a wait.
        return seconds - now.timestamp() if seconds > 1_000_000_000 else seconds
    parts = _DURATION.findall(value)
    if parts and "".join(n + u for n, u in parts) == value.replace(" ", ""):
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    moment = _moment(value)
    return (moment - now).total_seconds() if moment is not None else None


def _number(value: str, unit: float) -> float | None:
    try:
        return float(value) * unit
    except ValueError:
        return None


def _moment(value: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
