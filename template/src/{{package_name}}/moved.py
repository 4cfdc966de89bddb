"""Old import paths of modules that moved, kept for one release (template-owned:
copier-agent-worker).

A module left at its old path is three lines: a `__getattr__` that asks `forward` for the name
from the module's new home. Code that imports the old path keeps working and is told, once per
place, where the name lives now; the file itself stays so that an edit made to it meets the
move as a conflict in `copier update`, never a silent loss.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def forward(old: str, new: str, name: str) -> Any:
    """`name` from module `new`, for code that still imports it from `old`, with a
    DeprecationWarning that points at the caller of the old module's `__getattr__`.

    Only the new module's own public names: a tool probing for others (pytest looks up
    `pytest_plugins` in every module it collects) gets the usual AttributeError, no warning.
    """
    home = importlib.import_module(new)
    if name.startswith("_") or not hasattr(home, name):
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    warnings.warn(
        f"{old}.{name} moved to {new}; import it from there", DeprecationWarning, stacklevel=3
    )
    return getattr(home, name)
