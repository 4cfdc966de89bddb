"""Liveness and readiness of a worker process (template-owned: copier-agent-worker).

Liveness is the event loop answering at all: it never touches Redis or the database, so an
outage of either never makes the platform restart every worker at once. Readiness is what
this process needs to do its work: the database answers and is migrated to head, Redis
answers, and every lane of this process is polling. `/livez`, `/readyz` and
`doctor --probe` all use these functions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..settings import redact_url
from .doctor import alembic_revisions, current_revisions

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..queue import JobQueue
    from ..settings import Settings

# Seconds each readiness check may take; a probe answers well inside a platform's timeout.
READY_CHECK_TIMEOUT_S = 2.0


class Readiness:
    """Answers "may this process be sent work?" with None (yes) or one line saying why not."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        queue: JobQueue,
        lanes_polling: Callable[[], Mapping[str, bool]],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.queue = queue
        self.lanes_polling = lanes_polling
        self._revisions: tuple[set[str], set[str]] | None = None

    async def check(self) -> str | None:
        """None when ready; else the first failing check, as one line."""
        return await self.check_database() or await self.check_redis() or self.check_lanes()

    async def check_database(self) -> str | None:
        if self._revisions is None:
            self._revisions = await asyncio.to_thread(alembic_revisions)
        heads, known = self._revisions
        shown = redact_url(self.settings.database_url)
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_S):
                async with self.engine.connect() as conn:
                    current = set(await conn.run_sync(current_revisions))
        except TimeoutError:
            return f"database {shown} gave no answer in {READY_CHECK_TIMEOUT_S:g} s"
        except Exception as exc:  # noqa: BLE001 - any failure is the probe's answer
            return f"database {shown} cannot be reached: {_first_line(exc)}"
        if current != heads and not current - known:  # ahead (a newer release) is ready
            at = ", ".join(sorted(current)) or "no revision"
            return f"database is at {at}, not at head {', '.join(sorted(heads))}"
        return None

    async def check_redis(self) -> str | None:
        shown = redact_url(self.settings.redis_url)
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_S):
                await self.queue.pool.ping()
        except TimeoutError:
            return f"Redis {shown} gave no answer in {READY_CHECK_TIMEOUT_S:g} s"
        except Exception as exc:  # noqa: BLE001 - any failure is the probe's answer
            return f"Redis {shown} cannot be reached: {_first_line(exc)}"
        return None

    def check_lanes(self) -> str | None:
        idle = sorted(lane for lane, polling in self.lanes_polling().items() if not polling)
        if idle:
            return f"lane {', '.join(idle)} is not polling Redis (reconnecting, or draining)"
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
