"""Admin command line: `<slug> --help`, one module per command group
(template-owned: copier-agent-worker).

Humans get tables, scripts get `--json`. Bad input is one line on stderr and exit code 2;
a service that cannot be reached is one line and exit code 1. Never a traceback: an
unexpected error is one line and exit code 1 too, with the traceback only under `-v`.
"""

from __future__ import annotations

import gc
import sys

import typer

from . import approvals, audit, db, dlq, jobs, run, schedules, spend, status, tokens, web
from .app import app, options

__all__ = ["app", "main"]
# The command groups register themselves on `app` when imported.
_GROUPS = (approvals, audit, db, dlq, jobs, run, schedules, spend, status, tokens, web)


def main() -> None:
    """Console-script entry point."""
    # No garbage collection while the command loads its modules: the collector would walk
    # the growing heap of classes and functions again and again (about a third of an empty
    # `worker --burst`, docs/SCALING.md) and find nearly nothing. `support.loaded` turns it
    # back on once the command's work starts; a command that never gets there is short.
    gc.disable()
    try:
        app()
    except Exception as exc:
        if options.verbose:
            raise
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        typer.echo(
            f"error: unexpected {type(exc).__name__}: {first} "
            "(a bug: run the command again with -v for the traceback and report it)",
            err=True,
        )
        sys.exit(1)
