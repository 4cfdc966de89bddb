"""Structured logging: one event per line, UTC timestamps (template-owned).

Never log a credentialed URL: pass it through `settings.redact_url` first.

Two renderings: JSON (or structlog's console format) for the worker and for anything whose
output is collected, and plain lines for a person at a terminal (`for_people`), which an
admin command gets when its stdout is a terminal and no format was asked for.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

Format = Literal["json", "console", "people"]
# arq logs two lines per job (start, end) and one health line per minute, at info; the
# runner's own lines say what a person needs, so arq's are shown from warning up unless
# debug logs were asked for. The model SDKs' HTTP clients (httpx, httpx2) log every request
# at info; the paid calls are in the job's own records, so those are quiet too. Alembic logs
# its plugin set-up and every migration step at info: `db upgrade` prints a one-line summary
# instead (the steps with -v), and a worker or `dev` shows them with debug logs.
QUIET_LOGGERS = ("arq", "httpx", "httpx2", "alembic")


def configure(fmt: Format = "json", level: int = logging.INFO) -> None:
    """Route structlog and the standard library (arq, alembic) to stderr in one format."""
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = for_people
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    final: list[structlog.typing.Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta
    ]
    if fmt == "people":
        final.append(structlog.processors.format_exc_info)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[*final, renderer])
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)


def for_people(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
    """One plain line per record for a terminal: level, event, then the other keys.

    >>> for_people(None, "warning", {"event": "lease_lost", "level": "warning",
    ...     "timestamp": "2026-01-01T00:00:00Z", "logger": "runner", "job_id": "ab12"})
    'warning: lease_lost (job_id=ab12)'
    """
    level = event.pop("level", "info")
    text = str(event.pop("event", ""))
    trace = event.pop("exception", None)
    for key in ("timestamp", "logger"):
        event.pop(key, None)
    details = " ".join(f"{key}={value}" for key, value in event.items())
    line = f"{level}: {text}" + (f" ({details})" if details else "")
    return f"{line}\n{trace}" if trace else line
