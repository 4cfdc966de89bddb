"""Cancel that reaches running work (template-owned: copier-agent-worker).

`jobs cancel ID [--children]` (and the API's and the console's cancel) stops a job wherever
it is:

- queued, waiting or parked: `cancelled` at once (job_store.cancel), a pending approval
  closed `expired` by the actor;
- running: its row records `cancel_requested_at` and its id is published on Redis
  (queue.STOP_CHANNEL). The worker running it cancels the agent's task at its next await and
  records `cancelled`, or `in_doubt` when a paid call was in flight: it was sent, so the
  provider may have charged (paid_calls.py); a call not yet sent holds no reservation. From
  the request on, the attempt can no longer queue the job again or park it waiting; an
  agent that finished before the request reached it keeps its outcome.

With `--children` the whole tree below the job goes the same way: queued and waiting
descendants are cancelled, running ones asked to stop, and a child the job spawns before its
worker stops it is cancelled when it is. Finished and parked descendants are left as they
are (an `in_doubt` one still needs a person). Every row moved is audited with the actor. A
parent waiting for a cancelled child sees it settled (`cancelled`) in `wait_children`.

The row is the record; Redis is the fast path. A worker that missed the message (it was
reconnecting, or claimed the job after the request) finds the request in its look at the
jobs it runs, every `LOOK_EVERY_S`; recovery settles a job asked to stop whose worker died
(`cancelled`, or `in_doubt` with a paid call open), never queueing it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from redis.exceptions import NoPermissionError, RedisError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import approvals, audit, job_store, queries
from .db import transaction
from .queue import STOP_CHANNEL, JobQueue, QueueUnavailable
from .states import IN_FLIGHT, RUNNABLE, WAITING

log = structlog.get_logger("stopping")

# How often a worker reads whether the jobs it runs were asked to stop (the fallback for a
# message it missed: one read by id, only while it runs jobs), and waits before listening
# again after Redis went away. Twice a second, so a stop found this way is acted on within a
# second even on a busy machine, where the read and the stop's write take their time too.
LOOK_EVERY_S = 0.5
# How long a listener refused the stop channel (its Redis user's ACL) waits before asking
# again: the ACL may be mended without a restart, and the look finds stops meanwhile.
REFUSED_RETRY_S = 60.0
# What a stopped attempt's error says (its row, `jobs show`).
STOPPED = "an operator cancelled the job while it ran"
# Why a cancelled job's pending approval was closed (`expired`, decided by the actor).
CANCELLED = "the job was cancelled"
# The actor for what a stop settles after the request: a child reached when its stopped
# parent ended (after_stop, in the audit log), an approval the stopped job had just asked for.
AFTER_STOP = "cancel"


@dataclass
class Reach:
    """What one cancel did: the jobs cancelled at once and the running ones asked to stop,
    each in the order reached (the job itself first)."""

    cancelled: list[str] = field(default_factory=list)
    stopping: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.cancelled or self.stopping)

    @property
    def ids(self) -> list[str]:
        return [*self.cancelled, *self.stopping]


async def _cancelled(conn: AsyncConnection, job_id: str, *, by: str, now: datetime) -> bool:
    """Cancel a queued, waiting or parked job; a waiting one's pending approval is closed
    `expired`, decided by `by` (nobody is left to decide it)."""
    if not await job_store.cancel(conn, job_id, now=now):
        return False
    await approvals.close_pending(conn, job_id, by=by, reason=CANCELLED, now=now)
    return True


async def close_asked(conn: AsyncConnection, job_id: str, *, now: datetime) -> None:
    """A running job a cancel stopped: close an approval it asked for and never waited on
    (it recorded the approval, then found the stop when it went to park), `expired` by
    AFTER_STOP, in `conn`'s transaction. Nobody is left to decide it."""
    await approvals.close_pending(conn, job_id, by=AFTER_STOP, reason=CANCELLED, now=now)


async def cancel(
    engine: AsyncEngine,
    job_id: str,
    *,
    by: str,
    with_children: bool = False,
    queue: JobQueue | None = None,
) -> Reach:
    """Cancel `job_id` (and, `with_children`, its tree) in one transaction, then tell the
    workers running any of it. Nothing reached: the job is finished or unknown."""
    now = datetime.now(UTC)
    reach = Reach()
    async with transaction(engine) as conn:
        if await _cancelled(conn, job_id, by=by, now=now):
            reach.cancelled.append(job_id)
        elif await job_store.request_cancel(conn, job_id, now=now, children=with_children):
            reach.stopping.append(job_id)
        else:
            return reach
        details = {"children": with_children, "running": bool(reach.stopping)}
        await audit.record(conn, actor=by, action="cancel", target=job_id, details=details, now=now)
        if with_children:
            await descendants(conn, job_id, reach, by=by, now=now)
    if reach.stopping and queue is not None:
        await tell(queue, reach.stopping)
    return reach


