"""`db upgrade`: create or upgrade the job tables and seed the answered caps
(template-owned: copier-agent-worker)."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Annotated

import typer

from .app import app, options
from .support import fail, load_settings, schema_problem

if TYPE_CHECKING:
    from ..settings import Settings

# Each command imports the service's modules it uses when it runs (support.py says why).

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Option(help="Target revision.")] = "heads",
) -> None:
    """Create or upgrade the job tables (Alembic); one line says what changed (each
    migration step too with -v)."""
    from sqlalchemy.exc import SQLAlchemyError

    from .. import spend
    from ..settings import redact_url

    settings = load_settings(creates=True)
    steps = _StepCounter()
    migration_log = logging.getLogger("alembic.runtime.migration")
    migration_log.setLevel(logging.INFO)
    migration_log.propagate = options.verbose
    migration_log.addHandler(steps)
    where = redact_url(settings.database_url)
    try:
        unknown = migrate_or_refuse(settings, revision)
        seeded = asyncio.run(seed_caps(settings))
    except (SQLAlchemyError, OSError) as exc:
        fail(f"database upgrade failed on {where}: {upgrade_failure(exc)}", code=1)
    finally:
        migration_log.removeHandler(steps)
    if unknown is not None:  # as a worker of this code would, it runs on a newer schema
        typer.echo(
            f"database at {where} is at {unknown}, a revision this code does not know (a newer "
            "release applied it): nothing to apply"
        )
    else:
        done = f"applied {steps.count} migrations" if steps.count else "nothing to apply"
        typer.echo(f"database at {where} is at {revision}: {done}")
    for agent in seeded:
        typer.echo(
            f"seeded the daily spend cap of {spend.cap_label(agent)} from the template answers"
        )


def migrate_or_refuse(settings: Settings, revision: str = "heads") -> str | None:
    """Apply the migrations up to `revision`; on a database a newer release upgraded (a
    revision this code does not know, with the job tables), apply nothing and return that
    revision, as a worker of this code runs on it. Another application's Alembic history, or
    a `revision` this code does not have, is one line and exit 2."""
    from alembic.util import CommandError

    from ..db import migrate

    try:
        migrate(settings, revision)
    except CommandError as exc:
        unknown = unknown_revision(exc)
        if unknown is None:
            raise
        if unknown == revision:
            fail(f"--revision {revision} is not a revision of this code's migrations")
        problem = schema_problem(settings)  # another application's history, or None
        if problem is not None:
            fail(problem)
        return unknown
    return None


def unknown_revision(exc: BaseException) -> str | None:
    """The revision Alembic could not find among this code's migrations, if that is what
    `exc` says.

    >>> unknown_revision(Exception("Can't locate revision identified by '0016_next'"))
    '0016_next'
    """
    found = re.match(r"Can't locate revision identified by '([^']+)'", str(exc))
    return found.group(1) if found else None


def upgrade_failure(exc: BaseException) -> str:
    """The first line of what the database said, without SQLAlchemy's wrapper class, and what
    to do about the refusal met first on PostgreSQL 15 and later, where an ordinary role may
    no longer create tables in `public`.

    >>> upgrade_failure(OSError("(sqlalchemy.dialects.postgresql.asyncpg.ProgrammingError) "
    ...     "<class 'asyncpg.exceptions.InsufficientPrivilegeError'>: permission denied for "
    ...     "schema public\\n[SQL: ...]"))[:73]
    'permission denied for schema public; the role needs CREATE on that schema'
    """
    lines = str(exc).splitlines()
    said = re.sub(r"^\([\w.]+\) (<class '[\w.]+'>: )?", "", lines[0] if lines else repr(exc))
    if said.startswith("permission denied for schema"):
        said += (
            "; the role needs CREATE on that schema (GRANT CREATE ON SCHEMA public TO <role>: "
            "PostgreSQL 15 no longer grants it to every role), or a schema of its own "
            "(DATABASE_URL ...?options=-csearch_path%3D<schema>)"
        )
    return said


class _StepCounter(logging.Handler):
    """Counts Alembic's "Running upgrade" records, which are not shown without -v."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Running upgrade"):
            self.count += 1


async def seed_caps(settings: Settings) -> list[str]:
    """Seed the answered spend caps for agents that have no cap row yet."""
    from .. import catalog, spend
    from ..db import create_engine

    engine = create_engine(settings)
    try:
        return await spend.seed_caps(engine, catalog.answered_caps())
    finally:
        await engine.dispose()
