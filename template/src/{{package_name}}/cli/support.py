"""What the admin commands share: settings, one-line errors, tables
(template-owned: copier-agent-worker).

Humans get tables, scripts get `--json`. Bad input is one line on stderr and exit code 2;
a service that cannot be reached is one line and exit code 1. Never a traceback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from ..states import JobState
from .app import options

if TYPE_CHECKING:
    from .. import paid_calls, queries
    from ..settings import Settings

# The command modules import only typer and light modules at their top, and the service's
# modules (the database, Redis, logging and settings stacks) inside each command and the
# helpers here: `--help` and every command load only what they use.

_PACKAGE = __name__.split(".")[0]
T = TypeVar("T")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


# Errors -------------------------------------------------------------------------------------


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_settings(*, service: bool = False, creates: bool = False) -> Settings:
    """The settings, or one line and exit 2; also sets up logging for this command.

    A SQLite file that does not exist is refused (`check_database_file`) unless the command
    `creates` it (`db upgrade`, `dev`).

    A service command (`worker`, `dev`, `web`) logs in `<PREFIX>LOG_FORMAT` (JSON by default)
    from info up. An admin command whose stdout is a terminal prints warnings and errors as
    plain lines (info too with `-v`), unless a log format was set; elsewhere it logs like the
    worker.
    """
    from pydantic import ValidationError

    from ..observe import logs
    from ..settings import (
        ENV_PREFIX,
        SettingsError,
        check_database,
        check_database_file,
        get_settings,
    )

    try:
        settings = get_settings()
        check_database(settings)
        if not creates:
            check_database_file(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ENV_PREFIX + "_".join(str(part) for part in first["loc"]).upper()
        fail(f"setting {where} is invalid: {first['msg']}")
    except SettingsError as exc:
        fail(str(exc))
    verbose, level = options.verbose, logs.LEVELS[settings.log_level]
    if service:
        logs.configure(settings.log_format, logging.DEBUG if verbose else level)
    elif sys.stdout.isatty() and "log_format" not in settings.model_fields_set:
        logs.configure("people", logging.INFO if verbose else max(level, logging.WARNING))
    else:
        logs.configure(settings.log_format, level)
    warn_misspelt()
    return settings


def warn_misspelt() -> None:
    """One warning a variable with the prefix that looks like a misspelt setting: the
    service ignores it, so its setting keeps the default."""
    import structlog

    from ..settings import misspelt_settings

    for variable, meant in misspelt_settings(os.environ):
        structlog.get_logger("settings").warning(
            "setting_misspelt", variable=variable, meant=meant, detail="no setting reads it"
        )


def run(coro: Coroutine[Any, Any, T], settings: Settings, *, service: bool = False) -> T:
    """Run `coro`, turning known failures into one line and an exit code; a service (the
    worker) on the event loop its settings name (`event_loop`)."""
    from ..settings import SettingsError, redact_url

    try:
        runner = event_loop_runner(settings.event_loop) if service else asyncio.run
    except SettingsError as exc:
        coro.close()  # never started (no "never awaited" warning)
        fail(str(exc))
    loaded()
    try:
        return runner(coro)
    except (
        *error_of(".submit", "SubmitError"),
        SettingsError,
        *error_of(".registry", "AgentError"),
    ) as exc:
        fail(str(exc))
    except error_of(".submit", "RecordedNotQueued") as exc:
        typer.echo(exc.job_id)
        fail(str(exc), code=1)
    except error_of(".queue", "QueueMisconfigured") as exc:
        fail(str(exc))
    except error_of(".queue", "QueueUnavailable") as exc:
        fail(str(exc), code=1)
    except (
        *error_of("sqlalchemy.exc", "DBAPIError"),
        OSError,
        *error_of("redis.exceptions", "RedisError"),
    ) as exc:
        if isinstance(exc, error_of("sqlalchemy.exc", "DBAPIError")):
            problem = schema_problem(settings)  # a missing table reads as out of reach
            if problem is not None:
                fail(problem)
        fail(
            f"cannot reach the database or Redis ({redact_url(settings.database_url)}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            code=1,
        )


def schema_problem(settings: Settings) -> str | None:
    """What the database lacks of the schema this code needs, or that it refuses writes
    (schema.check_schema); None when it lacks nothing or cannot be reached."""
    from ..db import create_engine
    from ..schema import ReadOnlyDatabase, SchemaBehind, check_schema

    async def check() -> str | None:
        engine = create_engine(settings)
        try:
            await check_schema(engine, settings.database_url)
        except (SchemaBehind, ReadOnlyDatabase) as exc:
            return str(exc)
        finally:
            await engine.dispose()
        return None

    try:
        return asyncio.run(check())
    except Exception:  # noqa: BLE001 - out of reach: the caller says so in its own words
        return None


def error_of(module: str, name: str) -> tuple[Any, ...]:
    """The exception class `name` of `module` (".queue": this package's) when the command has
    loaded that module, else none: an error of a module not loaded cannot have been raised,
    and catching it must not load its stack (redis-py for `jobs list`, say)."""
    loaded = sys.modules.get(_PACKAGE + module if module.startswith(".") else module)
    return () if loaded is None else (getattr(loaded, name),)


def loaded() -> None:
    """The command has loaded what it runs on: turn the garbage collector back on if `main`
    turned it off, with what loading made set aside (`gc.freeze`), so that no collection
    walks those long-lived objects again. Where the collector is on (tests running commands
    in-process), this leaves it alone."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def event_loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, T]], T]:
    """`asyncio.run`, or `uvloop.run` when `choice` is "uvloop", or "auto" and it imports;
    SettingsError when "uvloop" does not."""
    from ..settings import ENV_PREFIX, SettingsError

    if choice == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SettingsError(
                f"{ENV_PREFIX}EVENT_LOOP is uvloop but uvloop is not installed; install it "
                "(pip install uvloop) or set auto"
            ) from None
        return asyncio.run
    return uvloop.run


def parse_state(state: str | None) -> JobState | None:
    if state is None:
        return None
    try:
        return JobState(state)
    except ValueError:
        fail(f"unknown state {state!r}; states: {', '.join(s.value for s in JobState)}")


# Database reads and progress ------------------------------------------------------------------


async def with_conn(settings: Settings, read: Callable[[Any], Awaitable[T]]) -> T:
    from ..db import create_engine

    engine = create_engine(settings)
    try:
        async with engine.connect() as conn:
            return await read(conn)
    finally:
        await engine.dispose()


@contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal for long runs; silent otherwise."""
    if total < 20 or not sys.stderr.isatty():
        yield lambda _n: None
        return
    with typer.progressbar(length=total, label=label, file=sys.stderr) as bar:
        yield bar.update


# Output helpers ---------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest cell. On a terminal each line is cut to its width,
    ending in "…" (the last column, a free text, is what goes); piped, every character."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    fit = shutil.get_terminal_size().columns if sys.stdout.isatty() else None

    def line(cells: Sequence[str]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        text = "  ".join(padded).rstrip()
        return text if fit is None or len(text) <= fit else text[: fit - 1] + "…"

    typer.echo(line(headers))
    typer.echo(line(["-" * w for w in widths]))
    for row in rows:
        typer.echo(line(row))
    if not rows:
        typer.echo("(none)")


def short_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def attempt_dict(
    attempt: queries.Attempt | queries.Delivery | paid_calls.PaidCall,
) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in attempt.__dict__.items()}
