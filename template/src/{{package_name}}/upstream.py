"""Moved to `limits/upstream.py` (template-owned: copier-agent-worker).

This path answers for one release, with a DeprecationWarning (moved.py): import from
`<package>.limits.upstream`.
"""

from __future__ import annotations

from typing import Any

from .moved import forward


def __getattr__(name: str) -> Any:
    return forward(__name__, f"{__package__}.limits.upstream", name)
