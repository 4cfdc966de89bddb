"""Admin command line: `<slug> --help`, one module per command group
(template-owned: copier-agent-worker).

Humans get tables, scripts get `--json`. Bad input is one line on stderr and exit code 2;
a service that cannot be reached is one line and exit code 1. Never a traceback.
"""

from __future__ import annotations

from . import approvals, audit, db, dlq, jobs, run, schedules, spend, status, tokens, web
from .app import app

__all__ = ["app", "main"]
# The command groups register themselves on `app` when imported.
_GROUPS = (approvals, audit, db, dlq, jobs, run, schedules, spend, status, tokens, web)


def main() -> None:
    """Console-script entry point."""
    app()
