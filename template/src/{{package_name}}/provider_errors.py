"""How a model provider's error is read: was it billed, and what happens next
(template-owned: copier-agent-worker).

The service never imports an SDK: it reads an error by its HTTP status (`status_code`, or
`response.status_code`) and by the names of its classes and causes, so the same rules serve
the `openai` and `anthropic` SDKs, Pydantic AI's `ModelHTTPError`, httpx and anything built
on them. `read(exc)` returns a `Verdict`, or None when the error says nothing about billing
(then a paid call in flight is `in_doubt`).

| error                                            | billed? | the job                          |
|--------------------------------------------------|---------|----------------------------------|
| 429 rate limit; 529 overloaded (Anthropic)       | no      | waits Retry-After, no attempt    |
| 400, 401, 402, 403, 404, 413, 422                | no      | fails at once, provider's message |
| 408, 409, 500, 502, 503                          | no      | retried with backoff             |
| never connected (refused, DNS, connect timeout)  | no      | retried with backoff             |
| 504, 524, other 5xx; timeout or reset after send | maybe   | `in_doubt` (a paid call)         |

Why 5xx splits: OpenAI and Anthropic answer 500/502/503 (and Anthropic 529) with an error
body and no usage; they bill what they report in `usage`, and an answered error has none. A
504 or 524 is a gateway that stopped waiting: the model behind it may still have run and
billed, so it is treated like a timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .limits.upstream import retry_after_s

# Rejected before any work: retrying the same request cannot succeed.
PERMANENT_STATUSES = frozenset({400, 401, 402, 403, 404, 413, 422})
# Asked to slow down: wait (Retry-After) without using an attempt.
RATE_LIMIT_STATUSES = frozenset({429, 529})
# Answered with an error body and no usage: not billed, worth another try.
RETRYABLE_STATUSES = frozenset({408, 409, 500, 502, 503})
# Class names (anywhere in an error's cause chain) of a request that never reached the
# provider: httpx / httpcore connect errors, the OS refusing or failing to resolve.
NEVER_SENT = frozenset(
    {"ConnectError", "ConnectTimeout", "ConnectionRefusedError", "gaierror", "PoolTimeout"}
)
# Class names of a request sent, then lost: it may have been billed.
LOST_AFTER_SENDING = frozenset(
    {"APITimeoutError", "ReadTimeout", "WriteTimeout", "ReadError", "RemoteProtocolError"}
)


@dataclass(frozen=True)
class Verdict:
    """What a provider's error means for money and for the job.

    `next` is "wait" (a rate limit: back to the queue, no attempt used), "fail" (permanent)
    or "retry" (backoff, an attempt used); `after_s` is the wait the provider named, if any.
    """

    status: int | None
    next: Literal["wait", "fail", "retry"]
    after_s: float | None = None


def read(exc: BaseException) -> Verdict | None:
    """The verdict on `exc`, or None when it may have been billed (or is not a provider's).

    >>> class RateLimitError(Exception):
    ...     status_code = 429
    ...     headers = {"retry-after": "2"}
    >>> read(RateLimitError())
    Verdict(status=429, next='wait', after_s=2.0)
    >>> class BadRequestError(Exception):
    ...     status_code = 400
    >>> read(BadRequestError()).next
    'fail'
    >>> class GatewayTimeout(Exception):
    ...     status_code = 504
    >>> read(GatewayTimeout()) is None
    True
    >>> read(ConnectionRefusedError()).next
    'retry'
    """
    status = status_of(exc)
    if status in RATE_LIMIT_STATUSES:
        return Verdict(status, "wait", retry_after_s(exc))
    if status in PERMANENT_STATUSES:
        return Verdict(status, "fail")
    if status in RETRYABLE_STATUSES:
        return Verdict(status, "retry")
    if status is None and never_sent(exc):
        return Verdict(None, "retry")
    return None


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (`status_code`, or its response's)."""
    for source in (exc, getattr(exc, "response", None)):
        status = getattr(source, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def never_sent(exc: BaseException) -> bool:
    """Whether the error shows the request never reached the provider: a connect error
    somewhere in its cause chain, and no sign of a request lost after sending."""
    names = {name for error in _chain(exc) for name in _class_names(error)}
    return bool(names & NEVER_SENT) and not (names & LOST_AFTER_SENDING - {"APITimeoutError"})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _class_names(error: BaseException) -> Iterator[str]:
    return (cls.__name__ for cls in type(error).__mro__)
