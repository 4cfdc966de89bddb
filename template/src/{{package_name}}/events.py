"""A job's events, durable and in order: what the service did and what its agent emitted
(template-owned: copier-agent-worker).

Each job's events are rows with `seq` 1, 2, 3... Whoever writes events adds to the job row's
`event_seq` first, in the same transaction: the row lock makes two writers of one job take
turns, so a job's events commit in `seq` order and a reader that saw `seq` n has seen every
event before it (what `Last-Event-ID` needs: web/api.py, `jobs watch`).

- The service's own events are written in the transaction of the fact they record: a claim
  writes `attempt_started` (batched.py, job_store), an outcome `attempt_ended`, an operator's
  or recovery's move `state`, a recorded step `step`, a paid call `paid_call_opened` and
  `paid_call_settled`, a spawned or settled child `child_spawned` / `child_settled` on its
  parent. A re-run that replays a step or a paid call from the record writes nothing for it,
  so a crash never duplicates those events.
- `ctx.emit(kind, data)` goes to the worker's `EventBuffer`, written every `FLUSH_S` for all
  its jobs in one transaction (and before the attempt's outcome): never a transaction per
  event. An emitted event not yet written when its worker dies is lost with the attempt.
- Each job keeps at most `keep` events (the `events_per_job` setting): older ones are deleted
  and counted into its summary row, `seq` 0 (`trimmed`: how many, by kind). Events go with
  their job when it is pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .db import transaction
from .models import job_events, jobs
from .states import PARKED, TERMINAL

log = structlog.get_logger("events")

# The service's own kinds; an agent's `ctx.emit` may not use them.
SERVICE_KINDS = frozenset(
    {
        "attempt_started",
        "attempt_ended",
        "state",
        "step",
        "paid_call_opened",
        "paid_call_settled",
        "child_spawned",
        "child_settled",
        "limit_wait",
        "approval_requested",
        "approval_decided",
        "cancel_requested",
        "trimmed",
        "version_changed",
    }
)
KIND_MAX = 100
DATA_MAX_BYTES = 16 * 1024  # one event's data, as JSON
FLUSH_S = 0.2  # how often a worker writes what its agents emitted
FOLLOW_POLL_S = 0.5  # how often `follow` looks for new events
DEFAULT_KEEP = 1000  # the `events_per_job` setting's default


class EventRefused(ValueError):
    """An event an agent may not emit (a service kind, a bad name, data too large)."""


@dataclass(frozen=True)
class Event:
    """One stored event of a job."""

    seq: int
    at: datetime
    kind: str
    attempt: int | None
    data: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "kind": self.kind,
            "attempt": self.attempt,
            "data": self.data,
        }

    def line(self, width: int | None = None) -> str:
        """The event on a terminal (`jobs watch`): time, seq, kind, attempt and its data, cut
        to `width` columns with an ellipsis (`as_dict` has it all).

        >>> e = Event(7, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "step", 1, {"name": "a"})
        >>> e.line()
        '03:04:05Z     7  step               #1  name=a'
        >>> Event(8, e.at, "progress", 1, {"note": "x" * 80}).line(50)
        '03:04:05Z     8  progress           #1  note=xxxx…'
        """
        data = " ".join(f"{k}={v}" for k, v in (self.data or {}).items())
        attempt = "" if self.attempt is None else f"#{self.attempt}"
        line = f"{self.at:%H:%M:%S}Z {self.seq:>5}  {self.kind:<18} {attempt:<3} {data}".rstrip()
        if width is not None and len(line) > width:
            return line[: max(width - 1, 0)] + "…"
        return line


@dataclass(frozen=True)
class New:
    """An event to write: its kind, data and the attempt it belongs to."""

    kind: str
    data: dict[str, Any] | None = None
    attempt: int | None = None


def check(kind: str, data: Any) -> dict[str, Any] | None:
    """An agent's event as it will be stored; EventRefused says what is wrong with it.

    >>> check("progress", {"done": 3})
    {'done': 3}
    >>> try:
    ...     check("step", None)
    ... except EventRefused as exc:
    ...     print(exc)
    event kind 'step' is the service's own; use another name
    """
    if not isinstance(kind, str) or not kind.strip() or len(kind) > KIND_MAX:
        raise EventRefused(f"an event kind must be non-empty text of at most {KIND_MAX} characters")
    if kind in SERVICE_KINDS:
        raise EventRefused(f"event kind {kind!r} is the service's own; use another name")
    if data is None:
        return None
    if not isinstance(data, dict):
        raise EventRefused(f"event data must be a dict or None, not {type(data).__name__}")
    try:
        size = len(json.dumps(data))
    except (TypeError, ValueError) as exc:
        raise EventRefused(f"event data must be JSON: {exc}") from None
    if size > DATA_MAX_BYTES:
        raise EventRefused(f"event data is {size} bytes as JSON; the most is {DATA_MAX_BYTES}")
    return data


async def record(
    conn: AsyncConnection, job_id: str, seq: int, event: New, *, now: datetime
) -> None:
    """Write `event` at `seq`, which the caller's UPDATE of the job row just assigned
    (`event_seq = event_seq + 1`, in this transaction)."""
    await conn.execute(
        insert(job_events).values(
            job_id=job_id,
            seq=seq,
            at=now,
            kind=event.kind,
            attempt=event.attempt,
            data=event.data,
        )
    )


async def append(
    conn: AsyncConnection, job_id: str, new: Sequence[New], *, now: datetime
) -> int | None:
    """Write `new` as the job's next events in `conn`'s transaction; the last seq, or None
    when the job is gone (nothing written)."""
    if not new:
        return None
    last = await conn.scalar(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(event_seq=jobs.c.event_seq + len(new))
        .returning(jobs.c.event_seq)
    )
    if last is None:
        return None
    first = int(last) - len(new) + 1
    await conn.execute(
        insert(job_events),
        [
            {
                "job_id": job_id,
                "seq": first + offset,
                "at": now,
                "kind": event.kind,
                "attempt": event.attempt,
                "data": event.data,
            }
            for offset, event in enumerate(new)
        ],
    )
    return int(last)


async def trim(
    conn: AsyncConnection,
    job_id: str,
    *,
    keep: int,
    now: datetime,
    last: int | None = None,
    dropped: Counter[str] | None = None,
) -> int:
    """Keep the job's last `keep` events: delete the older ones and count them (and
    `dropped`, events never written) by kind into its summary, seq 0; how many went."""
    if last is None:
        last = await conn.scalar(select(jobs.c.event_seq).where(jobs.c.id == job_id))
        if last is None:
            return 0
    gone: Counter[str] = Counter(dropped or {})
    if last > keep:
        old = (job_events.c.job_id == job_id) & (job_events.c.seq > 0)
        old &= job_events.c.seq <= last - keep
        for kind, n in await conn.execute(
            select(job_events.c.kind, func.count()).where(old).group_by(job_events.c.kind)
        ):
            gone[kind] += int(n)
        await conn.execute(delete(job_events).where(old))
    if not gone:
        return 0
    summary = await conn.scalar(
        select(job_events.c.data).where(job_events.c.job_id == job_id, job_events.c.seq == 0)
    )
    kinds: Counter[str] = Counter((summary or {}).get("kinds", {}))
    kinds.update(gone)
    data = {"events": sum(kinds.values()), "kinds": dict(sorted(kinds.items()))}
    if summary is None:
        await record(conn, job_id, 0, New("trimmed", data), now=now)
    else:
        await conn.execute(
            update(job_events)
            .where(job_events.c.job_id == job_id, job_events.c.seq == 0)
            .values(data=data, at=now)
        )
    return sum(gone.values())


async def read_after(
    conn: AsyncConnection, job_id: str, seq: int = 0, *, limit: int = 100
) -> list[Event]:
    """The job's events after `seq`, oldest first, at most `limit` (seq 0, the summary of
    trimmed events, is never among them: see `trimmed`)."""
    rows = await conn.execute(
        select(job_events)
        .where(job_events.c.job_id == job_id, job_events.c.seq > max(seq, 0))
        .order_by(job_events.c.seq)
        .limit(limit)
    )
    return [Event(r.seq, r.at, r.kind, r.attempt, r.data) for r in rows]


async def page_after(
    conn: AsyncConnection, job_id: str, seq: int, *, limit: int
) -> tuple[list[Event], Event | None]:
    """The job's events after `seq` (`read_after`), and the summary of trimmed ones when
    some after `seq` are gone (the page does not start right after it)."""
    page = await read_after(conn, job_id, seq, limit=limit)
    gone = bool(page) and page[0].seq > seq + 1
    return page, await trimmed(conn, job_id) if gone else None


async def trimmed(conn: AsyncConnection, job_id: str) -> Event | None:
    """The summary of the job's trimmed events (seq 0), if any were trimmed."""
    row = (
        await conn.execute(
            select(job_events).where(job_events.c.job_id == job_id, job_events.c.seq == 0)
        )
    ).first()
    return None if row is None else Event(row.seq, row.at, row.kind, row.attempt, row.data)