async def descendants(
    conn: AsyncConnection,
    job_id: str,
    reach: Reach,
    *,
    by: str,
    now: datetime,
    running: bool = True,
) -> None:
    """Cancel the queued and waiting jobs below `job_id` and, with `running`, ask the running
    ones to stop (with their own descendants); one audit row each, naming `job_id`, in
    `conn`'s transaction. What they are is added to `reach`."""
    parents = [job_id]
    while parents:
        parent = parents.pop()
        for child in await queries.children_of(conn, parent):
            parents.append(child.id)
            if child.state in RUNNABLE | WAITING:
                if not await _cancelled(conn, child.id, by=by, now=now):
                    continue
                reach.cancelled.append(child.id)
            elif running and child.state in IN_FLIGHT and child.cancel_requested_at is None:
                if not await job_store.request_cancel(conn, child.id, now=now, children=True):
                    continue
                reach.stopping.append(child.id)
            else:
                continue
            details = {"ancestor_id": job_id, "running": child.state in IN_FLIGHT}
            await audit.record(
                conn, actor=by, action="cancel", target=child.id, details=details, now=now
            )


async def tell(queue: JobQueue, job_ids: Sequence[str]) -> None:
    """Publish the running jobs to stop; when Redis does not answer, their workers find the
    request in the row within LOOK_EVERY_S."""
    try:
        await queue.stop(job_ids)
    except QueueUnavailable as exc:
        log.warning("stop_not_published", jobs=len(job_ids), error=str(exc))


async def after_stop(engine: AsyncEngine, queue: JobQueue, job: queries.Job) -> None:
    """A job stopped with `--children`: reach what it spawned since the request."""
    if not job.cancel_children:
        return
    reach = Reach()
    async with transaction(engine) as conn:
        await descendants(conn, job.id, reach, by=AFTER_STOP, now=datetime.now(UTC))
    if reach.stopping:
        await tell(queue, reach.stopping)


@dataclass
class Interrupt:
    """One running agent a cancel may reach: its job and the task running it."""

    job_id: str
    task: asyncio.Task[Any]
    stopped: bool = False


class Running:
    """The agents this worker process runs, by job id: what a cancel reaches."""

    def __init__(self) -> None:
        self._by_job: dict[str, Interrupt] = {}

    def ids(self) -> list[str]:
        return list(self._by_job)

    def enter(self, job_id: str) -> Interrupt:
        """Register the current task as running `job_id`'s agent."""
        task = asyncio.current_task()
        assert task is not None, "an agent runs in a task"
        interrupt = self._by_job[job_id] = Interrupt(job_id, task)
        return interrupt

    def leave(self, interrupt: Interrupt) -> None:
        """The agent is done: forget it, and take back the cancellation a stop asked for,
        so the task goes on to record the outcome (asyncio.timeout does the same)."""
        if self._by_job.get(interrupt.job_id) is interrupt:
            del self._by_job[interrupt.job_id]
        if interrupt.stopped and interrupt.task.cancelling():
            interrupt.task.uncancel()

    def stop(self, job_ids: Iterable[str]) -> list[str]:
        """Cancel the agents of those of `job_ids` this process runs; the ids it stopped."""
        stopped = []
        for job_id in job_ids:
            interrupt = self._by_job.get(job_id)
            if interrupt is None or interrupt.stopped:
                continue
            interrupt.stopped = True
            interrupt.task.cancel(STOPPED)
            stopped.append(job_id)
        if stopped:
            log.info("jobs_stopping", job_ids=stopped)
        return stopped


async def look(engine: AsyncEngine, running: Running) -> list[str]:
    """Stop the jobs this process runs that were asked to stop (one read by id, none when
    it runs nothing)."""
    ids = running.ids()
    if not ids:
        return []
    async with engine.connect() as conn:
        asked = await queries.asked_to_stop(conn, ids)
    return running.stop(asked)


async def listen(queue: JobQueue, running: Running) -> None:
    """Stop the running jobs whose ids are published, until cancelled. Redis going away
    only delays a stop: `look` finds the request meanwhile. A Redis user whose ACL leaves
    out the channel is said once, and asked again every REFUSED_RETRY_S, not every look."""
    refused = False
    while True:
        pause = LOOK_EVERY_S
        try:
            async with queue.pool.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(STOP_CHANNEL)
                refused = False
                async for message in pubsub.listen():
                    data = message.get("data")
                    if isinstance(data, bytes):
                        running.stop(data.decode().split(","))
        except NoPermissionError as exc:
            if not refused:
                log.warning(
                    "stop_listener_refused",
                    error=str(exc),
                    fix=f"let the Redis user use the channel {STOP_CHANNEL} (ACL &{STOP_CHANNEL})",
                    stops_found_every_s=LOOK_EVERY_S,
                )
            refused, pause = True, REFUSED_RETRY_S
        except (RedisError, OSError) as exc:  # Redis away or restarting: listen again
            log.debug("stop_listener_reconnecting", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - never let the listener die; the look goes on
            log.warning("stop_listener_failed", error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(pause)


async def watch(engine: AsyncEngine, queue: JobQueue, running: Running) -> None:
    """Listen on Redis and look in the database, until cancelled."""
    listener = asyncio.create_task(listen(queue, running))
    loop = asyncio.get_running_loop()
    due = loop.time()
    try:
        while True:
            # At a fixed rate: a slow look does not push the next one later.
            due = max(due + LOOK_EVERY_S, loop.time())
            await asyncio.sleep(due - loop.time())
            try:
                await look(engine, running)
            except Exception as exc:  # noqa: BLE001 - the next look tries again
                log.warning("stop_look_failed", error=f"{type(exc).__name__}: {exc}")
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
