"""Limits: what may run at once and how fast, across every worker (template-owned:
copier-agent-worker).

Two kinds: agent limits (`max_concurrent`, `max_concurrent_per_owner`) hold a job before its
claim (`gate.py`); named limits (the answer `limits`, in `catalog.LIMITS`) hold calls inside a
job (`calls.py`: `ctx.limit(...)`, `ctx.paid_call(..., limit=...)`). Both are held in Redis
by `limiter.py`; `upstream.py` reads a provider's own "too many requests" wait.

`<package>.limits` keeps every name it had when it was one module. A `limits.py` left beside
this folder (from an update, or a copy of the old file) would be silently shadowed by it:
importing this package refuses to go on while one is there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .calls import SLOT_POLL_S, CallLimits, WaitObserver, pause_s
from .limiter import (
    KEY_PREFIX,
    PERIOD_MS,
    WAITING_RECENT_S,
    Concurrency,
    Grant,
    LimitConfig,
    Limiter,
    Slot,
    agent_slots,
    note_waiting,
    usage,
    waiting_key,
)

__all__ = [
    "KEY_PREFIX",
    "PERIOD_MS",
    "SLOT_POLL_S",
    "WAITING_RECENT_S",
    "CallLimits",
    "Concurrency",
    "Grant",
    "LimitConfig",
    "Limiter",
    "Slot",
    "WaitObserver",
    "agent_slots",
    "note_waiting",
    "pause_s",
    "usage",
    "waiting_key",
]


def leftover_module(package_dir: Path) -> Path | None:
    """The old `limits.py` beside this folder, if one is still there."""
    old = package_dir.with_name("limits.py")
    return old if old.exists() else None


_LEFTOVER = leftover_module(Path(__file__).resolve().parent)
if _LEFTOVER is not None:
    sys.stderr.write(
        f"error: move your changes out of {_LEFTOVER} into the limits/ folder beside it, then "
        "delete the file; the limits/ package shadows it, so it is never imported\n"
    )
    raise SystemExit(2)
