"""What `ctx.step`, `ctx.approval`, `ctx.spawn` and `ctx.wait_children` use for one run of
one job (template-owned: copier-agent-worker).

Each method is a memoized, recorded piece of the job (DESIGN §11), so a job may re-run from
the top at any time (a retry, a crash, a resume after `waiting`) without repeating work:
steps come back from `steps`, decisions from `approvals`, children from `jobs`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from . import approvals, children
from .approvals import Decision
from .children import ChildOutcome
from .queue import JobQueue
from .routes import Routes
from .steps import Steps
from .versions import NOTHING, Replay


@dataclass
class Durable:
    """The durable pieces of one run of one job."""

    engine: AsyncEngine
    job_id: str
    attempt: int
    routes: Routes  # where a spawned child goes, by agent
    queue: JobQueue | None = None
    # What this run reaches of the job's record (ctx.patched, version checks: versions.py).
    replay: Replay = field(default_factory=lambda: Replay(NOTHING, None, ""))

    async def reach(self, kind: str, name: str) -> None:
        """Note that the run reached recorded work `name` of `kind`; first record the
        `ctx.patched` answers given before it, so they are on record before it is."""
        self.replay.reach(kind, name)
        await self.record_patches()

    async def record_patches(self) -> None:
        """Record the `ctx.patched` answers this run gave and has not recorded yet."""
        await self.replay.save(self.engine, self.job_id, self.attempt)

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        return await Steps(self.engine, self.job_id, self.attempt).run(name, fn)

    async def approval(self, name: str, *, summary: str, timeout_s: float | None) -> Decision:
        return await approvals.request(
            self.engine, self.job_id, name, summary=summary, timeout_s=timeout_s
        )

    async def spawn(
        self, agent: str, payload: dict[str, Any], *, key: str, budget_micros: int | None = None
    ) -> str:
        return await children.spawn(
            self.engine,
            self.queue,
            parent_id=self.job_id,
            routes=self.routes,
            agent=agent,
            payload=payload,
            key=key,
            budget_micros=budget_micros,
        )

    async def wait_children(self) -> dict[str, ChildOutcome]:
        return await children.wait_children(self.engine, self.job_id)
