"""Replies: what a completed job sends back, never lost (template-owned).

An agent module may define `async def reply(ctx: ReplyContext, result: dict) -> None`. The
runner records the reply as `pending` in the same transaction that completes the job, and
sends it after the commit; a reply that fails stays `pending` and recovery sends it later.
A send holds a short lease (`sending`), so two workers never send one reply at once, and a
sent reply is never sent again. `ctx.reply_key` (the job id) lets the receiver drop a
duplicate if a worker died between sending and recording it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .db import transaction
from .models import jobs, replies

log = structlog.get_logger("replies")
SEND_LEASE_S = 60
PAGE = 500


@dataclass(frozen=True)
class ReplyContext:
    """What a reply step gets besides the job's result."""

    job_id: str
    agent: str
    attempt: int  # 1 for the first try to send this reply
    payload: dict[str, Any]
    log: Any

    @property
    def reply_key(self) -> str:
        """An idempotency key for the receiver: one per job."""
        return self.job_id


ReplyFn = Callable[[ReplyContext, dict[str, Any]], Awaitable[None]]


async def record_pending(conn: AsyncConnection, job_id: str, agent: str, now: datetime) -> None:
    """Call in the transaction that completes the job."""
    await conn.execute(
        insert(replies).values(job_id=job_id, agent=agent, state="pending", created_at=now)
    )


async def send(engine: AsyncEngine, job_id: str, reply: ReplyFn) -> bool:
    """Try to send one pending reply now; True when it is sent (now or before)."""
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        claimed = (
            await conn.execute(
                update(replies)
                .where(replies.c.job_id == job_id, _sendable(now))
                .values(
                    state="sending",
                    attempts=replies.c.attempts + 1,
                    lease_expires_at=now + timedelta(seconds=SEND_LEASE_S),
                )
                .returning(replies.c.agent, replies.c.attempts)
            )
        ).first()
        if claimed is None:
            return False
        row = (
            await conn.execute(select(jobs.c.payload, jobs.c.result).where(jobs.c.id == job_id))
        ).one()
    rlog = structlog.get_logger("reply").bind(
        job_id=job_id, agent=claimed.agent, reply_attempt=claimed.attempts
    )
    ctx = ReplyContext(job_id, claimed.agent, claimed.attempts, dict(row.payload), rlog)
    try:
        await reply(ctx, dict(row.result or {}))
    except Exception as exc:  # noqa: BLE001 - a failed reply is retried by recovery
        rlog.warning("reply_failed", error=f"{type(exc).__name__}: {exc}")
        async with transaction(engine) as conn:
            await conn.execute(
                update(replies)
                .where(replies.c.job_id == job_id, replies.c.state == "sending")
                .values(
                    state="pending",
                    lease_expires_at=None,
                    last_error=f"{type(exc).__name__}: {exc}"[:2000],
                )
            )
        return False
    async with transaction(engine) as conn:
        await conn.execute(
            update(replies)
            .where(replies.c.job_id == job_id, replies.c.state == "sending")
            .values(state="sent", sent_at=datetime.now(UTC), lease_expires_at=None)
        )
    rlog.info("reply_sent")
    return True


async def send_pending(engine: AsyncEngine, agents: Mapping[str, ReplyFn | None]) -> int:
    """Recovery: send every pending reply (and every send whose lease ran out)."""
    sent = 0
    after = ""
    while True:
        now = datetime.now(UTC)
        async with engine.connect() as conn:
            page = (
                await conn.execute(
                    select(replies.c.job_id, replies.c.agent)
                    .where(replies.c.job_id > after, _sendable(now))
                    .order_by(replies.c.job_id)
                    .limit(PAGE)
                )
            ).all()
        if not page:
            return sent
        after = page[-1].job_id
        for job_id, agent in page:
            reply = agents.get(agent)
            if reply is not None:
                sent += await send(engine, job_id, reply)


async def unsent(conn: AsyncConnection) -> int:
    """How many replies are not sent yet."""
    return int(
        await conn.scalar(
            select(func.count())
            .select_from(replies)
            .where(replies.c.state.in_(("pending", "sending")))  # the state index, not a scan
        )
        or 0
    )


def _sendable(now: datetime) -> Any:
    return or_(
        replies.c.state == "pending",
        and_(replies.c.state == "sending", replies.c.lease_expires_at < now),
    )
