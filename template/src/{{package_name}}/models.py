"""The job record's tables (template-owned: copier-agent-worker).

SQLAlchemy Core tables: the job store writes them with explicit, guarded statements, so
there is no ORM session state to keep in sync with the queue.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    case,
    false,
    text,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database (SQLite stores it naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; use datetime.now(UTC)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The jobs with a deadline that may still pass it: queued or waiting (a running attempt
# is bounded by its runner).
LIVE = text("deadline_at IS NOT NULL AND state IN ('queued', 'waiting')")
# The jobs that have finished (or parked): the retention sweep's and the console chart's.
FINISHED = text("finished_at IS NOT NULL")

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("agent", String(100), nullable=False),
    Column("lane", String(100), nullable=False),
    Column("state", String(20), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("result", JSON),
    # "" rather than NULL so that (owner, idempotency_key) is unique for anonymous callers too.
    Column("owner", String(200), nullable=False, server_default=""),
    Column("idempotency_key", String(200)),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False),
    Column("run_after", UTCDateTime()),
    Column("lease_expires_at", UTCDateTime()),
    Column("worker", String(200)),
    Column("last_error", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("claimed_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    # W3C trace context of the submit ({"traceparent": ...}) when traced (observe/tracing.py).
    Column("trace_context", JSON),
    # A child job (ctx.spawn): its parent and its key, unique per parent.
    Column("parent_id", String(36)),
    Column("child_key", String(200)),
    # Why a `waiting` job waits: "approval:NAME" or "children".
    Column("waiting_for", String(200)),
    # 0005_flow_control: times an upstream rate limit sent it back; -1 low, 0 normal, 1 high.
    Column("deferrals", Integer, nullable=False, server_default="0"),
    Column("priority", SmallInteger, nullable=False, server_default="0"),
    # 0008_budgets: the job whose budget covers this one (its own, or its parent's).
    Column("budget_id", String(36)),
    # 0009_events: the `seq` of the job's last event (events.py); each write of events adds
    # to it in the job row's lock, so a job's events commit in `seq` order.
    Column("event_seq", Integer, nullable=False, server_default="0"),
    # 0010_deadlines: when the job must have reached a terminal state (deadlines.py), or None.
    Column("deadline_at", UTCDateTime()),
    # 0011_cancel_requests: when an operator asked to stop the job while it ran (cancels.py).
    Column("cancel_requested_at", UTCDateTime()),
    Column("cancel_children", Boolean),  # ...and its descendants with it (--children)
    # 0013_reruns: the job this one reruns from one of its steps (reruns.py), or None.
    Column("rerun_of", String(36)),
    # 0014_code_versions: the version of its agent's code the job started on (versions.py).
    Column("code_version", String(80)),
    UniqueConstraint("owner", "idempotency_key"),
    Index(None, "state", "lane"),
    Index(None, "agent", "state"),
    Index("uq_jobs_parent_id_child_key", "parent_id", "child_key", unique=True),
    # Only the jobs the deadline sweep may fail, so the sweep never reads finished ones.
    Index("ix_jobs_deadline_at_live", "deadline_at", postgresql_where=LIVE, sqlite_where=LIVE),
    # 0015_job_history: `jobs list` (newest first) and the reads by finish time (retention,
    # the console's last hour), so none of them reads the whole history (docs/SCALING.md).
    Index("ix_jobs_created_at_id", "created_at", "id"),
    Index(
        "ix_jobs_finished_at",
        "finished_at",
        "state",  # the chart counts by state from the index alone
        postgresql_where=FINISHED,
        sqlite_where=FINISHED,
    ),
)


def in_states(*states: str) -> ColumnElement[bool]:
    """`jobs.state IN states`, for a statement that finds its jobs by id: written as a CASE,
    which no index serves, so the planner goes by the primary key.

    A plain guard lets it read the jobs through the (state, lane) index instead, every row
    in those states, whenever the table's statistics are older than its rows (a new service,
    a burst of jobs before autovacuum's next ANALYZE): a heartbeat then read all 1,500
    running jobs, and a claim every queued one, so each statement grew with the backlog.
    """
    return case((jobs.c.state.in_(states), true()), else_=false())


attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("worker", String(200), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    # completed / retry / deferred / failed / dead_lettered / lost (the worker vanished)
    Column("outcome", String(20)),
    Column("error_class", String(200)),
    Column("error_message", Text),
    Column("traceback", Text),
    UniqueConstraint("job_id", "number"),
)


# Money is integer micro-dollars (1 USD = 1_000_000): exact on every database, never a float.
# The global cap and its daily totals use the agent name GLOBAL.
GLOBAL = "*"

spend_caps = Table(
    "spend_caps",
    metadata,
    Column("agent", String(100), primary_key=True),
    Column("cap_micros", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(200), nullable=False),
)

spend_days = Table(
    "spend_days",
    metadata,
    Column("day", Date, primary_key=True),  # the UTC day
    Column("agent", String(100), primary_key=True),
    Column("reserved_micros", BigInteger, nullable=False, server_default="0"),
    Column("spent_micros", BigInteger, nullable=False, server_default="0"),
    # 0008_budgets: what approvals added to this day's cap alone (approve --raise-budget-usd).
    Column("raised_micros", BigInteger, nullable=False, server_default="0"),
)

paid_calls = Table(
    "paid_calls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("agent", String(100), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("day", Date, nullable=False),  # the UTC day its reservation counts against
    # open: reserved, provider called, no outcome yet; closed: settled; in_doubt: may be charged
    Column("state", String(20), nullable=False),
    Column("max_cost_micros", BigInteger, nullable=False),
    Column("cost_micros", BigInteger),
    Column("result", JSON),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    UniqueConstraint("job_id", "name"),
)

# A job's budget (budgets.py): what its tree may spend, inside the budget above it if any.
budgets = Table(
    "budgets",
    metadata,
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    # The budget this one is carved inside (the budget that covered the job's parent).
    Column("parent_job_id", String(36)),
    Column("budget_micros", BigInteger, nullable=False),
    Column("reserved_micros", BigInteger, nullable=False, server_default="0"),
    Column("spent_micros", BigInteger, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("action", String(100), nullable=False),
    Column("target", String(200), nullable=False),
    Column("details", JSON, nullable=False),
)

# Each schedule's state (schedules.py): paused by whom, and its latest tick and job. The
# schedules themselves are answers (catalog.SCHEDULES); a tick's job is made once because its
# (owner, idempotency_key) is unique.
schedules = Table(
    "schedules",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("paused_by", String(200)),
    Column("last_tick_at", UTCDateTime()),
    Column("last_job_id", String(36)),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# A completed job's reply (when its agent defines `reply`): recorded in the completing
# transaction, sent after commit, retried by recovery until sent. Key = job id.
replies = Table(
    "replies",
    metadata,
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("agent", String(100), nullable=False),
    Column("state", String(20), nullable=False),  # pending / sending / sent
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("lease_expires_at", UTCDateTime()),
    Column("last_error", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("sent_at", UTCDateTime()),
    Index(None, "state"),
)

# A job's memoized steps (ctx.step): one row per (job, name), committed before the job goes
# on; a later run of the job returns `result` without calling the step again.
steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("result", JSON),
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("job_id", "name"),
)

# A job's approvals (ctx.approval): pending until a person approves or rejects it, or its
# timeout expires it.
approvals = Table(
    "approvals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("summary", Text, nullable=False),
    Column("state", String(20), nullable=False),  # pending / approved / rejected / expired
    Column("requested_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime()),
    Column("decided_at", UTCDateTime()),
    Column("decided_by", String(200)),
    Column("reason", Text),
    # 0008_budgets: what a `budget` approval is about (the budget or cap that stopped the
    # call, what it asked and what was left): approve --raise-budget-usd reads it.
    Column("details", JSON),
    UniqueConstraint("job_id", "name"),
    Index(None, "state"),
)

# Bearer tokens of the HTTP API and the web console (web/): only a SHA-256 hash of each token
# is kept. A revoked token keeps its row (revoked_at) so the audit log's names stay unique.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("role", String(20), nullable=False),  # viewer / operator / admin
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("revoked_at", UTCDateTime()),
    Column("revoked_by", String(200)),
)

# A job's events (events.py): what the service did (attempts, steps, paid calls, children,
# waits, state changes) and what its agent emitted (ctx.emit), in per-job order `seq` from 1.
# Seq 0 is the summary of the events trimmed to keep each job within `events_per_job`.
job_events = Table(
    "job_events",
    metadata,
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("kind", String(100), nullable=False),
    Column("attempt", Integer),
    Column("data", JSON),
)

# A job's end, announced to a webhook endpoint (webhooks.py): one row per (settle, endpoint),
# recorded in the transaction that settles the job, sent after commit, retried with backoff
# until the receiver answers 2xx. `body` is the exact JSON that is signed and sent.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(36), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("endpoint", String(100), nullable=False),
    Column("url", Text, nullable=False),
    Column("idempotency_id", String(64), nullable=False),
    Column("body", Text, nullable=False),
    Column("state", String(20), nullable=False),  # pending / sending / sent / failed
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("lease_expires_at", UTCDateTime()),
    Column("last_error", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("sent_at", UTCDateTime()),
    UniqueConstraint("idempotency_id", "endpoint"),
    Index(None, "job_id"),
    # The deliverer's scan (what is due, oldest first) and the backlog count: sent rows, all
    # but a few, leave it.
    Index(
        "ix_webhook_deliveries_due",
        "next_attempt_at",
        postgresql_where=text("state <> 'sent'"),
        sqlite_where=text("state <> 'sent'"),
    ),
)
