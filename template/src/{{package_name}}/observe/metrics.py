"""Prometheus metrics of one worker process and of the whole service (template-owned).

Names are the same in every service rendered from copier-agent-worker (`agent_worker_*`),
so one dashboard and one rule file serve them all; Prometheus' own `job` and `instance`
labels tell services and processes apart.

Two kinds of series:
- this process: counters and histograms fed by the runner at two points of its pipeline
  (the claim, and after the outcome is recorded), by recovery and by the lane supervisors;
- the whole service: gauges read from the database through `stats.read_service_stats`
  (the queries `stats` prints) and from Redis, at most once per `SERVICE_READ_S` however
  often Prometheus scrapes.

Each runtime has its own `CollectorRegistry`, so several runtimes (tests) never share series.
A worker process that `worker --processes N` started (supervisor.py) runs in Prometheus'
multiprocess mode: its series go to files the supervisor adds up and serves, and the
service-wide gauges are the supervisor's alone.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from arq.worker import Retry
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..states import JobState
from .stats import lane_depths, read_service_stats

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..queries import Job
    from ..queue import JobQueue
    from ..recovery import ReconcileReport
    from ..webhooks import Sent

log = structlog.get_logger("metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
# The database and Redis are read for the service-wide gauges at most this often.
SERVICE_READ_S = 5.0
# A scrape waits at most this long for those reads, then serves the last values.
SERVICE_READ_TIMEOUT_S = 3.0
# Seconds: agent jobs run from well under a second to half an hour.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
COST_BUCKETS = (0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 100)
# What a finished run is counted as when the runner ends without a recorded state.
RETRIED = "retried"
NOT_RECORDED = "not_recorded"
# Set by the supervisor for its worker processes (prometheus_client reads it at import).
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def in_multiprocess_mode() -> bool:
    """Whether this process is a supervised worker, writing its series for the supervisor."""
    return bool(os.environ.get(MULTIPROCESS_ENV))


def started_marker(directory: str | Path, pid: int) -> Path:
    """The file a supervised worker writes into its supervisor's `directory` once its runtime
    is open and its lanes start: how the supervisor knows it is up (`/readyz`)."""
    return Path(directory) / f"started-{pid}"


class Metrics:
    """Every `agent_worker_*` series of one worker process."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.jobs_finished = Counter(
            "agent_worker_jobs_finished",
            "Runs that ended, by the state they left the job in (retried: a try that failed "
            "and will run again; lease_lost: another worker took the job over)",
            ["agent", "lane", "state"],
            registry=registry,
        )
        self.job_duration = Histogram(
            "agent_worker_job_duration_seconds",
            "Run time of one try, claim to recorded outcome",
            ["agent", "lane"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "agent_worker_job_queue_wait_seconds",
            "Time from when a delivery was due (its push, or the end of a retry's or deferred "
            "job's wait) to its claim",
            ["lane"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.jobs_running = Gauge(
            "agent_worker_jobs_running",
            "Jobs this process runs now (under a supervisor: its processes')",
            ["lane"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.claims_refused = Counter(
            "agent_worker_claims_refused",
            "Deliveries the database refused to run (already running elsewhere, finished, or "
            "not due yet)",
            registry=registry,
        )
        self.paid_calls = Counter(
            "agent_worker_paid_calls",
            "Paid calls, by outcome (charged, reused: a stored result returned again, "
            "not_charged, in_doubt)",
            ["agent", "outcome"],
            registry=registry,
        )
        self.job_costs = Histogram(
            "agent_worker_job_cost_usd",
            "What a finished job of a paid agent spent over all its attempts (its closed and "
            "in-doubt paid calls), in dollars",
            ["agent"],
            buckets=COST_BUCKETS,
            registry=registry,
        )
        self.recovered = Counter(
            "agent_worker_recovered",
            "What recovery did, by action (pushed, requeued, in_doubt, dead_lettered, "
            "replies_sent)",
            ["action"],
            registry=registry,
        )
        self.limit_waits = Counter(
            "agent_worker_limit_waits",
            "Times a job found its agent's limit full (limit agent:NAME; the job waits in "
            "queued, using no attempt) or a call found a named limit full (call:NAME)",
            ["limit"],
            registry=registry,
        )
        self.lane_restarts = Counter(
            "agent_worker_lane_restarts",
            "Times a lane's arq worker was rebuilt after a Redis fault or an error",
            ["lane"],
            registry=registry,
        )
        self.webhook_sends = Counter(
            "agent_worker_webhook_sends",
            "Webhook notifications this process sent, by endpoint and outcome (sent; failed: "
            "the receiver did not answer 2xx, tried again with backoff)",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.process_start = Gauge(
            "agent_worker_process_start_time_seconds",
            "When this worker process started (Unix time); a change is a restart",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.process_start.set(time.time())
        # `run`'s series of each agent and lane, looked up once: `labels` costs as much as
        # the rest of `run` together.
        self._run_series: dict[tuple[str, str], _RunSeries] = {}
        # A supervised process leaves the service-wide gauges to its supervisor.
        self.service = None if in_multiprocess_mode() else ServiceGauges(registry)

    # The runner's two points ----------------------------------------------------------------

    @contextmanager
    def run(self, job: Job, *, due_ms: int | None = None) -> Iterator[RunRecord]:
        """Around one claimed run: the claim is observed on entry, the recorded state on
        exit (`RunRecord.state`; an arq `Retry` counts as a retried try).

        `due_ms` is when the delivery became due (arq's queue score, in Unix ms: the push,
        or the end of a retry's or a deferred job's wait); without it, the job's creation.
        """
        if due_ms:
            wait = time.time() - due_ms / 1000
        else:
            wait = (datetime.now(UTC) - job.created_at).total_seconds()
        series = self._series_of(job.agent, job.lane)
        series.queue_wait.observe(max(wait, 0.0))
        series.running.inc()
        record = RunRecord()
        started = time.perf_counter()
        try:
            yield record
        except Retry:
            record.state = record.state or RETRIED
            raise
        finally:
            series.running.dec()
            series.duration.observe(time.perf_counter() - started)
            state = record.state or NOT_RECORDED
            finished = series.finished.get(state)
            if finished is None:
                finished = series.finished[state] = self.jobs_finished.labels(
                    job.agent, job.lane, state
                )
            finished.inc()

    def _series_of(self, agent: str, lane: str) -> _RunSeries:
        series = self._run_series.get((agent, lane))
        if series is None:
            series = self._run_series[agent, lane] = _RunSeries(
                self.queue_wait.labels(lane),
                self.jobs_running.labels(lane),
                self.job_duration.labels(agent, lane),
            )
        return series

    def claim_refused(self) -> None:
        self.claims_refused.inc()

    # Other process events -------------------------------------------------------------------

    def paid_call(self, agent: str, outcome: str) -> None:
        self.paid_calls.labels(agent, outcome).inc()

    def job_cost(self, agent: str, usd: Decimal) -> None:
        """A paid agent's finished job and its spend. The record keeps integer micro-dollars;
        Prometheus keeps floats, so this is the one place money becomes one."""
        self.job_costs.labels(agent).observe(float(usd))

    def limit_wait(self, limit: str) -> None:
        self.limit_waits.labels(limit).inc()

    def reconciled(self, report: ReconcileReport) -> None:
        """Count what one recovery pass changed."""
        for action in (
            "pushed",
            "requeued",
            "in_doubt",
            "dead_lettered",
            "stopped",
            "replies_sent",
            "resumed",
            "past_deadline",
            "pruned",
        ):
            count = getattr(report, action)
            if count:
                self.recovered.labels(action).inc(count)

    def lane_restarted(self, lane: str) -> None:
        self.lane_restarts.labels(lane).inc()

    def webhook_sent(self, sent: Sent) -> None:
        outcome = "sent" if sent.error is None else "failed"
        self.webhook_sends.labels(sent.due.endpoint, outcome).inc()

    # Exposition -----------------------------------------------------------------------------

    async def render(self, engine: AsyncEngine, queue: JobQueue, lanes: Iterable[str]) -> bytes:
        """The text Prometheus scrapes, with the service-wide gauges brought up to date from
        the database behind `engine` and the Redis of `queue` (its `lanes`)."""
        if self.service is not None:
            await self.service.refresh(engine, queue, lanes)
        return generate_latest(self.registry)


@dataclass
class RunRecord:
    """The state a run left its job in, set by the runner once the outcome is written."""

    state: str | None = None


@dataclass
class _RunSeries:
    """The series `Metrics.run` feeds for one agent and lane (`labels`' children)."""

    queue_wait: Histogram
    running: Gauge
    duration: Histogram
    finished: dict[str, Counter] = field(default_factory=dict)  # by recorded state


class ServiceGauges:
    """Gauges of the whole service, read from the database and Redis and cached."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Gauge(
            "agent_worker_jobs",
            "Jobs in the database, by state (completed and cancelled past 100,000 jobs: "
            "PostgreSQL's estimate)",
            ["state"],
            registry=registry,
        )
        self.oldest_queued = Gauge(
            "agent_worker_oldest_queued_age_seconds",
            "Seconds the longest-waiting due queued job of each lane has been due "
            "(0 when none is due; delayed and backing-off jobs are agent_worker_scheduled_jobs)",
            ["lane"],
            registry=registry,
        )
        self.scheduled = Gauge(
            "agent_worker_scheduled_jobs",
            "Queued jobs not due yet per lane: delayed, backing off or deferred",
            ["lane"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "agent_worker_queue_depth",
            "Job ids waiting in each lane's Redis queue (due or deferred)",
            ["lane"],
            registry=registry,
        )
        self.spend_today = Gauge(
            "agent_worker_spend_today_usd",
            "Spent plus reserved today (UTC) per agent ('*': the global cap)",
            ["agent"],
            registry=registry,
        )
        self.spend_cap = Gauge(
            "agent_worker_spend_cap_usd",
            "Daily cap per agent ('*': the global cap)",
            ["agent"],
            registry=registry,
        )
        self.replies_unsent = Gauge(
            "agent_worker_replies_unsent", "Replies recorded but not sent yet", registry=registry
        )
        self.webhooks_unsent = Gauge(
            "agent_worker_webhooks_unsent",
            "Webhook notifications recorded but not sent yet (failed: given up after "
            "three days of failed sends)",
            ["state"],
            registry=registry,
        )
        self.redis_used = Gauge(
            "agent_worker_redis_memory_used_bytes", "Redis used_memory", registry=registry
        )
        self.redis_max = Gauge(
            "agent_worker_redis_maxmemory_bytes",
            "Redis maxmemory (0: no limit set)",
            registry=registry,
        )
        self.read_errors = Counter(
            "agent_worker_service_read_errors",
            "Failed reads of the service-wide gauges (the last values are served)",
            ["source"],
            registry=registry,
        )
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self, engine: AsyncEngine, queue: JobQueue, lanes: Iterable[str]) -> None:
        """Read the database and Redis unless they were read in the last SERVICE_READ_S."""
        async with self._lock:
            if time.monotonic() - self._read_at < SERVICE_READ_S:
                return
            self._read_at = time.monotonic()
            lanes = list(lanes)
            await self._read_database(engine, lanes)
            await self._read_redis(queue, lanes)

    async def _read_database(self, engine: AsyncEngine, lanes: list[str]) -> None:
        try:
            async with asyncio.timeout(SERVICE_READ_TIMEOUT_S):
                async with engine.connect() as conn:
                    stats = await read_service_stats(conn, causes=False)
        except Exception as exc:  # noqa: BLE001 - a scrape never fails on a database fault
            self.read_errors.labels("database").inc()
            log.warning("metrics_database_read_failed", error=f"{type(exc).__name__}: {exc}")
            return
        for state in JobState:
            self.jobs.labels(state.value).set(stats.jobs_by_state.get(state.value, 0))
        for lane in lanes:
            self.oldest_queued.labels(lane).set(stats.oldest_queued_age_s(lane) or 0.0)
            self.scheduled.labels(lane).set(stats.scheduled.get(lane, 0))
        for cap in stats.caps:
            # Gauges are floats; the Decimal stays exact up to the cent in any real cap.
            self.spend_today.labels(cap.agent).set(float(cap.spent_usd + cap.reserved_usd))
            self.spend_cap.labels(cap.agent).set(float(cap.cap_usd))
        self.replies_unsent.set(stats.unsent_replies)
        self.webhooks_unsent.labels("unsent").set(stats.webhooks.unsent)
        self.webhooks_unsent.labels("failed").set(stats.webhooks.failed)

    async def _read_redis(self, queue: JobQueue, lanes: list[str]) -> None:
        try:
            async with asyncio.timeout(SERVICE_READ_TIMEOUT_S):
                depths = await lane_depths(queue, lanes)
                memory = await queue.memory()
        except Exception as exc:  # noqa: BLE001 - a scrape never fails on a Redis fault
            self.read_errors.labels("redis").inc()
            log.warning("metrics_redis_read_failed", error=f"{type(exc).__name__}: {exc}")
            return
        for lane, depth in depths.items():
            self.queue_depth.labels(lane).set(depth)
        if memory is None:  # this Redis user may not run INFO (`doctor` says so): unknown
            self.redis_used.set(math.nan)
            self.redis_max.set(math.nan)
        else:
            self.redis_used.set(memory.used_bytes)
            self.redis_max.set(memory.maxmemory_bytes)


def exported_names(metrics: Metrics) -> set[str]:
    """Every series name `/metrics` can carry (with `_total`, `_bucket`, ... suffixes)."""
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
    return names
