"""OpenTelemetry traces of submits and runs (template-owned: copier-agent-worker).

Optional: needs the `otel` extra and is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set
(or a test installs a provider with `use_provider`). A submit makes a PRODUCER span and
stores its W3C trace context in the job row; each run makes a CONSUMER span
`process <lane>` whose parent is that context, so a run joins its submit's trace even in
another process, hours later. Span attributes follow the messaging conventions
(`messaging.system`, `messaging.destination.name`, `messaging.message.id` = the job id),
plus the agent and the attempt. Off, every function here costs one check and does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..queries import Job

TRACER_NAME = __name__.split(".", 1)[0]
MESSAGING_SYSTEM = "arq"

_provider: Any = None  # set by use_provider() or, once, by _configure() from the environment


def use_provider(provider: Any) -> None:
    """Trace through `provider` (an SDK TracerProvider); None turns tracing off again."""
    global _provider
    _provider = provider


def _tracer() -> Any:
    """The tracer when tracing is on, else None."""
    if _provider is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None  # off: OpenTelemetry is not even imported
    if not _installed():
        return None
    if _provider is None:
        _configure()
    return None if _provider is None else _provider.get_tracer(TRACER_NAME)


@cache
def _installed() -> bool:
    """Whether the `otel` extra is installed; asked only once tracing could be on, so that a
    process that does not trace never loads OpenTelemetry."""
    try:
        import opentelemetry.propagate
        import opentelemetry.trace  # noqa: F401 - whether they import is the question
    except ImportError:  # the `otel` extra is not installed: tracing stays off
        return False
    return True


def _configure() -> None:
    """A provider exporting over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (the SDK reads the
    standard OTEL_* variables: service name, headers, sampler)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": TRACER_NAME.replace("_", "-")})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use_provider(provider)


class Submit:
    """The PRODUCER span of one submit: `context` goes into the job row; the job id is set
    on the span once the row has it."""

    def __init__(self, span: Any, context: dict[str, str] | None) -> None:
        self._span = span
        self.context = context

    def recorded(self, job_id: str) -> None:
        if self._span is not None:
            self._span.set_attribute("messaging.message.id", job_id)


@contextmanager
def submit_span(agent: str, lane: str, *, jobs: int = 1) -> Iterator[Submit]:
    """Around recording and queueing a job (or `jobs` jobs sent together)."""
    tracer = _tracer()
    if tracer is None:
        yield Submit(None, None)
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": lane,
        "messaging.operation.type": "send",
        "agent_worker.agent": agent,
    }
    if jobs > 1:
        attributes["messaging.batch.message_count"] = jobs
    with tracer.start_as_current_span(
        f"send {lane}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Submit(span, carrier or None)


@contextmanager
def run_span(job: Job) -> Iterator[None]:
    """Around one run of `job`: a CONSUMER span whose parent is the submit's context."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(job.trace_context) if job.trace_context else None
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": job.lane,
        "messaging.operation.type": "process",
        "messaging.message.id": job.id,
        "agent_worker.agent": job.agent,
        "agent_worker.attempt": job.attempts,
    }
    with tracer.start_as_current_span(
        f"process {job.lane}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ):
        yield
