"""Admin command line: `<slug> --help`, one module per command group
(template-owned: copier-agent-worker).

Humans get tables, scripts get `--json`. Bad input is one line on stderr and exit code 2;
a service that cannot be reached is one line and exit code 1. Never a traceback: an
unexpected error is one line and exit code 1 too, with the traceback only under `-v`.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

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
    if "structlog" not in sys.modules and "rich" not in sys.modules:
        sys.meta_path.insert(0, StructlogWithoutRich())
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


class StructlogWithoutRich(importlib.abc.MetaPathFinder):
    """Loads structlog, the first time a command imports it, with rich hidden from it.

    structlog imports rich whenever it is installed (Typer requires it), for console
    tracebacks this service formats plainly (observe/logs.py): about 30 ms of the start of
    every command that logs (docs/SCALING.md, "Start-up"). `main` installs this, so only the
    command line's processes change; rich itself still imports for whoever asks for it later
    (`recover`'s progress bar, Typer's help and errors).
    """

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "structlog":
            return None
        sys.meta_path.remove(self)  # once: the next import finds structlog as usual
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and "rich" not in sys.modules:
            spec.loader = _WithoutRich(spec.loader)
        return spec


class _WithoutRich(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # While structlog loads, `import rich` raises ImportError, as if rich were absent.
        sys.modules["rich"] = None  # type: ignore[assignment]
        try:
            self._loader.exec_module(module)
        finally:
            if sys.modules.get("rich", ...) is None:
                del sys.modules["rich"]