async def first_seq(conn: AsyncConnection, job_id: str) -> int | None:
    """The oldest seq the job still keeps (above 0), or None when it has no event."""
    first = await conn.scalar(
        select(func.min(job_events.c.seq)).where(
            job_events.c.job_id == job_id, job_events.c.seq > 0
        )
    )
    return None if first is None else int(first)


class NoSuchJob(LookupError):
    """`follow` was asked for a job that does not exist."""


async def follow(
    engine: AsyncEngine, job_id: str, after: int = 0, *, poll_s: float = FOLLOW_POLL_S
) -> AsyncIterator[Event]:
    """The job's events after `after` as they are written (what the API's event stream and
    `jobs watch` send). When events after `after` were trimmed, their summary comes first,
    as a `trimmed` event whose seq is just before the first one kept. Ends once the job has
    finished or parked and every event was given; NoSuchJob when there is no such job."""
    while True:
        async with engine.connect() as conn:
            # The state first: events commit with (or before) the state they lead to, so
            # none written before a final state can be missed by the read after it.
            state = await conn.scalar(select(jobs.c.state).where(jobs.c.id == job_id))
            if state is None:
                raise NoSuchJob(f"no job with id {job_id}")
            page, summary = await page_after(conn, job_id, after, limit=500)
        if summary is not None:
            yield replace(summary, seq=page[0].seq - 1)
        for event in page:
            yield event
            after = event.seq
        if not page:
            if state in {s.value for s in TERMINAL | PARKED}:
                return
            await asyncio.sleep(poll_s)


