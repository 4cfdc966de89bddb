"""Composition root: one arq worker per lane, sharing a runtime (template-owned).

Each lane is its own arq queue with its own `job_timeout`, taken from the longest timeout
of its agents; arq's in-progress key lives that long plus 10 s, which is how long a job
whose worker crashed waits before another worker may take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Iterable
from typing import Any

import structlog
from arq.worker import Worker, func

from . import catalog
from .db import create_engine
from .queue import JobQueue, deserialize, queue_name, redis_settings, serialize
from .recovery import reconcile
from .retry import RetryPolicy
from .runner import Runtime, run_job
from .settings import Settings
from .submit import load_agents

log = structlog.get_logger("worker")

# Seconds arq adds to a lane's timeout so the runner can record a timeout itself.
RECORD_GRACE_S = 5
# arq counts every start, re-deliveries included; our own attempt limit is the real one.
ARQ_MAX_TRIES = 10_000


def lane_timeouts(settings: Settings) -> dict[str, int]:
    """Each lane's job timeout: the answers, overridden by `<PREFIX>LANE_TIMEOUTS`."""
    return {**catalog.LANES, **settings.lane_timeouts}


async def open_runtime(settings: Settings) -> Runtime:
    """Connect to the database and Redis, and discover agents."""
    queue = await JobQueue.connect(settings)
    return Runtime(
        settings=settings,
        engine=create_engine(settings),
        queue=queue,
        agents=load_agents(settings),
        policy=RetryPolicy(
            max_attempts=catalog.MAX_ATTEMPTS,
            base_s=settings.backoff_base_s or catalog.BACKOFF_BASE_S,
            max_s=settings.backoff_max_s or catalog.BACKOFF_MAX_S,
        ),
        worker_name=f"{socket.gethostname()}:{os.getpid()}",
        lane_timeouts=lane_timeouts(settings),
    )


async def close_runtime(runtime: Runtime) -> None:
    await runtime.queue.close()
    await runtime.engine.dispose()


def worker_settings(runtime: Runtime, lane: str, *, burst: bool = False) -> dict[str, Any]:
    """The arq WorkerSettings of one lane."""
    timeout = runtime.lane_timeouts[lane]
    settings = runtime.settings
    return {
        "functions": [func(run_job, name="run_job", timeout=timeout + RECORD_GRACE_S)],
        "queue_name": queue_name(lane),
        "redis_settings": redis_settings(settings),
        "job_serializer": serialize,
        "job_deserializer": deserialize,
        "max_jobs": settings.max_jobs,
        "poll_delay": settings.poll_delay_s,
        "keep_result": settings.keep_result_s,
        "max_tries": ARQ_MAX_TRIES,
        "burst": burst,
        "handle_signals": False,
        "job_completion_wait": timeout + RECORD_GRACE_S,
        "ctx": {"runtime": runtime},
        "log_results": False,
    }


async def run_lanes(settings: Settings, lanes: Iterable[str], *, burst: bool = False) -> None:
    """Run the given lanes until stopped (or, with `burst`, until their queues are empty)."""
    runtime = await open_runtime(settings)
    lanes = list(lanes)
    unknown = sorted(set(lanes) - set(runtime.lane_timeouts))
    if unknown:
        await close_runtime(runtime)
        raise ValueError(
            f"unknown lane {unknown[0]!r}; lanes: {', '.join(sorted(runtime.lane_timeouts))}"
        )
    await reconcile_guarded(runtime)
    workers = [Worker(**worker_settings(runtime, lane, burst=burst)) for lane in lanes]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, _drain, workers, signum)
    recovery = None if burst else asyncio.create_task(_recover_periodically(runtime))
    log.info("worker_started", lanes=lanes, burst=burst, worker=runtime.worker_name)
    try:
        await asyncio.gather(*(w.async_run() for w in workers), return_exceptions=True)
    finally:
        if recovery is not None:
            recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recovery
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        for worker in workers:
            try:
                await worker.close()
            except Exception as exc:  # noqa: BLE001 - closing must reach every worker
                log.warning("worker_close_failed", error=f"{type(exc).__name__}: {exc}")
        await close_runtime(runtime)
        log.info("worker_stopped", worker=runtime.worker_name)


def _drain(workers: list[Worker], signum: int) -> None:
    log.info("worker_draining", signal=signal.Signals(signum).name)
    for worker in workers:
        worker.handle_sig_wait_for_completion(signal.Signals(signum))


async def reconcile_guarded(runtime: Runtime) -> None:
    """Run recovery once; a failure is logged and never stops the worker."""
    try:
        await reconcile(runtime.engine, runtime.queue)
    except Exception as exc:  # noqa: BLE001 - recovery retries on its next run
        log.warning("reconcile_failed", error=f"{type(exc).__name__}: {exc}")


async def _recover_periodically(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.settings.recovery_interval_s)
        await reconcile_guarded(runtime)
