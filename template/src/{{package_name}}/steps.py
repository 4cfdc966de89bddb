"""Durable steps: a job's work memoized per (job, name) (template-owned: copier-agent-worker).

`await ctx.step(name, fn)` calls `fn` and commits its JSON result as a `steps` row before the
agent goes on; a later run of the same job (a retry, or a run resumed after `waiting`) gets
the stored result back without calling `fn` again. So a job that re-runs from the top (DESIGN
§11) repeats no finished step. Like `paid_call`, a name is unique within its job: use one
name per distinct piece of work, and the same name for the same work on every run.

A step that raises stores nothing and runs again on the next attempt. A step that crashes
its worker after the work but before the commit runs again too: keep steps idempotent, and
put work that costs money in `ctx.paid_call`, which records before it calls.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import events
from .db import transaction
from .models import steps

NAME_MAX = 200
PATCHED = "patched:"  # the names of recorded ctx.patched answers (versions.py)


class StepError(ValueError):
    """A step was given a bad name or returned something that cannot be stored."""


def check_name(name: Any, what: str = "step") -> str:
    """A step's (or approval's, or child's) name: non-empty text of at most 200 characters.

    >>> check_name("prepare")
    'prepare'
    """
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise StepError(f"a {what} name must be non-empty text of at most {NAME_MAX} characters")
    return name


@dataclass(frozen=True)
class Step:
    """One recorded step of a job."""

    name: str
    attempt: int
    result: Any
    created_at: datetime


@dataclass
class Steps:
    """The step store of one run of one job (what `ctx.step` uses)."""

    engine: AsyncEngine
    job_id: str
    attempt: int

    async def run(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """`fn()`'s result, called at most once per job under `name` (once it succeeded)."""
        check_name(name)
        if name.startswith(PATCHED):
            raise StepError(f"step names starting {PATCHED!r} are the service's (ctx.patched)")
        async with self.engine.connect() as conn:
            found = await _stored(conn, self.job_id, name)
        if found is not None:
            return found[0]
        result = await fn()
        try:
            json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise StepError(f"step {name!r} returned a result that is not JSON: {exc}") from exc
        async with transaction(self.engine) as conn:
            dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            now = datetime.now(UTC)
            recorded = await conn.scalar(
                dialect_insert(steps)
                .values(
                    job_id=self.job_id,
                    name=name,
                    attempt=self.attempt,
                    result=result,
                    created_at=now,
                )
                .on_conflict_do_nothing()
                .returning(steps.c.id)
            )
            if recorded is not None:
                step = events.New("step", {"name": name}, self.attempt)
                await events.append(conn, self.job_id, [step], now=now)
            stored = await _stored(conn, self.job_id, name)
        # A second writer of the same step (impossible while leases hold) would lose to the
        # first: every run returns the one recorded result.
        return stored[0] if stored is not None else result


async def _stored(conn: AsyncConnection, job_id: str, name: str) -> tuple[Any] | None:
    row = (
        await conn.execute(
            select(steps.c.result).where(steps.c.job_id == job_id, steps.c.name == name)
        )
    ).first()
    return None if row is None else (row.result,)


async def steps_of(conn: AsyncConnection, job_id: str) -> list[Step]:
    """A job's recorded steps, in the order they were first done."""
    rows = await conn.execute(select(steps).where(steps.c.job_id == job_id).order_by(steps.c.id))
    return [Step(row.name, row.attempt, row.result, row.created_at) for row in rows]
