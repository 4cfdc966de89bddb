"""One lane's arq worker, and the supervisor that keeps it running (template-owned:
copier-agent-worker).

Each lane is its own arq queue with its own `job_timeout`, taken from the longest timeout
of its agents; arq's in-progress key lives that long plus 10 s, which is how long a job
whose worker crashed waits before another worker may take it (`crash_comeback_s`).

A lane outlives Redis faults: arq's worker leaves its poll loop on the first connection
error (a Redis restart, a dropped connection, a failover), so each lane runs under a
`LaneSupervisor` that logs the fault, pauses and builds a new arq worker, and the next
successful connection triggers a reconcile, which re-pushes whatever Redis lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from typing import Any

import structlog
from arq.connections import RedisSettings
from arq.constants import in_progress_key_prefix
from arq.jobs import SerializationError, deserialize_job_raw, serialize_result
from arq.utils import ms_to_datetime, poll, timestamp_ms
from arq.worker import Retry, RetryJob, Worker, func
from redis.exceptions import RedisError

from .connections import describe_redis_error, open_pool, redis_settings
from .queue import (
    Ending,
    Finisher,
    Started,
    Starter,
    deserialize,
    queue_name,
    rescore,
    ring,
    serialize,
    wait_for_work,
)
from .runner import Requeue, Runtime, run_job

log = structlog.get_logger("worker")
arq_log = logging.getLogger("arq.worker")  # what arq logs about a job, logged as arq does

# Seconds arq adds to a lane's timeout so the runner can record a timeout itself.
RECORD_GRACE_S = 5
# arq counts every start, re-deliveries included; our own attempt limit is the real one.
ARQ_MAX_TRIES = 10_000
# arq keeps a started job's in-progress key for its function's timeout plus this.
ARQ_IN_PROGRESS_EXTRA_S = 10
# A job claimed ahead that waited longer than this for an agent slot has its in-progress key
# renewed before its agent runs: the wait does not eat into arq's margin above.
RENEW_AFTER_WAIT_S = ARQ_IN_PROGRESS_EXTRA_S / 2
# After a fault, a lane's worker is rebuilt after a pause that doubles from the first value
# up to the second, and drops back to the first once a rebuilt worker has run HEALTHY_RUN_S:
# a long Redis outage costs one log line per pause, never a crash loop.
RESTART_PAUSE_S = (1.0, 15.0)
HEALTHY_RUN_S = 60.0


def crash_comeback_s(lane_timeout_s: float, lease_s: float) -> float:
    """How long a job whose worker died waits before another worker runs it: arq delivers
    it again once its in-progress key expires (the job function's timeout, which is the
    lane's timeout + RECORD_GRACE_S, + arq's 10 s), and the claim waits for the lease.

    >>> crash_comeback_s(60, 30.0)
    75.0
    """
    return float(max(lane_timeout_s + RECORD_GRACE_S + ARQ_IN_PROGRESS_EXTRA_S, lease_s))


def worker_settings(runtime: Runtime, lane: str, *, burst: bool = False) -> dict[str, Any]:
    """The arq WorkerSettings of one lane.

    No arq hooks run job code: an exception in `on_job_start`/`on_job_end` would stop the
    worker, so the runner does all per-job work inside the job function.
    """
    timeout = runtime.lane_timeouts[lane]
    settings = runtime.settings
    return {
        "functions": [func(run_job_then_ring, name="run_job", timeout=timeout + RECORD_GRACE_S)],
        "queue_name": queue_name(lane),
        "redis_settings": redis_settings(settings),
        "job_serializer": serialize,
        "job_deserializer": deserialize,
        "max_jobs": settings.max_jobs_of(lane),
        "poll_delay": settings.poll_delay_s,
        "keep_result": settings.keep_result_s,
        "max_tries": ARQ_MAX_TRIES,
        "burst": burst,
        "handle_signals": False,
        # SIGTERM: stop taking jobs, give running ones the lane's timeout to finish.
        "job_completion_wait": timeout + RECORD_GRACE_S,
        "ctx": {"runtime": runtime, "lane": lane},
        "log_results": False,
    }


# A due retry rings a little after its time, so the woken worker finds it due.
DUE_MARGIN_S = 0.005


async def run_job_then_ring(ctx: dict[str, Any], job_id: str, agent: str = "") -> str:
    """`runner.run_job`; a retry also rings the lane's doorbell when it comes due, after
    giving a requeued job its priority back (queue.rescore)."""
    try:
        return await run_job(ctx, job_id, agent)
    except Retry as retry:
        ring_when_due = ctx.get("ring_when_due")
        if ring_when_due is not None:
            priority = retry.priority if isinstance(retry, Requeue) else None
            ring_when_due((retry.defer_score or 0) / 1000, job_id, priority)
        raise


class LaneWorker(Worker):
    """arq's worker for one lane, which picks work up when it comes rather than a poll later.

    arq sleeps `poll_delay` between reads of the queue. After a read that was not full, this
    worker waits instead for the first of: a ring of the lane's doorbell (every push rings:
    submit, replay, recovery), the lane's next deferred job coming due (a retry), or the poll
    delay, which stays the fallback (a lost ring costs at most one poll). With its slots
    busy it waits for a slot to free; when its last start ran out of slots before the read's
    jobs did, it reads again as soon as one is free (see `wait_after_read`). After a full
    read it reads again at once, past that read when every job in it runs elsewhere.

    It starts the jobs of a read with one script call per batch of free slots (`Starter`:
    their in-progress keys, try counters and bodies) where arq spends five round trips per
    job, ends the jobs that end together with one more (`Finisher`) where arq spends one
    each, and counts its slots itself: arq's semaphore holds one permit more than
    `max_jobs`, so waiting on it never waits.

    A slot holds one agent's run: the runner frees it once the agent has returned
    (`release_slot` in the job's context), so the next jobs are claimed while the outcomes
    of the last ones are written. At most `max_jobs` agents run at once; a job's task, which
    `close` waits for, lives on until its outcome and its end in Redis are written.

    With `claim_ahead` (at most `max_jobs`), the worker starts and claims that many jobs
    more than its free slots, so claims go in larger batches; the runner then waits for an
    agent slot (`take_slot` in the job's context) between the claim and the agent, its lease
    renewed meanwhile. The wait is not counted in the job's arq timeout, and a long one
    renews the job's in-progress key. A job claimed ahead waits for one agent run at most.
    """

    def __init__(
        self, *, lane: str, poll_delay: float, claim_ahead: int = 0, **config: Any
    ) -> None:
        super().__init__(**config, poll_delay=0)  # arq's poll loop no longer sleeps: we wait
        self.lane = lane
        self.wait_s = poll_delay
        self.claim_ahead = claim_ahead
        self._capacity = self.max_jobs + claim_ahead  # jobs started and not yet released
        self._agents = asyncio.Semaphore(self.max_jobs)  # with claim_ahead only
        self._holding: set[str] = set()  # jobs whose agent holds one of `_agents`
        self._read = 0
        # Whether the last start ran out of free slots before the read's ids (so due jobs may
        # be waiting for a slot); True until a start says otherwise.
        self._left_behind = True
        self._rings: set[asyncio.Task[None]] = set()
        self._starter: Starter | None = None
        self._finisher: Finisher | None = None
        # Burst mode: in `wait_for_work` (the last job's end rings it), or the last job
        # ended since the read began (no wait: the next read finds the queue empty).
        self._on_doorbell = False
        self._last_ended = False
        self._slot_freed = asyncio.Event()
        self._released: set[str] = set()  # jobs whose slot freed before their task ended
        # A job's task that failed (its end not written to Redis), raised by the next poll.
        self._failed: asyncio.Task[None] | None = None
        self.ctx["ring_when_due"] = self.ring_when_due

    def ring_when_due(self, delay_s: float, job_id: str, priority: int | None) -> None:
        """Once a retry deferred by `delay_s` is due, give it its priority's score (when
        known) and ring the lane's doorbell (if this process still runs then; else polling
        finds it, at its plain due time)."""
        task = asyncio.create_task(self._ring_after(delay_s + DUE_MARGIN_S, job_id, priority))
        self._rings.add(task)
        task.add_done_callback(self._rings.discard)

    async def _ring_after(self, delay_s: float, job_id: str, priority: int | None) -> None:
        await asyncio.sleep(delay_s)
        if priority is not None:
            await rescore(self.pool, self.lane, job_id, priority)
        await ring(self.pool, [self.lane])

    async def main(self) -> None:
        """arq's `Worker.main` without its start-up `INFO`, which only fed a line arq logs at
        info (not shown here): a Redis user without the `@dangerous` commands, as managed
        services' read-write roles are, may not run INFO, and arq's main then failed every
        start of the lane."""
        if self._pool is None:  # arq's own create_pool leaves a cancelled pool open
            self._pool = await open_pool(
                self.redis_settings or RedisSettings(),
                job_serializer=self.job_serializer,
                job_deserializer=self.job_deserializer,
                default_queue_name=self.queue_name,
                expires_extra_ms=self.expires_extra_ms,
            )
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        async for _ in poll(self.poll_delay_s):
            await self._poll_iteration()
            if self.burst and (
                0 <= self.max_burst_jobs <= self._jobs_started()
                or await self.pool.zcard(self.queue_name) == 0
            ):
                await asyncio.gather(*self.tasks.values())
                return

    async def close(self) -> None:
        """Cancel the jobs still running, as arq does, but let their ends be written first.

        A job's end is written to Redis shielded from cancellation (`_run`), so a job
        cancelled while ending goes on writing after its task is done; and arq's own close
        fails with the first cancelled job, before it closes its pool. Both left a
        connection open, writing on a pool nobody would close.
        """
        for task in list(self._rings):
            task.cancel()
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)  # what arq's close does first: cancel the jobs
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self._finisher is not None:
            await self._finisher.idle()
        self.tasks.clear()
        await super().close()

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """Start the due jobs among `job_ids` (one read of the queue) in the free slots.

        Replaces arq's `start_jobs`, keeping what it does per started job: count it, run it
        in a task kept in `tasks`, free the slot when the task ends.
        """
        self._raise_failed()
        self._read = len(job_ids)
        if self._starter is None or self._finisher is None:
            self._starter = Starter(self.pool, self.lane, self.in_progress_timeout_s)
            self._finisher = Finisher(self.pool, self.lane, self.keep_result_s)
        # arq calls this only while it may pick jobs and has a free slot. One call either
        # fills the slots free when it began or looks at every id; slots that free during
        # its script call are filled by the next read (`wait_after_read`).
        ids = [job_id.decode() for job_id in job_ids]
        free = self._capacity - self.job_counter
        looked, started = await self._starter.start(ids, free)
        self._left_behind = looked < len(ids)
        # A running job keeps its place in the queue until it ends, so with more workers on
        # the lane than a read holds, a full read may be all jobs that others run: the next
        # read looks past it (arq's offset), any other read starts from the front again.
        full = len(ids) >= self.queue_read_limit
        if full and looked == len(ids) and len(started) < free:
            self._queue_read_offset += len(ids)
        else:
            self._queue_read_offset = 0
        for job in started:
            self.job_counter += 1
            task = self.loop.create_task(self._run(job, self._finisher))
            task.add_done_callback(functools.partial(self._job_ended, job.job_id))
            self.tasks[job.job_id] = task

    async def _run(self, job: Started, finisher: Finisher) -> None:
        """arq's `run_job` for a job `start_jobs` started (its try counted, its body read):
        run it, then write how it ended with the jobs that end meanwhile, shielded from
        cancellation as arq does. A failed write raises, and the next poll stops the worker
        with it as arq's would (the lane's supervisor builds another)."""
        ending = await self._call(job, finisher.keeps_results)
        await asyncio.shield(finisher.finish(ending))
        if self.burst and self.job_counter == 0:
            # The lane's last job is out of the queue now. Running jobs kept the queue from
            # being empty, so the worker may wait for work: ring it if it waits (a poll
            # delay late otherwise), and tell its next look not to.
            if self._on_doorbell:
                await ring(self.pool, [self.lane])
            else:
                self._last_ended = True

    async def _call(self, job: Started, keep_result: bool) -> Ending:
        """Run one started job's function as arq's `run_job` does, with its outcomes and
        counts; how it ended."""
        if job.body is None:
            arq_log.warning("job %s expired", job.job_id)
            self.jobs_failed += 1
            return Ending(job.job_id, "done")
        try:
            name, args, kwargs, enqueue_try, enqueued_ms = deserialize_job_raw(
                job.body, deserializer=self.job_deserializer
            )
        except SerializationError:
            arq_log.exception("deserializing job %s failed", job.job_id)
            self.jobs_failed += 1
            return Ending(job.job_id, "done")
        function = self.functions.get(name)
        job_try = max(job.job_try, enqueue_try or 0)
        if function is None or job_try > (
            self.max_tries if function.max_tries is None else function.max_tries
        ):
            arq_log.warning("job %s: function %r not found or out of tries", job.job_id, name)
            self.jobs_failed += 1
            return Ending(job.job_id, "done")
        timeout_s = self.job_timeout_s if function.timeout_s is None else function.timeout_s
        scope = asyncio.timeout(timeout_s)
        ctx = self._job_ctx(job, job_try, enqueued_ms, scope)
        started_ms = timestamp_ms()
        try:
            async with scope:
                result = await function.coroutine(ctx, *args, **kwargs)
        except Retry as retry:  # arq puts it back, due `defer_score` ms from now
            self.jobs_retried += 1
            if not retry.defer_score:
                return Ending(job.job_id, "again")
            late_ms = timestamp_ms() - job.score
            return Ending(job.job_id, "later", raise_ms=retry.defer_score + late_ms)
        except (asyncio.CancelledError, RetryJob):  # the worker stops: it runs again
            self.jobs_retried += 1
            return Ending(job.job_id, "again")
        except Exception as exc:  # noqa: BLE001 - arq's "failed": logged, ended
            arq_log.exception("%s:%s failed, %s: %s", job.job_id, name, type(exc).__name__, exc)
            self.jobs_failed += 1
            success, result = False, exc
        else:
            self.jobs_complete += 1
            success = True
        if not keep_result:
            return Ending(job.job_id, "done")
        kept = serialize_result(
            name, args, kwargs, job_try, enqueued_ms, success, result, started_ms,
            timestamp_ms(), f"{job.job_id}:{name}", self.queue_name, job_id=job.job_id,
            serializer=self.job_serializer,
        )  # fmt: skip
        return Ending(job.job_id, "done", result=kept or b"")

    def _job_ctx(
        self, job: Started, job_try: int, enqueued_ms: int, scope: asyncio.Timeout
    ) -> dict[str, Any]:
        """The job function's context, as arq's `run_job` builds it, with this worker's
        slot callbacks."""
        ctx = {
            **self.ctx,
            "job_id": job.job_id,
            "job_try": job_try,
            "enqueue_time": ms_to_datetime(enqueued_ms),
            "score": job.score,
            "release_slot": functools.partial(self.release_slot, job.job_id),
        }
        if self.claim_ahead:
            ctx["take_slot"] = functools.partial(self.take_slot, job.job_id, scope)
        return ctx

    async def take_slot(self, job_id: str, scope: asyncio.Timeout) -> None:
        """Wait for an agent slot for `job_id`, a job claimed ahead, outside its timeout
        `scope`; renew its in-progress key after a long wait."""
        if not self._agents.locked():
            await self._agents.acquire()  # free: returns at once
            self._holding.add(job_id)
            return
        loop = asyncio.get_running_loop()
        since, due = loop.time(), scope.when()
        scope.reschedule(None)
        try:
            await self._agents.acquire()
        finally:
            waited = loop.time() - since
            if due is not None:
                scope.reschedule(due + waited)
        self._holding.add(job_id)
        if waited > RENEW_AFTER_WAIT_S:
            expiry_ms = int(self.in_progress_timeout_s * 1000)
            with contextlib.suppress(RedisError, OSError):  # the claim's lease still guards it
                await self.pool.pexpire(in_progress_key_prefix + job_id, expiry_ms)

    def release_slot(self, job_id: str) -> None:
        """Free `job_id`'s slot before its task ends (its agent has returned); once only."""
        self._leave_agent_slot(job_id)
        if job_id not in self._released:
            self._released.add(job_id)
            self._free_slot()

    def _job_ended(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self._failed is None and not task.cancelled() and task.exception() is not None:
            self._failed = task
        self._leave_agent_slot(job_id)
        if job_id in self._released:
            self._released.discard(job_id)
        else:
            self._free_slot()

    def _leave_agent_slot(self, job_id: str) -> None:
        if job_id in self._holding:
            self._holding.discard(job_id)
            self._agents.release()

    def _free_slot(self) -> None:
        self.job_counter -= 1
        self._slot_freed.set()

    def _raise_failed(self) -> None:
        """Stop the worker with the error of a job's task that failed (its end not written).

        arq raises such an error from its poll, but only while the task is still in `tasks`:
        a job whose end was not written is read again at once, and its new task took the old
        one's place first. The error then went unseen, and the job was delivered again, a
        poll delay apart, for as long as Redis refused its end (a cluster, an ACL). Now it
        is raised before the next read and before the next start; a read already out when the
        task failed may still deliver the job once more (the database refuses its claim).
        """
        if self._failed is not None:
            self._failed.result()

    async def _poll_iteration(self) -> None:
        self._raise_failed()
        started = time.monotonic()
        self._read = 0
        self._left_behind = True  # until a start says otherwise (arq may not read at all)
        self._last_ended = False
        await super()._poll_iteration()
        if (
            self._read < self.queue_read_limit
            and not await self._burst_over()
            and not self._last_ended
        ):
            await self._wait_for_work(self.wait_s - (time.monotonic() - started))

    async def _burst_over(self) -> bool:
        """In burst mode, whether the lane's queue is empty: arq then ends the worker at once
        (it looks for itself next), and a wait for work would only delay the exit."""
        return self.burst and self._read == 0 and await self.pool.zcard(self.queue_name) == 0

    async def _wait_for_work(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        wait = wait_after_read(
            left_behind=self._left_behind,
            running=self.job_counter,
            max_jobs=self.max_jobs,
        )
        if wait == "nothing":
            return
        if wait == "work":
            self._on_doorbell = True
            try:
                await wait_for_work(self.pool, self.lane, timeout_s)
            finally:
                self._on_doorbell = False
            return
        self._slot_freed.clear()  # no await since the check: a job ending now sets it
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._slot_freed.wait()  # a running job ended: a slot is free


def wait_after_read(*, left_behind: bool, running: int, max_jobs: int) -> str:
    """What a lane worker waits for after a read of its queue that was not full: "slot"
    while `running` (jobs started and not yet released) keeps arq from reading (it reads
    only below `max_jobs`), "nothing" (read again at once) when its last start ran out of
    slots before the read's jobs and a slot has freed since, else "work" (the doorbell).

    The last case was the only one before: a slot that freed while a start's script call
    was out left the jobs behind it waiting for a ring that never came, a poll delay (0.5 s
    at the defaults) on a queue with work and free slots.

    >>> wait_after_read(left_behind=True, running=499, max_jobs=500)
    'nothing'
    >>> wait_after_read(left_behind=False, running=499, max_jobs=500)
    'work'
    >>> wait_after_read(left_behind=True, running=500, max_jobs=500)
    'slot'
    >>> wait_after_read(left_behind=False, running=600, max_jobs=500)  # claimed ahead
    'slot'
    """
    if running >= max_jobs:
        return "slot"
    return "nothing" if left_behind else "work"


class LaneSupervisor:
    """Keeps one lane's arq worker running across Redis faults and unexpected errors.

    When the worker stops on a fault it is logged, the supervisor pauses (see
    RESTART_PAUSE_S) and builds a new one. Jobs the old worker was running carry on to
    their recorded outcome and its Redis pool is closed once they end, so right after a
    fault a lane may briefly run more than `max_jobs` jobs.
    """

    def __init__(
        self,
        runtime: Runtime,
        lane: str,
        *,
        burst: bool,
        stopping: asyncio.Event,
        reconnected: asyncio.Event,
    ) -> None:
        self.runtime = runtime
        self.lane = lane
        self.burst = burst
        self.stopping = stopping
        self.reconnected = reconnected
        self.worker: Worker | None = None
        self.restarts = 0
        # True from the moment arq connected until its worker stops (readiness, observe/probes.py).
        self.polling = False
        self._retiring: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Run the lane until it is drained, or (burst) until its queue is empty."""
        pause = RESTART_PAUSE_S[0]
        while not self.stopping.is_set():
            # No await between this check and async_run creating arq's main task, so a
            # drain signal always finds a worker it can stop.
            worker = self.worker = self._new_worker()
            started = time.monotonic()
            try:
                await worker.async_run()
                return  # burst mode: the queue is empty
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled ourselves
                return  # arq ended its main loop: a drain finished
            except Exception as exc:  # noqa: BLE001 - a fault restarts the lane, never the process
                self.worker = None
                self.polling = False
                self.runtime.metrics.lane_restarted(self.lane)
                self._retire(worker)
                if self.stopping.is_set():
                    return
                if time.monotonic() - started >= HEALTHY_RUN_S:
                    pause = RESTART_PAUSE_S[0]
                self._log_fault(exc, pause)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), pause)
            pause = min(pause * 2, RESTART_PAUSE_S[1])
            self.restarts += 1

    def drain(self, signum: signal.Signals) -> None:
        """Stop taking jobs; running ones get the lane's timeout to finish."""
        self.polling = False  # not ready: send no more work here
        if self.worker is not None:
            self.worker.handle_sig_wait_for_completion(signum)

    async def finish(self, grace_s: float) -> None:
        """Close the current worker, and give the jobs of replaced workers `grace_s`."""
        if self.worker is not None:
            await close_worker(self.worker)
            self.worker = None
        if self._retiring:
            _, late = await asyncio.wait(self._retiring, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def _new_worker(self) -> Worker:
        config = worker_settings(self.runtime, self.lane, burst=self.burst)
        return LaneWorker(
            **config,
            lane=self.lane,
            claim_ahead=self.runtime.settings.claim_ahead_of(self.lane),
            on_startup=self._connected,
        )

    async def _connected(self, ctx: dict[str, Any]) -> None:
        # arq's on_startup: Redis answered. After a fault, Redis may have lost jobs (a
        # restart without persistence): wake recovery now rather than at its next tick.
        # Setting an event cannot raise, so this hook cannot stop the worker.
        self.polling = True
        if self.restarts:
            log.info("lane_worker_reconnected", lane=self.lane, restarts=self.restarts)
            self.reconnected.set()

    def _retire(self, worker: Worker) -> None:
        task = asyncio.create_task(_close_when_idle(worker))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _log_fault(self, exc: Exception, pause: float) -> None:
        if isinstance(exc, RedisError | OSError):
            log.warning(
                "lane_worker_lost_redis",
                lane=self.lane,
                error=f"{type(exc).__name__}: {describe_redis_error(exc, self.runtime.settings)}",
                restart_in_s=pause,
            )
        else:
            log.error("lane_worker_failed", lane=self.lane, restart_in_s=pause, exc_info=exc)


async def _close_when_idle(worker: Worker) -> None:
    """Let a replaced worker's running jobs end, then close it."""
    try:
        await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
    finally:
        await close_worker(worker)


async def close_worker(worker: Worker) -> None:
    """Close an arq worker whose jobs have ended; a dead Redis does not stop it."""
    try:
        await worker.close()
    except Exception as exc:  # noqa: BLE001 - closing must not fail the shutdown
        log.warning("worker_close_failed", error=f"{type(exc).__name__}: {exc}")
        pool = getattr(worker, "_pool", None)  # arq keeps it when close() fails midway
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.aclose()
