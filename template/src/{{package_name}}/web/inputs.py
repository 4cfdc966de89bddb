"""Reading what a caller sent, for the API and the console alike (template-owned:
copier-agent-worker).

Each reader refuses with an `InputError`: the HTTP status and one sentence that names the
field and what it takes. The API answers it as `{"error": ...}`, the console shows it on
the page. Numbers and money go through the CLI's own parsers (`spend.parse_usd`), bounds
and all, so the three doors refuse the same things.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .. import actions, spend
from ..states import JobState
from ..submit import nul_refused
from . import bodies

Body = TypeVar("Body", bound=BaseModel)


class InputError(Exception):
    """A refused request: its HTTP status and one sentence saying what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def refuse_nul(items: Iterable[tuple[str, Any]], what: str) -> None:
    """Refuse (400) a NUL character in any value of `items` (name, value: a string, or a list
    of them), `what` saying where they came from ("query parameter", "field"): PostgreSQL's
    text columns cannot hold one, so a filter or a write with it failed as a 500.

    >>> refuse_nul([("owner", "team-a"), ("job_ids", ["a", "b"])], "field")
    >>> try:
    ...     refuse_nul([("owner", "team\\x00a")], "query parameter")
    ... except InputError as exc:
    ...     print(exc.status, exc.message)
    400 query parameter "owner" holds a NUL character (\\u0000); remove it
    """
    for name, value in items:
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and "\x00" in text for text in texts):
            raise InputError(400, nul_refused(f'{what} "{name}"'))


def checked(model: type[Body], body: Any) -> Body:
    """`body` read by its model (bodies.py), the one the OpenAPI document shows: what the
    hand-written checks before it let through is held to the document too. The sentence
    names the field, e.g. `"usd": String should match pattern ...` for "1e2".
    """
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if not _union_tag(part))
        raise InputError(400, f'"{where}": {first["msg"]}' if where else first["msg"]) from None


def _union_tag(part: object) -> bool:
    """A location step that names a union member (e.g. 'ReplayByIds'), not a field."""
    return isinstance(part, str) and part[:1].isupper()


def parse_state(text: str | None) -> JobState | None:
    """A job state from a query string; absent is None, empty is refused."""
    if text is None:
        return None
    try:
        return JobState(text)
    except ValueError:
        raise InputError(
            400, f"unknown state {text!r}; states: {', '.join(s.value for s in JobState)}"
        ) from None


def parse_limit(text: str | None, most: int = bodies.MAX_LIST) -> int:
    """How many rows a listing returns: 50 when absent, else 1 to `most`."""
    if text is None:
        return 50
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not 1 <= int(text) <= most:
        raise InputError(400, f"limit must be a whole number from 1 to {most} (got {text!r})")
    return int(text)


def parse_after(request: Any) -> int:
    """The seq of the last event a client saw: its Last-Event-ID header (what EventSource
    sends when it reconnects), else `after`, else 0. Each, when given, must be a whole number
    from 0 to bodies.SEQ_MAX."""
    header = _seq(request.headers.get("last-event-id"), "the Last-Event-ID header")
    query = _seq(request.query_params.get("after"), "after")
    return header if header is not None else query or 0


def _seq(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > bodies.SEQ_MAX:
        raise InputError(
            400, f"{what} must be a whole number from 0 to {bodies.SEQ_MAX} (got {text!r})"
        )
    return int(text)


def blank(text: str | None) -> bool:
    """No character but whitespace (bodies.BLANK, the set the document's pattern uses)."""
    return text is None or re.search(bodies.NON_BLANK, text) is None


def parse_count(limit: Any) -> int:
    """The "limit" of a replay or resolve by cause: 1 to MAX_BATCH jobs (418.0 is 418, as
    JSON Schema reads it)."""
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= bodies.MAX_BATCH:
        raise InputError(
            400, f'"limit" must be a whole number of jobs from 1 to {bodies.MAX_BATCH}'
        )
    return limit


def optional_str(body: dict[str, Any], name: str, most: int) -> str | None:
    """A string field that may be absent (or null), at most `most` characters."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > most:
        raise InputError(400, f'"{name}" must be a string of at most {most} characters')
    return value


def parse_cap(body: dict[str, Any]) -> tuple[str, Decimal]:
    """(agent, amount) of a cap change. Money is never a float; the rules are the CLI's
    (`actions.cap_target`, `spend.parse_usd`)."""
    agent, usd = body.get("agent"), body.get("usd")
    if not isinstance(agent, str):
        raise InputError(400, '"agent" must be the name of a paid agent, or "*" for the global cap')
    if not isinstance(usd, str):
        raise InputError(400, '"usd" must be a string like "25.00" (never a float)')
    try:
        target, amount = actions.cap_target(agent), spend.parse_usd(usd, field='"usd"')
    except spend.CapChangeRefused as exc:
        raise InputError(400, str(exc)) from None
    checked(bodies.SetCap, {k: v for k, v in body.items() if v is not None})
    return target, amount
