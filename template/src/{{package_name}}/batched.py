"""Claims and completions of concurrent jobs, each batch in one PostgreSQL statement
(template-owned: copier-agent-worker).

A worker runs up to `max_jobs` jobs at once, and arq starts the jobs of one poll in the
same turn of the event loop. Written one by one, every claim and every completion costs a
pool checkout, BEGIN, two statements and COMMIT. Here the claims that arrive while the
previous claim statement is in flight wait for it and then go together as one statement
(`... WHERE id = ANY($1)`), and so do completions: one round trip for many jobs. Each
statement is a single autocommitted PostgreSQL statement whose data-modifying CTEs move the
job rows and their attempt rows together, so a batch is as atomic as the transaction it
replaces, and the guards are the same as `job_store`'s verbs (`states.TRANSITIONS`).

Only the hot path goes through here: claims, and completions of agents without a reply
step. Everything else (retries, failures, parking, replies, heartbeats) uses `job_store`
through SQLAlchemy. SQLite keeps the one-by-one path: it has one writer anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import asyncpg
from sqlalchemy.engine import make_url

from .job_store import Job
from .states import JobState

T = TypeVar("T")
R = TypeVar("R")


class DatabaseUnavailable(Exception):
    """A batch statement could not be run; nothing in it was written."""


# The states written into the statements below, as `states.TRANSITIONS` has them (a unit
# test holds the two equal).
CLAIM_MOVE = ({JobState.QUEUED, JobState.ACTIVE}, JobState.ACTIVE)
COMPLETE_MOVE = ({JobState.ACTIVE}, JobState.COMPLETED)


# The claim of `job_store.claim` for many jobs: count the attempt, open its row, close any
# attempt row a vanished worker left open (the CTEs share one snapshot, so `lost` never sees
# the row `opened` inserts).
CLAIM_SQL = """
WITH claimed AS (
    UPDATE jobs
    SET state = 'active', attempts = attempts + 1, worker = $2,
        claimed_at = $3, updated_at = $3, lease_expires_at = $4, run_after = NULL
    WHERE id = ANY($1::text[])
      AND ((state = 'queued' AND (run_after IS NULL OR run_after <= $3))
           OR (state = 'active' AND lease_expires_at < $3))
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
)
SELECT * FROM claimed
"""

# `job_store.complete` for many jobs, each guarded by the attempt that ran it.
COMPLETE_SQL = """
WITH outcome AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::text[]) AS o(id, attempt, result)
), done AS (
    UPDATE jobs
    SET state = 'completed', result = outcome.result::json,
        finished_at = $4, updated_at = $4, lease_expires_at = NULL
    FROM outcome
    WHERE jobs.id = outcome.id AND jobs.attempts = outcome.attempt AND jobs.state = 'active'
    RETURNING jobs.id, jobs.attempts
), closed AS (
    UPDATE attempts SET finished_at = $4, outcome = 'completed'
    FROM done
    WHERE attempts.job_id = done.id AND attempts.number = done.attempts
)
SELECT id FROM done
"""


class Batcher(Generic[T, R]):
    """Gathers items for up to `window_s` (or until `size` are waiting), writes them as one
    batch, and writes whatever arrived meanwhile next.

    arq starts the jobs of one poll one after another, each after a Redis round trip of its
    own, so the claims of a poll arrive a few hundred microseconds apart: without a window
    almost every batch would hold one job. The window costs each job at most `window_s`
    twice (claim and completion), against a `poll_delay` of tens or hundreds of
    milliseconds.
    """

    def __init__(
        self, write: Callable[[list[T]], Awaitable[list[R]]], *, window_s: float, size: int
    ) -> None:
        self._write = write
        self._window_s = window_s
        self._size = size
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._full = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if len(self._waiting) >= self._size:
            self._full.set()
        if self._drain is None:
            self._drain = asyncio.create_task(self._drain_all())
        return await future

    async def _drain_all(self) -> None:
        try:
            while self._waiting:
                if not self._full.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), self._window_s)
                batch, self._waiting = self._waiting[: self._size], self._waiting[self._size :]
                if len(self._waiting) < self._size:
                    self._full.clear()
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
    """The hot-path writes of one worker process, on two connections of its own."""

    def __init__(
        self,
        database_url: str,
        *,
        worker: str,
        lease_s: float,
        window_s: float,
        batch_size: int,
    ) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._worker = worker
        self._lease = timedelta(seconds=lease_s)
        self._connections: dict[str, asyncpg.Connection] = {}
        self._claims: Batcher[str, Job | None] = Batcher(
            self._claim_batch, window_s=window_s, size=batch_size
        )
        self._completions: Batcher[tuple[str, int, str], bool] = Batcher(
            self._complete_batch, window_s=window_s, size=batch_size
        )

    async def claim(self, job_id: str) -> Job | None:
        """`job_store.claim`, batched: the claimed job, or None when it is not claimable."""
        return await self._claims.submit(job_id)

    async def complete(self, job_id: str, *, attempt: int, result: dict[str, Any]) -> bool:
        """`job_store.complete`, batched: False when attempt `attempt` no longer holds it."""
        return await self._completions.submit((job_id, attempt, json.dumps(result)))

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.terminate()

    async def _claim_batch(self, job_ids: list[str]) -> list[Job | None]:
        now = datetime.now(UTC)
        rows = await self._fetch(
            "claims", CLAIM_SQL, list(set(job_ids)), self._worker, now, now + self._lease
        )
        claimed = {row["id"]: _job(row) for row in rows}
        # A job id delivered twice in one batch is claimed once: the first caller runs it.
        return [claimed.pop(job_id, None) for job_id in job_ids]

    async def _complete_batch(self, items: list[tuple[str, int, str]]) -> list[bool]:
        ids, attempts, results = (list(column) for column in zip(*items, strict=True))
        rows = await self._fetch(
            "completions",
            COMPLETE_SQL,
            ids,
            attempts,
            results,
            datetime.now(UTC),
        )
        done = {row["id"] for row in rows}
        return [job_id in done for job_id, _, _ in items]

    async def _fetch(self, name: str, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        try:
            connection = self._connections.get(name)
            if connection is None or connection.is_closed():
                connection = await asyncpg.connect(self._dsn, timeout=10)
                self._connections[name] = connection
            rows: Sequence[asyncpg.Record] = await connection.fetch(sql, *args)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            dropped = self._connections.pop(name, None)
            if dropped is not None:
                dropped.terminate()
            raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return rows


def _job(row: asyncpg.Record) -> Job:
    values = dict(row)
    values["state"] = JobState(values["state"])
    values["payload"] = json.loads(values["payload"])
    if values["result"] is not None:
        values["result"] = json.loads(values["result"])
    return Job(**values)
