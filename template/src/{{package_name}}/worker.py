"""The worker process: one runtime shared by the lanes it runs (template-owned).

`run_lanes` opens the runtime (database, Redis, the agents' registry, the gate and call
limits, metrics) and runs each lane under its supervisor (lanes.py). Around the lanes it
serves the HTTP probes, reconciles on a timer and at once when a lane reconnects to Redis,
fails queued and waiting jobs at their run deadline (every second), stops the running jobs
an operator cancels (cancels.py), runs the schedules, and drains on SIGINT/SIGTERM:
running jobs get their lane's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from . import cancels, catalog, deadlines, registry, schedules, webhooks
from .batched import BatchedWrites, PostgresBatchedWrites, SqliteBatchedWrites
from .db import create_engine
from .events import EventBuffer
from .lanes import RECORD_GRACE_S

# Importable from here as before lanes.py: bench/ builds its arq workers from a lane's
# settings, and bench/limits.py drives one lane with its supervisor.
from .lanes import LaneSupervisor as LaneSupervisor
from .lanes import worker_settings as worker_settings
from .limits import CallLimits, Limiter
from .limits.gate import Gate
from .observe.http_server import ProbeServer
from .observe.metrics import MULTIPROCESS_ENV, Metrics, in_multiprocess_mode, started_marker
from .observe.probes import Readiness
from .queue import JobQueue
from .recovery import reconcile
from .retry import RetryPolicy
from .runner import Runtime
from .schema import check_schema_at_start
from .settings import Settings
from .webhooks import Deliverer

log = structlog.get_logger("worker")


def lane_timeouts(settings: Settings) -> dict[str, int]:
    """Each lane's job timeout: the answers (raised by extra agent modules, registry.py),
    overridden by `<PREFIX>LANE_TIMEOUTS`."""
    return {**registry.load(settings).lane_timeouts, **settings.lane_timeouts}


async def open_runtime(settings: Settings) -> Runtime:
    """Connect to the database and Redis, and discover agents."""
    queue = await JobQueue.connect(settings)
    worker_name = f"{socket.gethostname()}:{os.getpid()}"
    engine = create_engine(settings)
    found = registry.load(settings)
    batched: BatchedWrites | None = None
    if settings.batch_writes:
        options: dict[str, Any] = {
            "worker": worker_name,
            "lease_s": settings.lease_s,
            "window_s": settings.batch_window_s,
            "versions": found.versions,
        }
        batched = (
            SqliteBatchedWrites(settings.database_url, **options)
            if settings.is_sqlite
            else PostgresBatchedWrites(
                settings.database_url, pooling=settings.database_pooling, **options
            )
        )
    metrics = Metrics()
    hooks = webhooks.of_engine(engine)
    limiter = Limiter(queue.pool)  # one set of registered scripts for the gate and the calls
    return Runtime(
        settings=settings,
        engine=engine,
        queue=queue,
        registry=found,
        policy=RetryPolicy(
            max_attempts=catalog.MAX_ATTEMPTS,
            base_s=settings.backoff_base_s or catalog.BACKOFF_BASE_S,
            max_s=settings.backoff_max_s or catalog.BACKOFF_MAX_S,
            max_deferrals=settings.max_deferrals,
        ),
        worker_name=worker_name,
        lane_timeouts=lane_timeouts(settings),
        batched=batched,
        gate=Gate(
            limiter, found.concurrency, found.routes, settings.lease_s, on_wait=metrics.limit_wait
        ),
        call_limits=CallLimits(limiter, found.limits, on_wait=metrics.limit_wait),
        metrics=metrics,
        events=EventBuffer(engine, keep=settings.events_per_job),
        deliverer=None if hooks is None else Deliverer(engine, hooks, on_sent=metrics.webhook_sent),
    )


async def close_runtime(runtime: Runtime) -> None:
    if runtime.events is not None:
        await runtime.events.close()
    await runtime.queue.close()
    if runtime.batched is not None:
        await runtime.batched.close()
    await runtime.engine.dispose()


async def _open_for(settings: Settings, lanes: list[str]) -> Runtime:
    """The runtime for `lanes`; ValueError for a lane no agent runs in, SchemaBehind for a
    database nobody upgraded."""
    runtime = await open_runtime(settings)
    unknown = sorted(set(lanes) - set(runtime.lane_timeouts))
    try:
        if unknown:
            raise ValueError(
                f"unknown lane {unknown[0]!r}; lanes: {', '.join(sorted(runtime.lane_timeouts))}"
            )
        await check_schema_at_start(runtime.engine, settings.database_url)
    except BaseException:
        await close_runtime(runtime)
        raise
    return runtime


async def run_lanes(settings: Settings, lanes: Iterable[str], *, burst: bool = False) -> None:
    """Run the given lanes until stopped (or, with `burst`, until their queues are empty)."""
    lanes = list(lanes)
    runtime = await _open_for(settings, lanes)
    stopping, reconnected = asyncio.Event(), asyncio.Event()
    supervisors = [
        LaneSupervisor(runtime, lane, burst=burst, stopping=stopping, reconnected=reconnected)
        for lane in lanes
    ]
    http: ProbeServer | None = None
    try:
        http = await serve_http(runtime, supervisors, burst=burst)
        await reconcile_guarded(runtime)
    except BaseException:  # a port in use, or cancelled while starting: close what is open
        if http is not None:
            await http.close()
        await close_runtime(runtime)
        raise
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, _drain, supervisors, stopping, signum)
    recovery = None if burst else asyncio.create_task(_recover_periodically(runtime, reconnected))
    sweep = None if burst else asyncio.create_task(_expire_deadlines(runtime))
    scheduler = None if burst else start_scheduler(runtime)
    stops = asyncio.create_task(cancels.watch(runtime.engine, runtime.queue, runtime.running))
    deliverer = runtime.deliverer
    sends = None if burst or deliverer is None else asyncio.create_task(deliverer.run())
    log.info(
        "worker_started",
        lanes=lanes,
        burst=burst,
        worker=runtime.worker_name,
        event_loop=type(loop).__module__.split(".")[0],  # "uvloop" or "asyncio"
        max_jobs={lane: settings.max_jobs_of(lane) for lane in lanes},
        claim_ahead={lane: settings.claim_ahead_of(lane) for lane in lanes},
    )
    tell_supervisor()
    try:
        await asyncio.gather(*(s.run() for s in supervisors))
    finally:
        for task in (recovery, sweep, scheduler, stops):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        grace = max(runtime.lane_timeouts[lane] for lane in lanes) + RECORD_GRACE_S
        await asyncio.gather(*(s.finish(grace) for s in supervisors))
        if sends is not None:  # after the drain: the jobs it settled are told at once
            sends.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sends
        if http is not None:
            await http.close()
        await close_runtime(runtime)
        log.info("worker_stopped", worker=runtime.worker_name)


def tell_supervisor() -> None:
    """Under `worker --processes N`, mark this process up for its supervisor (supervisor.py)."""
    if in_multiprocess_mode():
        started_marker(os.environ[MULTIPROCESS_ENV], os.getpid()).touch()


async def serve_http(
    runtime: Runtime, supervisors: list[LaneSupervisor], *, burst: bool
) -> ProbeServer | None:
    """Start `/metrics`, `/livez` and `/readyz` on `<PREFIX>HTTP_PORT`; None when the port is
    0 or the run is a burst (a batch run that ends by itself is no probe target)."""
    settings = runtime.settings
    if burst or settings.http_port == 0:
        return None
    server = probe_server(
        runtime,
        lambda: {s.lane: s.polling for s in supervisors},
        settings.http_host,
        settings.http_port,
    )
    await server.start()
    return server


def probe_server(
    runtime: Runtime, lanes_polling: Callable[[], Mapping[str, bool]], host: str, port: int
) -> ProbeServer:
    """The HTTP endpoint of one worker process, given the parts of `runtime` it reads."""
    readiness = Readiness(runtime.settings, runtime.engine, runtime.queue, lanes_polling)
    return ProbeServer(
        lambda: runtime.metrics.render(runtime.engine, runtime.queue, runtime.lane_timeouts),
        readiness,
        host,
        port,
    )


def start_scheduler(runtime: Runtime) -> asyncio.Task[None] | None:
    """Run the schedules (schedules.py) in this worker, when there are any."""
    found = runtime.registry
    if not found.schedules:
        return None
    ticks = schedules.run_scheduler(runtime.engine, runtime.queue, found.schedules, found.routes)
    return asyncio.create_task(ticks)


def _drain(supervisors: list[LaneSupervisor], stopping: asyncio.Event, signum: int) -> None:
    log.info("worker_draining", signal=signal.Signals(signum).name)
    stopping.set()
    for supervisor in supervisors:
        supervisor.drain(signal.Signals(signum))


async def reconcile_guarded(runtime: Runtime) -> None:
    """Run recovery once; a failure is logged and never stops the worker."""
    try:
        report = await reconcile(
            runtime.engine,
            runtime.queue,
            reply_steps=runtime.registry.reply_steps,
            keep_days=runtime.settings.retention_days,
        )
    except Exception as exc:  # noqa: BLE001 - recovery retries on its next run
        log.warning("reconcile_failed", error=f"{type(exc).__name__}: {exc}")
        return
    runtime.metrics.reconciled(report)


async def _recover_periodically(runtime: Runtime, reconnected: asyncio.Event) -> None:
    """Reconcile every `recovery_interval_s`, and at once when a lane reconnects to Redis."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reconnected.wait(), runtime.settings.recovery_interval_s)
        reconnected.clear()
        await reconcile_guarded(runtime)


async def _expire_deadlines(runtime: Runtime) -> None:
    """Fail queued and waiting jobs at their run deadline, looking every second
    (deadlines.py); a failure is logged and the next look tries again."""
    while True:
        await asyncio.sleep(deadlines.SWEEP_EVERY_S)
        try:
            await deadlines.expire_due(runtime.engine, now=datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("deadline_sweep_failed", error=f"{type(exc).__name__}: {exc}")
