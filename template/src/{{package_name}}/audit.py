"""The audit trail: who changed what, when (template-owned: copier-agent-worker)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import audit_log


@dataclass(frozen=True)
class AuditEntry:
    """One audited action."""

    at: datetime
    actor: str
    action: str
    target: str
    details: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "details": self.details,
        }


async def record(
    conn: AsyncConnection,
    *,
    actor: str,
    action: str,
    target: str,
    details: dict[str, Any],
    now: datetime,
) -> None:
    """Append one entry, in the caller's transaction (so it commits with the change)."""
    await conn.execute(
        insert(audit_log).values(at=now, actor=actor, action=action, target=target, details=details)
    )


async def entries(conn: AsyncConnection, *, target: str | None = None) -> list[AuditEntry]:
    """Entries oldest first, optionally for one target (an agent name or a job id)."""
    stmt = select(
        audit_log.c.at,
        audit_log.c.actor,
        audit_log.c.action,
        audit_log.c.target,
        audit_log.c.details,
    ).order_by(audit_log.c.id)
    if target is not None:
        stmt = stmt.where(audit_log.c.target == target)
    return [AuditEntry(**row._mapping) for row in await conn.execute(stmt)]


async def recent(
    conn: AsyncConnection,
    *,
    limit: int = 50,
    actor: str | None = None,
    target: str | None = None,
) -> list[AuditEntry]:
    """The newest `limit` entries, newest first, optionally of one actor or one target."""
    stmt = (
        select(
            audit_log.c.at,
            audit_log.c.actor,
            audit_log.c.action,
            audit_log.c.target,
            audit_log.c.details,
        )
        .order_by(audit_log.c.id.desc())
        .limit(limit)
    )
    if actor is not None:
        stmt = stmt.where(audit_log.c.actor == actor)
    if target is not None:
        stmt = stmt.where(audit_log.c.target == target)
    return [AuditEntry(**row._mapping) for row in await conn.execute(stmt)]
