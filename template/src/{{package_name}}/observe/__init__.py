"""What the service tells about itself (template-owned: copier-agent-worker).

`logs.py` (structured logs), `metrics.py` (the Prometheus series), `stats.py` (the service's
numbers, read by `status`, the API, the console and the gauges), `tracing.py` (optional
OpenTelemetry spans), `doctor.py` (health checks), `probes.py` (liveness and readiness) and
`http_server.py` (`/metrics`, `/livez`, `/readyz` in the worker's loop). Each is imported by
its own path (`<package>.observe.stats`); this package's face imports nothing, so logging can
be set up without loading the rest.
"""
