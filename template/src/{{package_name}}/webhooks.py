"""Completion webhooks: other systems told when a job ends, never lost
(template-owned: copier-agent-worker).

Set `<PREFIX>WEBHOOK_URLS` (comma-separated `NAME=URL`, or bare URLs named by their host)
and `<PREFIX>WEBHOOK_SECRET`; an agent's `webhooks` answer narrows the endpoints its jobs
tell (by name; `[]` for none).

- **Recorded with the fact.** When a job settles (completed, cancelled, failed,
  dead-lettered, denied: the states a parent's `wait_children` counts as settled), the
  transaction that moves it also writes one delivery row per endpoint (`record`, called by
  `job_store`). The body is fixed then: a crash after the commit never loses one, and a
  rollback never sends one. A job that settles again later (replayed, resolved) is told
  again, under a new idempotency id.
- **Sent after the commit** by each worker's `Deliverer`, at once for the jobs it settled and
  within `POLL_S` for the others (an operator's cancel, recovery). A send holds a lease, so
  two workers never send one row at once; a receiver that does not answer 2xx within
  `SEND_TIMEOUT_S` is tried again with backoff (`BACKOFF_BASE_S` doubling to
  `BACKOFF_MAX_S`) until it does, for `GIVE_UP_AFTER_S`; then the row is `failed`.
  Delivery runs beside the jobs: a slow or failing receiver never holds one up.
- **At least once.** A worker that dies between the receiver's 2xx and recording it sends
  again: receivers drop a repeat by its idempotency id (`webhook-id`, also in the body).
- **Signed** the Standard Webhooks way: `webhook-signature: v1,<base64 HMAC-SHA256>` over
  `{webhook-id}.{webhook-timestamp}.{body}`, keyed by the secret (a `whsec_` secret is
  base64 after its prefix, as those libraries expect). `verify` is the receiver's side; it
  refuses a timestamp more than `TOLERANCE_S` away from now.

The endpoints ride on the database engine (`attach`, an execution option set by
`db.create_engine`), so every process that settles jobs (worker, recovery, CLI, API) records
them without a setting passed through every verb.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import structlog
from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .db import transaction
from .models import jobs, webhook_deliveries

if TYPE_CHECKING:
    import httpx

    from .settings import Settings

log = structlog.get_logger("webhooks")

OPTION = "webhooks"  # the engine execution option that carries a service's Webhooks
POLL_S = 1.0  # how often a deliverer looks for due rows it was not told about
BATCH = 16  # rows one look claims, sent at once
SEND_TIMEOUT_S = 10.0
LEASE_S = 30.0  # a send's hold on its row; longer than SEND_TIMEOUT_S
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
GIVE_UP_AFTER_S = 3 * 24 * 3600
TOLERANCE_S = 300  # how far a signed timestamp may be from the receiver's clock
ID_HEADER = "webhook-id"  # the idempotency id
TIMESTAMP_HEADER = "webhook-timestamp"  # Unix seconds of this send
SIGNATURE_HEADER = "webhook-signature"  # "v1,<base64>", several separated by spaces
ERROR_MAX = 2000


@dataclass(frozen=True)
class Webhooks:
    """A service's webhook endpoints, its secret, and the agents that narrow them."""

    endpoints: Mapping[str, str]  # name -> URL
    secret: str = field(repr=False)
    narrowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # agent -> names

    def for_agent(self, agent: str) -> list[tuple[str, str]]:
        """The (name, URL) pairs a job of `agent` tells when it ends."""
        names = self.narrowed.get(agent)
        if names is None:
            return list(self.endpoints.items())
        return [(name, self.endpoints[name]) for name in names if name in self.endpoints]

    def missing(self) -> list[tuple[str, str]]:
        """(agent, name) pairs where an agent names an endpoint the settings do not define."""
        return [
            (agent, name)
            for agent, names in sorted(self.narrowed.items())
            for name in names
            if name not in self.endpoints
        ]


