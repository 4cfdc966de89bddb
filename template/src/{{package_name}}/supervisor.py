"""`worker --processes N`: N worker processes from one command, one `/metrics` (template-owned:
copier-agent-worker).

A worker process uses one core. The supervisor starts N of them (`python -m <package> worker`,
each serving every lane asked for, with its HTTP endpoint off) and keeps them running:

- **One endpoint.** The supervisor alone serves `/metrics`, `/livez` and `/readyz` on
  `<PREFIX>HTTP_PORT`. Its children run in Prometheus' multiprocess mode (each writes its
  series to files in a directory of the supervisor's), and `/metrics` adds them up: counters
  and histograms summed over the processes (a child that died keeps its counts), the jobs
  running summed over the live ones, the other gauges per process (a `pid` label). The
  service-wide gauges (jobs by state, queue depths, spend) are read once, by the supervisor,
  plus `agent_worker_processes` and `agent_worker_process_restarts_total`. `/readyz` is 200
  while every child is up: running, with its runtime open and its lanes started (a child
  writes a marker file into that directory then).
- **A child that dies is started again** after a pause that doubles from 1 s to 15 s (back to
  1 s after a run of a minute or more), as a lane's arq worker is (lanes.py).
- **SIGTERM or SIGINT drains them all**: each child gets the signal and drains as a single
  worker does (running jobs get their lane's timeout); the supervisor exits when the last
  one has, with 0 if every child exited cleanly. A child that exits 2 (its settings or
  agents are wrong, which a restart cannot mend) drains the others, and the supervisor
  exits 2.
- With `--burst`, each child stops when the queues are empty and none is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, multiprocess
from sqlalchemy.ext.asyncio import AsyncEngine

from .db import create_engine
from .observe.http_server import ProbeServer
from .observe.metrics import MULTIPROCESS_ENV, ServiceGauges, started_marker
from .queue import JobQueue
from .schema import check_schema_at_start
from .settings import ENV_PREFIX, Settings

log = structlog.get_logger("supervisor")

PACKAGE = __name__.rsplit(".", 1)[0]
PROCESSES_MAX = 256
RESTART_PAUSE_S = (1.0, 15.0)
HEALTHY_RUN_S = 60.0  # a child that ran this long starts again after the shortest pause
BAD_INPUT = 2  # a worker's exit code for bad settings or agents (cli/support.fail)


class ProcessCountError(ValueError):
    """`--processes` is not a whole number from 1 to 256 or `auto`."""


def process_count(text: str) -> int:
    """`--processes`: a whole number from 1 to 256, or `auto` (this machine's CPUs).

    >>> process_count("4")
    4
    """
    if text == "auto":
        return max(1, min(os.cpu_count() or 1, PROCESSES_MAX))
    if not text.isdigit() or not 1 <= int(text) <= PROCESSES_MAX:
        raise ProcessCountError(
            f"--processes must be a whole number from 1 to {PROCESSES_MAX} or auto (one per "
            f"CPU), not {text!r}"
        )
    return int(text)


@dataclass
class Child:
    """One worker process of the supervisor, started again when it dies."""

    number: int
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    pause_s: float = RESTART_PAUSE_S[0]
    exit_codes: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def up(self, directory: Path) -> bool:
        """Running, with its runtime open and its lanes started (its marker in `directory`)."""
        if self.process is None or self.process.returncode is not None:
            return False
        return started_marker(directory, self.process.pid).exists()


class Supervisor:
    """N worker processes for `lanes`, one HTTP endpoint (see the module docstring)."""

    def __init__(
        self, settings: Settings, lanes: Sequence[str], processes: int, *, burst: bool = False
    ) -> None:
        self.settings = settings
        self.lanes = list(lanes)
        self.burst = burst
        self.children = [Child(number) for number in range(1, processes + 1)]
        self.stopping = asyncio.Event()
        self.drained_by: int | None = None  # the signal that drains the children
        self.directory = Path(tempfile.mkdtemp(prefix=f"{PACKAGE}-metrics-"))
        self.registry = CollectorRegistry(auto_describe=True)
        # prometheus_client's multiprocess module has no type hints.
        multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
            self.registry, path=str(self.directory)
        )
        self.service = ServiceGauges(self.registry)
        self.alive = Gauge(
            "agent_worker_processes",
            "Worker processes of this supervisor (worker --processes), by state",
            ["state"],
            registry=self.registry,
        )
        self.restarted = Counter(
            "agent_worker_process_restarts",
            "Times a worker process of this supervisor died and was started again",
            registry=self.registry,
        )

    def command(self) -> list[str]:
        lanes = [part for lane in self.lanes for part in ("--lane", lane)]
        burst = ["--burst"] if self.burst else []
        return [sys.executable, "-m", PACKAGE, "worker", *lanes, *burst, "--processes", "1"]

    def environment(self) -> dict[str, str]:
        return {**os.environ, MULTIPROCESS_ENV: str(self.directory), f"{ENV_PREFIX}HTTP_PORT": "0"}

    async def run(self) -> int:
        """Run the children until a signal drains them (or, burst, until they all end); the
        exit code: 0 when every child's last exit was clean."""
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as ending:  # whatever fails, all is undone
            ending.callback(shutil.rmtree, self.directory, ignore_errors=True)
            engine = create_engine(self.settings)
            ending.push_async_callback(engine.dispose)
            # One line here, rather than one from each child.
            await check_schema_at_start(engine, self.settings.database_url)
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self._drain, signum)
                ending.callback(loop.remove_signal_handler, signum)
            queue = await JobQueue.connect(self.settings)
            ending.push_async_callback(queue.close)
            if not self.burst and self.settings.http_port != 0:
                server = self._server(engine, queue)
                ending.push_async_callback(server.close)
                await server.start()
            log.info("supervisor_started", processes=len(self.children), lanes=self.lanes)
            await asyncio.gather(*(self._keep(child) for child in self.children))
        last = [child.exit_codes[-1] if child.exit_codes else 1 for child in self.children]
        log.info("supervisor_stopped", exit_codes=last)
        if BAD_INPUT in last:
            return BAD_INPUT
        return 0 if set(last) == {0} else 1

    async def _keep(self, child: Child) -> None:
        """Run `child`, and start it again when it dies, until the drain (or its burst) ends."""
        while True:
            # Its own session: a terminal's Ctrl-C reaches the supervisor alone, which passes
            # it on once (a worker drains on the first signal it gets).
            child.process = await asyncio.create_subprocess_exec(
                *self.command(), env=self.environment(), start_new_session=True
            )
            child.started_at = time.monotonic()
            log.info("worker_process_started", number=child.number, pid=child.process.pid)
            code = await child.process.wait()
            if self.drained_by is not None and code == -self.drained_by:
                # Ended by the drain's signal itself: it came before the process had set up
                # its handlers (it had only just started), so it held no job.
                code = 0
            child.exit_codes.append(code)
            multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                child.process.pid, str(self.directory)
            )
            started_marker(self.directory, child.process.pid).unlink(missing_ok=True)
            if self.stopping.is_set() or self.burst:
                return
            if code == BAD_INPUT:  # its settings or agents are wrong: a restart cannot help
                log.error("worker_process_refused_to_start", number=child.number, exit_code=code)
                self._drain(signal.SIGTERM)
                return
            ran_s = time.monotonic() - child.started_at
            if ran_s >= HEALTHY_RUN_S:
                child.pause_s = RESTART_PAUSE_S[0]
            log.warning(
                "worker_process_died",
                number=child.number,
                pid=child.process.pid,
                exit_code=code,
                ran_s=round(ran_s, 1),
                restart_in_s=child.pause_s,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), child.pause_s)
            if self.stopping.is_set():
                return
            child.pause_s = min(child.pause_s * 2, RESTART_PAUSE_S[1])
            child.restarts += 1
            self.restarted.inc()

    def _drain(self, signum: int) -> None:
        log.info("supervisor_draining", signal=signal.Signals(signum).name)
        self.stopping.set()
        self.drained_by = self.drained_by or signum
        for child in self.children:
            if child.running and child.process is not None:
                child.process.send_signal(signum)

    def _server(self, engine: AsyncEngine, queue: JobQueue) -> ProbeServer:
        async def metrics_text() -> bytes:
            await self.service.refresh(engine, queue, self.lanes)
            running = sum(child.up(self.directory) for child in self.children)
            self.alive.labels("running").set(running)
            self.alive.labels("wanted").set(len(self.children))
            return generate_latest(self.registry)

        ready = ChildrenReady(self.children, self.directory)
        return ProbeServer(metrics_text, ready, self.settings.http_host, self.settings.http_port)


@dataclass
class ChildrenReady:
    """`/readyz` of the supervisor: ready while every child is up."""

    children: list[Child]
    directory: Path

    async def check(self) -> str | None:
        up = sum(child.up(self.directory) for child in self.children)
        if up == len(self.children):
            return None
        return f"{up} of {len(self.children)} worker processes up"
