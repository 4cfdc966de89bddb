"""Claims and completions of concurrent jobs, written in batches
(template-owned: copier-agent-worker).

A worker runs up to `max_jobs` jobs at once. Written one by one, every claim and every
completion costs a pool checkout, BEGIN, two statements and COMMIT. Here the claims that
arrive within a few milliseconds of each other (or while the previous batch is being
written) go together, and so do completions:

- PostgreSQL: one autocommitted statement per batch (`... WHERE id = ANY($1)`), whose
  data-modifying CTEs move the job rows and their attempt rows together, so a batch is as
  atomic as the transaction it replaces; the guards are those of `job_store`'s verbs.
- SQLite (one writer anyway): one transaction per batch on a sqlite3 connection of the
  worker's own, run in one trip to its thread, with the same guards.

Only the hot path goes through here: claims, completions of agents without a reply step,
and one-job submits without a budget on PostgreSQL (`PostgresInserts`, used by submit.py).
Everything else (retries, failures, parking, replies, heartbeats) uses `job_store` one job
at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy.engine import make_url

from .db import sqlite_pragmas
from .models import UTCDateTime, jobs
from .queries import Job
from .settings import postgres_dsn

if TYPE_CHECKING:
    import asyncpg

    from .job_store import NewJob
from .states import JobState

T = TypeVar("T")
R = TypeVar("R")

# How long closing waits for the batches already handed in to be written. A job cancelled
# while its claim or completion is being written (a worker stopped) leaves that statement
# going; it ends before the connections close, never cut off halfway. One still going after
# this (a database that hangs) is cancelled: its job's lease runs out and recovery takes it,
# as after a crash.
CLOSE_GRACE_S = 10.0


class DatabaseUnavailable(Exception):
    """A batch statement could not be run, or its connection was lost before the answer
    (whether it was written then is for the record to say)."""


# The states written into the statements below, as `states.TRANSITIONS` has them (a unit
# test holds the two equal).
CLAIM_MOVE = ({JobState.QUEUED, JobState.ACTIVE}, JobState.ACTIVE)
COMPLETE_MOVE = ({JobState.ACTIVE}, JobState.COMPLETED)


# The claim of `job_store.claim` for many jobs: count the attempt, open its row, close any
# attempt row a vanished worker left open (the CTEs share one snapshot, so `lost` never sees
# the row `opened` inserts), and record its `attempt_started` event (events.py). The state
# guards here and in COMPLETE_SQL are CASEs so that they go by the primary key: see
# `models.in_states`.
CLAIM_SQL = """
WITH claimed AS (
    UPDATE jobs
    SET state = 'active', attempts = attempts + 1, worker = $2, event_seq = event_seq + 1,
        claimed_at = $3, updated_at = $3, lease_expires_at = $4, run_after = NULL,
        code_version = COALESCE(code_version, $5::jsonb ->> agent)
    WHERE id = ANY($1::text[])
      AND CASE state
          WHEN 'queued' THEN run_after IS NULL OR run_after <= $3
          WHEN 'active' THEN lease_expires_at < $3 AND attempts < max_attempts
          ELSE false
      END
    RETURNING jobs.*
), lost AS (
    UPDATE attempts
    SET finished_at = $3, outcome = 'lost', error_class = 'WorkerLost',
        error_message = 'the worker stopped before recording an outcome'
    FROM claimed
    WHERE attempts.job_id = claimed.id AND claimed.attempts > 1
      AND attempts.finished_at IS NULL
), opened AS (
    INSERT INTO attempts (job_id, number, worker, started_at)
    SELECT id, attempts, $2, $3 FROM claimed
), started AS (
    INSERT INTO job_events (job_id, seq, at, kind, attempt, data)
    SELECT id, event_seq, $3, 'attempt_started', attempts, json_build_object('worker', $2::text)
    FROM claimed
)
SELECT * FROM claimed
"""

# `job_store.complete` for many jobs, each guarded by the attempt that ran it. A child job
# (parent_id set) never completes here: job_store.complete also queues its waiting parent.
COMPLETE_SQL = """
WITH outcome AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::text[]) AS o(id, attempt, result)
), done AS (
    UPDATE jobs
    SET state = 'completed', result = outcome.result::json, event_seq = event_seq + 1,
        finished_at = $4, updated_at = $4, lease_expires_at = NULL
    FROM outcome
    WHERE jobs.id = outcome.id AND jobs.attempts = outcome.attempt
      AND CASE jobs.state WHEN 'active' THEN jobs.parent_id IS NULL ELSE false END
    RETURNING jobs.id, jobs.attempts, jobs.event_seq
), closed AS (
    UPDATE attempts SET finished_at = $4, outcome = 'completed'
    FROM done
    WHERE attempts.job_id = done.id AND attempts.number = done.attempts
), ended AS (
    INSERT INTO job_events (job_id, seq, at, kind, attempt, data)
    SELECT id, event_seq, $4, 'attempt_ended', attempts, CAST($5 AS json) FROM done
)
SELECT id FROM done
"""


# `job_store.enqueue_many` for the one-job submits of concurrent callers (submit.py): the
# rows of every call in one statement, which commits on its own. A row whose (owner,
# idempotency key) is taken, by a recorded job or by an earlier row here, is not written,
# and its id is not returned. No budget: a budget's row is written in the job's transaction.
_INSERT_INTO = """
INSERT INTO jobs (id, agent, lane, state, payload, owner, idempotency_key, attempts,
                  max_attempts, trace_context, run_after, priority, deadline_at, rerun_of,
                  code_version, created_at, updated_at)