@dataclass
class _Pending:
    events: deque[New]
    dropped: Counter[str] = field(default_factory=Counter)


class EventBuffer:
    """What the agents of one worker emitted, written every `flush_s` for every job in one
    transaction. A job never holds more than `keep` unwritten events: the oldest are dropped
    and counted into its summary when written."""

    def __init__(self, engine: AsyncEngine, *, keep: int, flush_s: float = FLUSH_S) -> None:
        self.engine = engine
        self.keep = keep
        self.flush_s = flush_s
        self._pending: dict[str, _Pending] = {}
        self._added: Counter[str] = Counter()  # per job, since its last `settle`
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def add(self, job_id: str, event: New) -> None:
        """Queue `event` of `job_id` for the next write (it returns at once)."""
        pending = self._pending.get(job_id)
        if pending is None:
            pending = self._pending[job_id] = _Pending(deque(maxlen=self.keep))
        if len(pending.events) == self.keep:  # the oldest makes room, counted
            pending.dropped[pending.events[0].kind] += 1
        pending.events.append(event)
        self._added[job_id] += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon())

    async def flush(self, job_id: str | None = None) -> int:
        """Write what is pending now (of `job_id` only, when given); how many events."""
        async with self._lock:
            if job_id is None:
                taken, self._pending = self._pending, {}
            else:
                one = self._pending.pop(job_id, None)
                taken = {} if one is None else {job_id: one}
            if not taken:
                return 0
            try:
                await self._write(taken)
            except Exception as exc:  # noqa: BLE001 - the database is away: the events are lost
                log.warning("events_not_written", jobs=len(taken), error=str(exc))
                return 0
            return sum(len(p.events) for p in taken.values())

    async def settle(self, job_id: str) -> int:
        """Write what `job_id` has pending; how many events it added since its last settle,
        whether written now or already by the periodic flush (the runner asks before the
        attempt's outcome, which must then trim the job when it added any)."""
        await self.flush(job_id)
        return self._added.pop(job_id, 0)

    async def trim(self, job_id: str) -> None:
        """Bring the job back to `keep` events (the runner asks when a claimed job has more)."""
        async with transaction(self.engine) as conn:
            await trim(conn, job_id, keep=self.keep, now=datetime.now(UTC))

    async def close(self) -> None:
        """Write what is pending and stop. The periodic flush is stopped between writes,
        never in one: cut off, its events were lost and its statement left running."""
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            async with self._lock:  # a write holds the lock: the flusher sleeps or waits
                flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        await self.flush()

    async def _flush_soon(self) -> None:
        while self._pending:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def _write(self, taken: dict[str, _Pending]) -> None:
        now = datetime.now(UTC)
        async with transaction(self.engine) as conn:
            for job_id in sorted(taken):  # one lock order across workers
                pending = taken[job_id]
                last = await append(conn, job_id, pending.events, now=now)
                if last is not None and (last > self.keep or pending.dropped):
                    await trim(
                        conn, job_id, keep=self.keep, now=now, last=last, dropped=pending.dropped
                    )


@dataclass(frozen=True)
class Emitter:
    """`ctx.emit` of one attempt of one job: checked, then handed to the worker's buffer."""

    buffer: EventBuffer
    job_id: str
    attempt: int

    def emit(self, kind: str, data: Any = None) -> None:
        self.buffer.add(self.job_id, New(kind, check(kind, data), self.attempt))

    def note(self, kind: str, data: dict[str, Any]) -> None:
        """An event of the service's own kinds (a limit wait), written with the emitted."""
        self.buffer.add(self.job_id, New(kind, data, self.attempt))
