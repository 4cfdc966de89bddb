"""Where a new job of each agent goes: its lane and how many attempts it gets
(template-owned: copier-agent-worker).

The registry works the routes out once per process (registry.py: an agent's own
`max_attempts`, else the answered default); whatever makes jobs (submit, child jobs,
schedules) reads them here, without knowing how agents are found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Route(NamedTuple):
    """The lane a job of one agent is queued on, the attempts it may use, its budget and
    its run deadline."""

    lane: str
    max_attempts: int
    # Micro-dollars a job of it may spend in all (its agent's `job_budget_usd`), or None.
    budget_micros: int | None = None
    # Seconds a job of it has from submit to a terminal state (its agent's `deadline_s`).
    deadline_s: int | None = None


# Each agent's route, by agent name.
Routes = Mapping[str, Route]
