"""Database engine and transactions (template-owned: copier-agent-worker)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .settings import Settings, async_database_url, check_database, postgres_dsn

MIGRATIONS = Path(__file__).parent / "migrations"
# Connections a worker's engine keeps open at most (SQLAlchemy may open 10 more at a peak).
POOL_SIZE_MAX = 10


def create_engine(settings: Settings) -> AsyncEngine:
    """An async engine for `settings.database_url`, with SQLite tuned for several processes,
    carrying the service's webhooks (if any) to every transaction that settles a job.

    Its errors name no bound value (`hide_parameters`): a failed write's message, which the
    service logs, carried the row's payload, result and error text along with the SQL."""
    check_database(settings)
    url = async_database_url(settings.database_url)
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
    else:
        # Bounded whatever max_jobs is (up to 500 by default): a job that touches the
        # database waits its turn for a connection rather than each worker opening hundreds.
        pool_size = min(max(5, settings.max_jobs), POOL_SIZE_MAX)
        engine = create_async_engine(
            POSTGRES,
            hide_parameters=True,
            pool_size=pool_size,
            # Behind a pooler a server connection can die unseen by ours: ping it there.
            pool_pre_ping=settings.database_pooling == "transaction",
            connect_args=postgres_connect_args(settings.database_pooling, settings.database_url),
        )
        event.listen(engine.sync_engine, "checkout", replace_closed)
    if not settings.webhooks:
        return engine
    from . import catalog, webhooks  # only a service with webhooks imports them here

    return webhooks.attach(engine, webhooks.from_settings(settings, catalog.AGENTS))


def replace_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Hand out no pooled connection the server (or a pooler) has closed: the pool opens a
    new one instead. No round trip: asyncpg sees the server close the socket as it happens.

    On a direct connection this stands in for SQLAlchemy's `pool_pre_ping`, which with
    asyncpg costs three round trips on every checkout (BEGIN, a query, ROLLBACK): three of
    the five a one-job submit made. What only a ping would find, a connection whose network
    path died without a word, fails its first statement and is then discarded, as one that
    dies mid-transaction is. Behind a pooler (`DATABASE_POOLING=transaction`) the engine
    pings as well: there a dead server connection does not close ours, and the pooler
    only tells the next query ("server conn crashed?").
    """
    raw = getattr(dbapi_connection, "_connection", None)  # asyncpg's Connection
    if raw is not None and raw.is_closed():
        raise exc.DisconnectionError("the database closed this pooled connection")


@asynccontextmanager
async def one_statement(engine: AsyncEngine, pooling: str) -> AsyncIterator[AsyncConnection]:
    """A connection whose statements each commit on their own: no BEGIN and COMMIT round
    trips around a write that is one statement (a job's INSERT).

    Behind a pooler in transaction mode (`pooling == "transaction"`) it is a transaction
    after all: an unnamed statement's prepare and execute must reach the same server
    connection, which the pooler only promises within a transaction.
    """
    if pooling == "transaction":
        async with engine.begin() as conn:
            yield conn
        return
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")


# What SQLAlchemy is given for PostgreSQL: the driver alone. asyncpg reads the address and its
# options from the DATABASE_URL itself (`postgres_connect_args`), as libpq would: SQLAlchemy
# would hand each query parameter to asyncpg as a keyword, and asyncpg takes none of libpq's
# (`?sslmode=require`, what every managed PostgreSQL gives, failed every command).
POSTGRES = "postgresql+asyncpg://"


def postgres_connect_args(pooling: str, database_url: str) -> dict[str, Any]:
    """asyncpg's options for `database_url`: the URL itself, which asyncpg reads as libpq
    does (`settings.postgres_dsn`), and for a database behind a pooler that lends a server
    connection per transaction (`<PREFIX>DATABASE_POOLING=transaction`: PgBouncer's
    pool_mode = transaction), no cached or named statement.

    asyncpg names and caches every prepared statement on its connection by default; behind
    such a pooler the next transaction may run on another server connection, where the name
    is unknown or already taken ("prepared statement __asyncpg_stmt_1__ already exists").
    So nothing is cached, and every statement is PostgreSQL's unnamed one, which the next
    replaces: none outlives the transaction that prepared it, and none piles up on a server.
    Every statement the service sends through SQLAlchemy runs inside a transaction, so it
    is prepared and run on the one server connection that transaction holds.
    """
    dsn = {"dsn": postgres_dsn(database_url)}
    if pooling != "transaction":
        return dsn
    return {
        **dsn,
        "statement_cache_size": 0,  # asyncpg's own cache
        "prepared_statement_cache_size": 0,  # SQLAlchemy's
        "prepared_statement_name_func": _unnamed,
    }


def _unnamed() -> str:
    return ""


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers run beside the one writer; busy_timeout makes writers wait their turn.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One transaction: committed when the block ends, rolled back when it raises."""
    async with engine.begin() as conn:
        yield conn


def alembic_config(database_url: str | None = None) -> Any:
    """The Alembic configuration of this service's migrations (an `alembic.config.Config`).

    Two version locations, one per owner, so `copier update` never collides with your work:
    migrations/versions/ holds the template's revisions (branch `template`), migrations/user/
    yours (branch `user`, each depending on the template head it was written against).
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # Both separator names: Alembic 1.16+ reads path_separator, older versions the other.
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_path_separator", "os")
    config.set_main_option(
        "version_locations",
        os.pathsep.join(str(MIGRATIONS / name) for name in ("versions", "user")),
    )
    if database_url is not None:
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def migrate(settings: Settings, revision: str = "heads") -> None:
    """Upgrade the schema to `revision` (default: every head, the template's and yours).

    Synchronous: call it outside an event loop.
    """
    from alembic import command

    check_database(settings)
    config = alembic_config(settings.database_url)
    config.attributes["database_pooling"] = settings.database_pooling  # read by env.py
    command.upgrade(config, revision)