class Narrows(Protocol):
    """What `from_settings` reads of an agent's settings (agent.AgentConfig)."""

    @property
    def webhooks(self) -> tuple[str, ...] | None: ...


def from_settings(settings: Settings, agents: Mapping[str, Narrows]) -> Webhooks | None:
    """The service's webhooks, or None when `<PREFIX>WEBHOOK_URLS` is not set."""
    endpoints = settings.webhooks
    if not endpoints or settings.webhook_secret is None:
        return None
    narrowed = {
        name: config.webhooks for name, config in agents.items() if config.webhooks is not None
    }
    return Webhooks(endpoints, settings.webhook_secret.get_secret_value(), narrowed)


def attach(engine: AsyncEngine, hooks: Webhooks | None) -> AsyncEngine:
    """`engine`, carrying `hooks` to every connection it opens (same pool)."""
    return engine if hooks is None else engine.execution_options(**{OPTION: hooks})


def of(conn: AsyncConnection) -> Webhooks | None:
    """The webhooks of the engine `conn` came from (None: none configured)."""
    if conn.sync_connection is None:
        return None
    hooks = conn.sync_connection.get_execution_options().get(OPTION)
    return hooks if isinstance(hooks, Webhooks) else None


def of_engine(engine: AsyncEngine) -> Webhooks | None:
    """The webhooks `engine` carries (None: none configured)."""
    hooks = engine.sync_engine.get_execution_options().get(OPTION)
    return hooks if isinstance(hooks, Webhooks) else None


# What `job_store` returns from a settling UPDATE when a job's end is to be told.
JOB_COLUMNS = (
    jobs.c.agent,
    jobs.c.owner,
    jobs.c.attempts,
    jobs.c.result,
    jobs.c.last_error,
    jobs.c.created_at,
    jobs.c.finished_at,
)


