"""Moved to `limits/gate.py` (template-owned: copier-agent-worker).

This path stays for one release so that code importing `<package>.gate` keeps working (with a
DeprecationWarning) and an edit made here meets the move as a conflict in `copier update`.
Import from `<package>.limits.gate`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = f"{__package__}.limits.gate"
    warnings.warn(
        f"{__name__}.{name} moved to {home}; import it from there", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(home), name)