"""
INSERT_SQL = (
    _INSERT_INTO
    + """SELECT id, agent, lane, 'queued', payload::json, owner, idempotency_key, 0, max_attempts,
       trace_context::json, run_after, priority, deadline_at, rerun_of, code_version,
       created_at, created_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::int[], $8::text[], $9::timestamptz[], $10::smallint[], $11::timestamptz[],
            $12::text[], $13::text[], $14::timestamptz[])
     AS new(id, agent, lane, payload, owner, idempotency_key, max_attempts, trace_context,
            run_after, priority, deadline_at, rerun_of, code_version, created_at)
ON CONFLICT DO NOTHING
RETURNING id
"""
)
# The same for a lone row, which is what one caller at a time submits: plain parameters
# cost PostgreSQL less to plan and run than unnest's arrays (about 40 µs a submit, measured
# in docs/SCALING.md).
INSERT_ONE_SQL = (
    _INSERT_INTO
    + """VALUES ($1, $2, $3, 'queued', $4::json, $5, $6, 0, $7, $8::json, $9, $10, $11, $12, $13,
        $14, $14)
ON CONFLICT DO NOTHING
RETURNING id
"""
)


class Batcher(Generic[T, R]):
    """Gathers the items that arrive within `window_s` of the first, writes them as one
    batch, and writes whatever arrived meanwhile next (group commit).

    The lane worker starts the jobs of one read together (lanes.LaneWorker.start_jobs), so
    their claims arrive in the same turn of the event loop, and completions that arrive
    while a batch is being written form the next one: the default window of 0 already
    batches under load and adds nothing to a lone job. A batch never holds more than the
    worker's `max_jobs` items, since each running job waits on at most one write at a time.
    A window above 0 costs each job up to `window_s` twice (claim and completion); measured
    here it lowered throughput (docs/benchmarks.md).
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[list[R]]],
        *,
        window_s: float,
        eager: bool = False,
    ) -> None:
        self._write = write
        self._window_s = window_s
        # Eager: an item that finds nothing being written is written at once, by its caller
        # (no task, no extra turn of the loop), for callers that come one at a time (submits).
        self._eager = eager and window_s == 0
        self._writing = False
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        if self._eager and self._drain is None and not self._writing:
            future = self._hand_in(item)
            await self._write_now()
            return await future
        return await self.put(item)

    def put(self, item: T) -> asyncio.Future[R]:
        """Hand `item` in without waiting: the future of its result. Shielding that future
        keeps a caller's cancel out of the write with no task of its own."""
        future = self._hand_in(item)
        if self._drain is None and not self._writing:
            self._drain = asyncio.create_task(self._drain_all())
        return future

    def _hand_in(self, item: T) -> asyncio.Future[R]:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        return future

    async def idle(self) -> None:
        """Wait until every item handed in so far is written (or has failed); an eager
        caller's own write is its caller's to wait for."""
        while (drain := self._drain) is not None:
            await asyncio.wait([drain])

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Wait up to `grace_s` for what was handed in to be written (`idle`), then cancel
        the write still going, if any; its waiters are cancelled."""
        try:
            await asyncio.wait_for(self.idle(), grace_s)
        except TimeoutError:
            drain = self._drain
            if drain is not None:
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain

    async def _write_now(self) -> None:
        """Write what waits (the caller's item) in the caller's turn; what arrives meanwhile
        waits for it, then goes in the next batch."""
        self._writing = True
        batch, self._waiting = self._waiting, []
        try:
            await self._write_batch(batch)
        finally:
            self._writing = False
            if self._waiting and self._drain is None:
                self._drain = asyncio.create_task(self._drain_all())

    async def _drain_all(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(self._window_s)
                batch, self._waiting = self._waiting, []
                await self._write_batch(batch)
        finally:
            self._drain = None

    async def _write_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - DatabaseUnavailable or a bug: waiters get it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


class BatchedWrites:
    """The hot-path writes of one worker process: claims and completions, batched."""

    def __init__(
        self,
        *,
        worker: str,
        lease_s: float,
        window_s: float,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        self.worker = worker
        self.lease_s = lease_s
        # Each agent's code version, as JSON: what a job's first claim records (versions.py).
        self.versions = json.dumps(dict(versions or {}))
        self._claims: Batcher[str, Job | None] = Batcher(self._claim_batch, window_s=window_s)
        self._completions: Batcher[Completion, bool] = Batcher(
            self._complete_batch, window_s=window_s
        )

    async def claim(self, job_id: str) -> Job | None:
        """`job_store.claim`, batched: the claimed job, or None when it is not claimable."""
        return await self._claims.submit(job_id)

    async def complete(self, job_id: str, *, attempt: int, result: dict[str, Any]) -> bool:
        """`job_store.complete`, batched: False when attempt `attempt` no longer holds it."""
        return await self._completions.submit(Completion(job_id, attempt, result))

    async def close(self) -> None:
        """Write the claims and completions already handed in (`Batcher.close`), then
        release what the writes hold (connections)."""
        await self._claims.close()
        await self._completions.close()
        await self._release()

    async def _release(self) -> None:
        """Close the connections the writes use (no write is going when it is called)."""

    async def _claim_batch(self, job_ids: list[str]) -> list[Job | None]:
        # A job id delivered twice in one batch is claimed once: the first caller runs it.
        claimed = await self.claim_all(list(dict.fromkeys(job_ids)), datetime.now(UTC))
        return [claimed.pop(job_id, None) for job_id in job_ids]

    async def _complete_batch(self, items: list[Completion]) -> list[bool]:
        done = await self.complete_all(items, datetime.now(UTC))
        return [item.job_id in done for item in items]

    async def claim_all(self, job_ids: list[str], now: datetime) -> dict[str, Job]:
        """Claim the claimable ones of `job_ids` (distinct) at `now`; by id."""
        raise NotImplementedError

    async def complete_all(self, items: list[Completion], now: datetime) -> set[str]:
        """Record the completions whose attempt still holds its job; their ids."""
        raise NotImplementedError


@dataclass(frozen=True)
class Completion:
    job_id: str
    attempt: int
    result: dict[str, Any]


# What the worker's own connections plan with. They run only the claims and completions
# above, each keyed by its jobs' ids (and attempts by job and number): a plan that reads a
# whole table is never the right one for them, but the planner picks one whenever the
# tables' statistics are older than their rows (a new service, a burst of jobs before
# autovacuum's next ANALYZE): with 1,500 attempts rows it read them all for every claim.
KEYED_PLANS = "enable_seqscan = off"


class OwnConnections:
    """asyncpg connections of this process' own, one per name, opened when first used and
    again after a failure; each statement commits on its own, planned with `planner` (a
    setting, as KEYED_PLANS) when given."""

    def __init__(
        self, database_url: str, *, pooling: str = "session", planner: str | None = None
    ) -> None:
        # Behind a transaction pooler (db.postgres_connect_args): no cached or named
        # statements, and each statement in a transaction, so it is prepared and run on one
        # server connection.
        self._in_transaction = pooling == "transaction"
        self._planner = planner
        self._dsn = postgres_dsn(database_url)  # read as libpq reads it: ?sslmode=... too
        self._connections: dict[str, asyncpg.Connection] = {}
        self._closed = False

    def close(self) -> None:
        """Close every connection; a `fetch` after it raises DatabaseUnavailable."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.terminate()

    async def fetch(self, name: str, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        """Run `sql` on the connection `name`; DatabaseUnavailable when it cannot be run.

        Cancelled while the statement runs, the connection is closed at once: asyncpg would
        send the server a cancel request from a task of its own, and a connection left
        waiting on it, with that task, outlives whoever closes the event loop next.
        """
        # Imported here, not at the top: a service on SQLite never loads asyncpg (about 14 ms
        # of every command's start that imports this module; docs/SCALING.md, "Start-up").
        import asyncpg

        if self._closed:
            raise DatabaseUnavailable("the connections are closed")
        try:
            connection = self._connections.get(name)
            if connection is None or connection.is_closed():
                cache = {"statement_cache_size": 0} if self._in_transaction else {}
                connection = await asyncpg.connect(self._dsn, timeout=10, **cache)
                self._connections[name] = connection
                if self._planner and not self._in_transaction:
                    await connection.execute(f"SET {self._planner}")
            rows: Sequence[asyncpg.Record]
            if self._in_transaction:  # a server connection is ours for one transaction only
                async with connection.transaction():
                    if self._planner:
                        await connection.execute(f"SET LOCAL {self._planner}")
                    rows = await connection.fetch(sql, *args)
            else:
                rows = await connection.fetch(sql, *args)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            self._drop(name)
            raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:
            self._drop(name)
            raise
        return rows

    def _drop(self, name: str) -> None:
        dropped = self._connections.pop(name, None)
        if dropped is not None:
            dropped.terminate()


class PostgresInserts:
    """The one-job submits of a `Submitter`'s concurrent callers: the rows that arrive
    together (or while one statement runs) written by one `INSERT_SQL`, on a connection of
    the submitter's own. A lone submit is one round trip (`INSERT_ONE_SQL`), with no pool
    checkout."""

    def __init__(self, database_url: str, *, pooling: str = "session") -> None:
        self._db = OwnConnections(database_url, pooling=pooling)
        self._rows: Batcher[tuple[str, NewJob, datetime], bool] = Batcher(
            self._insert_batch, window_s=0, eager=True
        )

    async def insert(self, job_id: str, job: NewJob, now: datetime) -> bool:
        """Write `job` (without a budget) as queued, created `now`; False when its (owner,
        idempotency key) is taken and nothing was written. DatabaseUnavailable when the
        statement could not run."""
        return await self._rows.submit((job_id, job, now))

    async def close(self) -> None:
        """Write the rows already handed in, then close the connection."""
        await self._rows.close()
        self._db.close()

    async def _insert_batch(self, rows: list[tuple[str, NewJob, datetime]]) -> list[bool]:
        values = [_insert_values(job_id, job, now) for job_id, job, now in rows]
        if len(values) == 1:
            records = await self._db.fetch("inserts", INSERT_ONE_SQL, *values[0])
        else:
            columns = [list(column) for column in zip(*values, strict=True)]
            records = await self._db.fetch("inserts", INSERT_SQL, *columns)
        written = {record["id"] for record in records}
        return [job_id in written for job_id, _, _ in rows]


def _insert_values(job_id: str, job: NewJob, now: datetime) -> tuple[Any, ...]:
    """A row of INSERT_SQL (the parameters of INSERT_ONE_SQL), JSON as text."""
    trace = None if job.trace_context is None else json.dumps(job.trace_context)
    return (
        job_id, job.agent, job.lane, json.dumps(job.payload), job.owner or "",
        job.idempotency_key, job.max_attempts, trace, job.run_after, job.priority,
        job.deadline_at, job.rerun_of, job.code_version, now,
    )  # fmt: skip


class PostgresBatchedWrites(BatchedWrites):
    """Each batch in one statement, on two asyncpg connections of the worker's own."""

    def __init__(self, database_url: str, *, pooling: str = "session", **options: Any) -> None:
        super().__init__(**options)
        self._db = OwnConnections(database_url, pooling=pooling, planner=KEYED_PLANS)

    async def _release(self) -> None:
        self._db.close()

    async def claim_all(self, job_ids: list[str], now: datetime) -> dict[str, Job]:
        lease_end = now + timedelta(seconds=self.lease_s)
        rows = await self._db.fetch(
            "claims", CLAIM_SQL, job_ids, self.worker, now, lease_end, self.versions
        )
        return {row["id"]: _job(row) for row in rows}

    async def complete_all(self, items: list[Completion], now: datetime) -> set[str]:
        ids = [item.job_id for item in items]
        attempts = [item.attempt for item in items]
        results = [json.dumps(item.result) for item in items]
        rows = await self._db.fetch(
            "completions", COMPLETE_SQL, ids, attempts, results, now, COMPLETED_EVENT
        )
        return {row["id"] for row in rows}


class SqliteBatchedWrites(BatchedWrites):
    """Each batch in one transaction on a sqlite3 connection of the worker's own, run in one
    trip to its thread: WAL, prebuilt statements, no per-statement ORM work or thread hop.

    SQLite has one writer at a time, so a batch is one `BEGIN IMMEDIATE ... COMMIT`. Times
    are stored as SQLAlchemy stores `models.UTCDateTime` on SQLite (naive UTC text with
    microseconds), so rows written here and through `job_store` compare and read alike.
    """

    def __init__(self, database_url: str, **options: Any) -> None:
        super().__init__(**options)
        self._path = make_url(database_url).database or ""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-batches")
        self._db: sqlite3.Connection | None = None  # used only on self._thread

    async def _release(self) -> None:
        await self._run(self._close)
        self._thread.shutdown(wait=False)

    async def claim_all(self, job_ids: list[str], now: datetime) -> dict[str, Job]:
        lease_end = now + timedelta(seconds=self.lease_s)
        rows = await self._run(self._claim, job_ids, _sqlite_time(now), _sqlite_time(lease_end))
        return {row["id"]: _sqlite_job(row) for row in rows}

    async def complete_all(self, items: list[Completion], now: datetime) -> set[str]:
        return await self._run(self._complete, items, _sqlite_time(now))

    async def _run(self, write: Callable[..., R], *args: Any) -> R:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, write, *args)
        except sqlite3.Error as exc:
            await loop.run_in_executor(self._thread, self._close)
            raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}") from exc

    # On self._thread only, below.

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self._path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            sqlite_pragmas(db, None)
            self._db = db
        return self._db

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _claim(self, job_ids: list[str], now: str, lease_end: str) -> list[sqlite3.Row]:
        db = self._connection()
        marks = ",".join("?" * len(job_ids))
        with _immediate(db):
            claimed = db.execute(
                SQLITE_CLAIM_SQL.format(ids=marks),
                [self.worker, now, now, lease_end, self.versions, *job_ids, now, now],
            ).fetchall()
            retaken = [row["id"] for row in claimed if row["attempts"] > 1]
            if retaken:
                db.execute(
                    SQLITE_LOST_SQL.format(ids=",".join("?" * len(retaken))), [now, *retaken]
                )
            db.executemany(
                SQLITE_OPEN_ATTEMPT_SQL,
                [(row["id"], row["attempts"], self.worker, now) for row in claimed],
            )
            started = json.dumps({"worker": self.worker})
            db.executemany(
                SQLITE_EVENT_SQL,
                [
                    (row["id"], row["event_seq"], now, "attempt_started", row["attempts"], started)
                    for row in claimed
                ],
            )
        return claimed

    def _complete(self, items: list[Completion], now: str) -> set[str]:
        db = self._connection()
        done: dict[str, int] = {}  # job id: its event's seq
        with _immediate(db):
            for item in items:
                moved = db.execute(
                    SQLITE_COMPLETE_SQL,
                    (json.dumps(item.result), now, now, item.job_id, item.attempt),
                ).fetchone()
                if moved is not None:
                    done[item.job_id] = moved["event_seq"]
            db.executemany(
                SQLITE_CLOSE_ATTEMPT_SQL,
                [(now, item.job_id, item.attempt) for item in items if item.job_id in done],
            )
            db.executemany(
                SQLITE_EVENT_SQL,
                [
                    (i.job_id, done[i.job_id], now, "attempt_ended", i.attempt, COMPLETED_EVENT)
                    for i in items
                    if i.job_id in done
                ],
            )
        return set(done)


