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
    # Only the module's own public names: tools probing for others (pytest looks for
    # `pytest_plugins` in every module it collects) get the usual AttributeError, no warning.
    home = importlib.import_module(f"{__package__}.limits.gate")
    if name.startswith("_") or not hasattr(home, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to {home.__name__}; import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(home, name)
