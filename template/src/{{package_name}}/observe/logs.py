"""Structured logging: one event per line, UTC timestamps (template-owned).

Never log a credentialed URL: pass it through `settings.redact_url` first.

Two renderings: JSON (or structlog's console format) for the worker and for anything whose
output is collected, and plain lines for a person at a terminal (`for_people`), which an
admin command gets when its stdout is a terminal and no format was asked for.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from structlog.typing import EventDict

Format = Literal["json", "console", "people"]
# arq logs two lines per job (start, end) and one health line per minute, at info; the
# runner's own lines say what a person needs, so arq's are shown from warning up unless
# debug logs were asked for. The model SDKs' HTTP clients (httpx, httpx2) log every request
# at info; the paid calls are in the job's own records, so those are quiet too. Alembic logs
# its plugin set-up and every migration step at info: `db upgrade` prints a one-line summary
# instead (the steps with -v), and a worker or `dev` shows them with debug logs.
QUIET_LOGGERS = ("arq", "httpx", "httpx2", "alembic")


# structlog's method names, by level (a `debug` call below the configured level is dropped).
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


@dataclass
class _Output:
    """What the last `configure` chose. Read per event, so a later `configure` (a command
    run in-process, a test) also applies to the loggers already in use."""

    level: int = logging.INFO
    render: structlog.typing.Processor = field(default_factory=structlog.processors.JSONRenderer)


_output = _Output()


def configure(fmt: Format = "json", level: int = logging.INFO) -> None:
    """Route structlog and the standard library (arq, alembic) to stderr in one format.

    The service's own events are rendered by structlog and written to stderr directly, a
    third of the time they took through the standard library's logging; the standard
    library's records (arq, alembic, the SDKs' HTTP clients) go through its handler, rendered
    the same way. Tracebacks are written as text: `exception` in JSON, plain (no local
    variables, which may hold secrets) in the console format.
    """
    renderer: structlog.typing.Processor
    tracebacks: list[structlog.typing.Processor] = [structlog.processors.format_exc_info]
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
        tracebacks = []  # the console renderer writes them itself
    else:
        renderer = for_people
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    chain = [*tracebacks, renderer]
    _output.level, _output.render = level, functools.partial(_rendered, chain)
    structlog.configure(
        processors=[_below_level, *shared, _render],
        logger_factory=_Stderr,
        # Every level's method, `exception` included; the level is `_below_level`'s to check.
        wrapper_class=_BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *chain],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)


class _BoundLogger(structlog.make_filtering_bound_logger(logging.DEBUG)):  # type: ignore[misc]
    """structlog's logger with every level's method (`_below_level` drops what is below the
    configured level, so that a later `configure` also applies to the loggers in use), but
    whose `debug` and `info` return at once below it, before the event is built: the runner
    and the agents log a debug line or two a job, which cost the worker about 9 µs a job to
    drop, and the runner an info line a job, which `LOG_LEVEL=warning` drops (docs/SCALING.md)."""

    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        if _output.level > logging.DEBUG:
            return None
        return super().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        if _output.level > logging.INFO:
            return None
        return super().info(event, *args, **kw)


def _below_level(_logger: Any, method: str, event: EventDict) -> EventDict:
    if LEVELS.get(method, logging.INFO) < _output.level:
        raise structlog.DropEvent
    return event


def _render(logger: Any, method: str, event: EventDict) -> Any:
    return _output.render(logger, method, event)


def _rendered(
    chain: list[structlog.typing.Processor], logger: Any, method: str, event: EventDict
) -> Any:
    value: Any = event
    for processor in chain:
        value = processor(logger, method, value)
    return value


class _Stderr:
    """structlog's logger: each rendered event as one line on stderr (the one current at
    the time, so a captured or replaced stderr gets it)."""

    _lock = threading.Lock()

    def __init__(self, name: str = "") -> None:
        self.name = name  # what `add_logger_name` writes as "logger"

    def msg(self, message: str) -> None:
        with self._lock:
            stream = sys.stderr
            stream.write(message + "\n")
            stream.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


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