# The PostgreSQL statements above, for SQLite (same guards, same columns).
SQLITE_CLAIM_SQL = """
UPDATE jobs
SET state = 'active', attempts = attempts + 1, worker = ?, claimed_at = ?, updated_at = ?,
    lease_expires_at = ?, run_after = NULL, event_seq = event_seq + 1,
    code_version = COALESCE(code_version, json_extract(?, '$."' || agent || '"'))
WHERE id IN ({ids})
  AND ((state = 'queued' AND (run_after IS NULL OR run_after <= ?))
       OR (state = 'active' AND lease_expires_at < ? AND attempts < max_attempts))
RETURNING *
"""
SQLITE_LOST_SQL = """
UPDATE attempts
SET finished_at = ?, outcome = 'lost', error_class = 'WorkerLost',
    error_message = 'the worker stopped before recording an outcome'
WHERE job_id IN ({ids}) AND finished_at IS NULL
"""
SQLITE_OPEN_ATTEMPT_SQL = (
    "INSERT INTO attempts (job_id, number, worker, started_at) VALUES (?, ?, ?, ?)"
)
SQLITE_COMPLETE_SQL = """
UPDATE jobs
SET state = 'completed', result = ?, finished_at = ?, updated_at = ?, lease_expires_at = NULL,
    event_seq = event_seq + 1
WHERE id = ? AND attempts = ? AND state = 'active' AND parent_id IS NULL
RETURNING event_seq
"""
SQLITE_CLOSE_ATTEMPT_SQL = (
    "UPDATE attempts SET finished_at = ?, outcome = 'completed' WHERE job_id = ? AND number = ?"
)
SQLITE_EVENT_SQL = (
    "INSERT INTO job_events (job_id, seq, at, kind, attempt, data) VALUES (?, ?, ?, ?, ?, ?)"
)
# The data of a completion's `attempt_ended` event, as job_store._finish writes it.
COMPLETED_EVENT = json.dumps({"outcome": "completed", "state": "completed"})
# The job row's times, which SQLite returns as text: every UTCDateTime column of `jobs`.
_SQLITE_TIMES = frozenset(c.name for c in jobs.c if isinstance(c.type, UTCDateTime))


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (no upgrade from a read lock to deadlock on)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _sqlite_time(moment: datetime) -> str:
    """A UTC time as SQLAlchemy stores it on SQLite.

    >>> _sqlite_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    '2026-01-02 03:04:05.000000'
    """
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


# Nullable JSON columns of `jobs` (payload is never null), decoded by both writers.
JSON_COLUMNS = ("result", "trace_context")


def _sqlite_job(row: sqlite3.Row) -> Job:
    values = dict(row)
    for name in _SQLITE_TIMES:
        if values[name] is not None:
            values[name] = datetime.fromisoformat(values[name]).replace(tzinfo=UTC)
    values["state"] = JobState(values["state"])
    values["payload"] = json.loads(values["payload"])
    for name in JSON_COLUMNS:  # json columns come back as text
        if values.get(name) is not None:
            values[name] = json.loads(values[name])
    return Job.of(values)


def _job(row: asyncpg.Record) -> Job:
    values = dict(row)
    values["state"] = JobState(values["state"])
    values["payload"] = json.loads(values["payload"])
    for name in JSON_COLUMNS:  # json columns come back as text
        if values.get(name) is not None:
            values[name] = json.loads(values[name])
    return Job.of(values)