async def record(
    conn: AsyncConnection, hooks: Webhooks, job_id: str, seq: int, row: Any, now: datetime
) -> int:
    """In the settling transaction: one pending delivery per endpoint of the job's agent.
    `row` holds the job's `state`, `parent_id` and JOB_COLUMNS as the UPDATE left them; `seq`
    is the event that recorded the move, so the idempotency id names this settle."""
    targets = hooks.for_agent(row.agent)
    if not targets:
        return 0
    idempotency_id = f"{job_id}.{seq}"
    body = json.dumps(
        {
            "type": f"job.{row.state}",
            "idempotency_id": idempotency_id,
            "at": now.isoformat(),
            "job": {
                "id": job_id,
                "agent": row.agent,
                "state": row.state,
                "owner": row.owner,
                "parent_id": row.parent_id,
                "attempts": row.attempts,
                "result": row.result,
                "error": row.last_error,
                "created_at": _iso(row.created_at),
                "finished_at": _iso(row.finished_at),
            },
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    await conn.execute(
        insert(webhook_deliveries),
        [
            {
                "job_id": job_id,
                "endpoint": name,
                "url": url,
                "idempotency_id": idempotency_id,
                "body": body,
                "state": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for name, url in targets
        ],
    )
    return len(targets)


# Signing --------------------------------------------------------------------------------


def sign(secret: str, idempotency_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value for one send (the same as the Standard Webhooks
    libraries' `Webhook(secret).sign(...)`, which gave the `whsec_` value below).

    >>> sign("a-secret-of-16-chars", "job.3", 1700000000, b'{"a":1}')
    'v1,djByXrBVtSQRG90EXpFSYkXY6PAr42T4wygQ9A0fpyw='
    >>> sign("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM=", "job.3", 1700000000, b'{"a":1}')
    'v1,DHzedKOwm17GuGwL2/OsMLbhFWuCUNAX+a9bne7aINM='
    """
    signed = f"{idempotency_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    secret: str, idempotency_id: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The headers of one send: content type, id, timestamp, signature."""
    timestamp = int(time.time() if now is None else now)
    return {
        "content-type": "application/json",
        ID_HEADER: idempotency_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, idempotency_id, timestamp, body),
    }


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """True when `body` came signed with `secret` and its timestamp is within `tolerance_s`
    of now: the receiver's check (headers by any case, e.g. a Starlette request's).

    >>> body = b'{"a":1}'
    >>> sent = headers("a-secret-of-16-chars", "job.3", body, now=1700000000)
    >>> verify("a-secret-of-16-chars", sent, body, now=1700000010)
    True
    >>> verify("another-secret-16-ch", sent, body, now=1700000010)
    False
    >>> verify("a-secret-of-16-chars", sent, body, now=1700000400)  # too old
    False
    """
    given = {name.lower(): value for name, value in headers.items()}
    idempotency_id = given.get(ID_HEADER)
    stamp = given.get(TIMESTAMP_HEADER, "")
    signatures = given.get(SIGNATURE_HEADER, "")
    if not idempotency_id or not stamp.isdigit() or not signatures:
        return False
    timestamp = int(stamp)
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    raw = body.encode() if isinstance(body, str) else body
    expected = sign(secret, idempotency_id, timestamp, raw)
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures.split())


def _key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret.removeprefix("whsec_"))
    return secret.encode()


# Delivery -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Due:
    """One claimed delivery."""

    id: int
    job_id: str
    endpoint: str
    url: str
    idempotency_id: str
    body: str
    attempts: int  # counting this one
    created_at: datetime


@dataclass(frozen=True)
class Sent:
    """What one send came to: None error when the receiver answered 2xx."""

    due: Due
    error: str | None


async def claim_due(engine: AsyncEngine, *, now: datetime, limit: int = BATCH) -> list[Due]:
    """Take up to `limit` deliveries that are due (or whose send's lease ran out), oldest
    first, each leased for LEASE_S; on PostgreSQL, rows another worker holds are skipped."""
    due = (
        select(webhook_deliveries.c.id)
        .where(_due(now))
        .order_by(webhook_deliveries.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    async with transaction(engine) as conn:
        ids = list(await conn.scalars(due))
        if not ids:
            return []
        rows = (
            await conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_(ids), _due(now))
                .values(
                    state="sending",
                    attempts=webhook_deliveries.c.attempts + 1,
                    lease_expires_at=now + timedelta(seconds=LEASE_S),
                )
                .returning(
                    webhook_deliveries.c.id,
                    webhook_deliveries.c.job_id,
                    webhook_deliveries.c.endpoint,
                    webhook_deliveries.c.url,
                    webhook_deliveries.c.idempotency_id,
                    webhook_deliveries.c.body,
                    webhook_deliveries.c.attempts,
                    webhook_deliveries.c.created_at,
                )
            )
        ).all()
    return sorted((Due(*row) for row in rows), key=lambda due: due.id)


async def send(client: httpx.AsyncClient, secret: str, due: Due) -> Sent:
    """POST one delivery; never raises."""
    body = due.body.encode()
    try:
        response = await client.post(
            due.url, content=body, headers=headers(secret, due.idempotency_id, body)
        )
    except Exception as exc:  # noqa: BLE001 - any failure to reach the receiver is retried
        return Sent(due, f"{type(exc).__name__}: {exc}"[:ERROR_MAX] or type(exc).__name__)
    if 200 <= response.status_code < 300:
        return Sent(due, None)
    return Sent(due, f"the receiver answered HTTP {response.status_code}")


async def settle_sends(engine: AsyncEngine, sent: Sequence[Sent], *, now: datetime) -> None:
    """Record what the sends came to, each guarded by the attempt that sent it."""
    async with transaction(engine) as conn:
        for one in sent:
            mine = and_(
                webhook_deliveries.c.id == one.due.id,
                webhook_deliveries.c.state == "sending",
                webhook_deliveries.c.attempts == one.due.attempts,
            )
            if one.error is None:
                values: dict[str, Any] = {"state": "sent", "sent_at": now, "last_error": None}
            elif (now - one.due.created_at).total_seconds() >= GIVE_UP_AFTER_S:
                values = {"state": "failed", "last_error": one.error}
            else:
                values = {
                    "state": "pending",
                    "next_attempt_at": now + timedelta(seconds=backoff_s(one.due.attempts)),
                    "last_error": one.error,
                }
            await conn.execute(
                update(webhook_deliveries).where(mine).values(lease_expires_at=None, **values)
            )


def backoff_s(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones: doubling from
    BACKOFF_BASE_S up to BACKOFF_MAX_S, less up to a tenth at random (receivers coming back
    are not hit by every worker at once).

    >>> all(0.9 * 2 ** (n - 1) <= backoff_s(n) <= 2 ** (n - 1) for n in range(1, 9))
    True
    >>> 0.9 * BACKOFF_MAX_S <= backoff_s(40) <= BACKOFF_MAX_S
    True
    """
    full: float = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** min(attempts - 1, 30))
    return full * (1 - random.random() / 10)


async def deliver_due(
    engine: AsyncEngine, hooks: Webhooks, client: httpx.AsyncClient, *, limit: int = BATCH
) -> list[Sent]:
    """Claim what is due, send it all at once, record the outcomes; returns the sends."""
    claimed = await claim_due(engine, now=datetime.now(UTC), limit=limit)
    if not claimed:
        return []
    sent = await asyncio.gather(*(send(client, hooks.secret, due) for due in claimed))
    await settle_sends(engine, sent, now=datetime.now(UTC))
    for one in sent:
        wlog = log.bind(
            job_id=one.due.job_id,
            endpoint=one.due.endpoint,
            idempotency_id=one.due.idempotency_id,
            delivery_attempt=one.due.attempts,
        )
        if one.error is None:
            wlog.info("webhook_sent")
        else:
            wlog.warning("webhook_failed", error=one.error)
    return list(sent)


class Deliverer:
    """One worker process's sender: `run` until cancelled, `poke` after settling a job."""

    def __init__(
        self,
        engine: AsyncEngine,
        hooks: Webhooks,
        on_sent: Callable[[Sent], None] | None = None,
    ) -> None:
        self.engine = engine
        self.hooks = hooks
        self.on_sent = on_sent  # called with each Sent (the worker's metrics)
        self._poked = asyncio.Event()

    def poke(self) -> None:
        """Look now: a job settled here."""
        self._poked.set()

    async def run(self) -> None:
        import httpx  # here, not at import: only a worker with webhooks loads it

        limits = httpx.Limits(max_connections=BATCH)
        async with httpx.AsyncClient(timeout=SEND_TIMEOUT_S, limits=limits) as client:
            while True:
                self._poked.clear()
                try:
                    sent = await deliver_due(self.engine, self.hooks, client)
                except Exception as exc:  # noqa: BLE001 - the database may be away a while
                    log.warning("webhook_look_failed", error=f"{type(exc).__name__}: {exc}")
                    sent = []
                for one in sent:
                    if self.on_sent is not None:
                        self.on_sent(one)
                if len(sent) == BATCH:
                    continue  # more may be due
                try:
                    async with asyncio.timeout(POLL_S):
                        await self._poked.wait()
                except TimeoutError:
                    pass


class Backlog(NamedTuple):
    """Notifications not sent: still tried (`unsent`), and given up (`failed`)."""

    unsent: int
    failed: int


async def backlog(conn: AsyncConnection) -> Backlog:
    """How many notifications are not sent yet, and how many were given up."""
    counts: dict[str, int] = dict(
        (
            await conn.execute(
                select(webhook_deliveries.c.state, func.count())
                .where(webhook_deliveries.c.state != "sent")
                .group_by(webhook_deliveries.c.state)
            )
        ).all()
    )
    return Backlog(counts.get("pending", 0) + counts.get("sending", 0), counts.get("failed", 0))


def _due(now: datetime) -> Any:
    rows = webhook_deliveries.c
    return or_(
        and_(rows.state == "pending", rows.next_attempt_at <= now),
        and_(rows.state == "sending", rows.lease_expires_at < now),
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
