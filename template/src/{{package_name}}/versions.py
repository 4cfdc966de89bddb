"""Code versions for jobs in flight (template-owned: copier-agent-worker).

A job runs its agent from the top every time it runs again (a retry, a resume after an
approval or its children), and gets back what its record holds: steps, paid calls,
approvals, children, each by name. A deploy between two runs puts new code over a record the
old code made. Three things keep that safe, the way Temporal's and DBOS's patching do:

- **Each job records the code it started on.** An agent's code version is its module's
  `CODE_VERSION` when the module sets one (text of at most 80 characters: set it when the
  agent's code lives in more modules than one), else `<distribution version>+<the first 12
  hex digits of the SHA-256 of its module's source>`. A job's first claim records its
  agent's version in `jobs.code_version` (job_store.claim, batched.py); a rerun keeps the
  version of the job it reuses records from.
- **`ctx.patched("name")` guards new code.** True for a job that reaches it with nothing of
  its record left to replay (a new job, or one past everything it had recorded), False for an
  older job that reaches it while replaying a record made without it. The answer is recorded
  (as a step named `patched:NAME`, written before the job records anything after it), so
  each job gets the same answer on every later run.
- **A run on other code than the job started on is checked against the record.** The record
  is "replayed" while some recorded step, paid call, approval or child is not reached yet
  (the `patched:` answers and the `version:` approvals are not work and never count). A
  paid call the record does not have, made while replaying, is new spend where the old code
  spent under another name (a renamed step, a renamed call): with `on_version_change: wait`
  the job parks before that call on an approval named `version:<new version>` (approved:
  the call goes on; rejected: the job fails); with `run` (the default) it goes on. Either
  way the run ends with a `version_changed` event naming what it did not reach and the new
  paid calls, which `jobs show` prints.

A job that started before 0014_code_versions has no version: its next claim records the one
it runs on, as if it started then.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .db import transaction
from .models import approvals, job_events, jobs, paid_calls, steps
from .steps import PATCHED, check_name

VERSION_MAX = 80
PATCH_PREFIX = PATCHED  # a recorded `ctx.patched` answer is a step of this name
EVENT = "version_changed"
VERSION_APPROVAL = "version:"  # the approvals of new spend on changed code, by version
# The kinds of recorded work, as the record and the reports name them.
STEP, PAID_CALL, APPROVAL, CHILD = "step", "paid call", "approval", "child"


class VersionError(ValueError):
    """An agent module's CODE_VERSION is not usable text."""


def of_module(module: ModuleType) -> str:
    """The code version of the agents `module` defines (see the module docstring)."""
    own = getattr(module, "CODE_VERSION", None)
    if own is not None:
        if not isinstance(own, str) or not own.strip() or len(own) > VERSION_MAX:
            raise VersionError(
                f"CODE_VERSION of {module.__name__} must be non-empty text of at most "
                f"{VERSION_MAX} characters, not {own!r}"
            )
        return own
    try:
        source = inspect.getsource(module).encode()
    except (OSError, TypeError):  # no source on disk (a frozen or generated module)
        source = module.__name__.encode()
    return f"{distribution_version()}+{hashlib.sha256(source).hexdigest()[:12]}"


def distribution_version() -> str:
    """The installed version of this service's distribution ("0" when not installed)."""
    from . import catalog  # the answers import the agent contract, which imports this module

    try:
        return importlib.metadata.version(catalog.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0"


Mark = tuple[str, str]  # (kind, name) of one recorded piece of work


@dataclass(frozen=True)
class Record:
    """The names a job has recorded, and its recorded `ctx.patched` answers."""

    marks: frozenset[Mark] = frozenset()
    patches: dict[str, bool] = field(default_factory=dict)


NOTHING = Record()


def may_have_record(job: Any) -> bool:
    """Whether `job` (a claimed queries.Job) can have recorded work: not on a first attempt,
    unless it is a rerun (which starts with records copied from its original)."""
    return bool(job.attempts > 1 or job.rerun_of is not None)


async def record_of(conn: AsyncConnection, job_id: str) -> Record:
    """What `job_id` has recorded: its steps, paid calls, approvals and children."""
    marks: set[Mark] = set()
    patches: dict[str, bool] = {}
    rows = await conn.execute(select(steps.c.name, steps.c.result).where(steps.c.job_id == job_id))
    for row in rows:
        if row.name.startswith(PATCH_PREFIX):  # an answer, not work: never "not reached"
            patches[row.name.removeprefix(PATCH_PREFIX)] = bool(row.result)
        else:
            marks.add((STEP, row.name))
    for kind, column, owner in (
        (PAID_CALL, paid_calls.c.name, paid_calls.c.job_id),
        (APPROVAL, approvals.c.name, approvals.c.job_id),
        (CHILD, jobs.c.child_key, jobs.c.parent_id),
    ):
        names = await conn.scalars(select(column).where(owner == job_id))
        marks.update((kind, name) for name in names if not _is_version_approval(kind, name))
    return Record(frozenset(marks), patches)


def _is_version_approval(kind: str, name: str) -> bool:
    """An approval of new spend on changed code: asked only on the way, never replayed."""
    return kind == APPROVAL and name.startswith(VERSION_APPROVAL)


@dataclass
class Replay:
    """What one run of one job reaches of its record: for `ctx.patched` and, on a run of
    other code than the job started on, the check of its paid calls and the report."""

    record: Record
    started_on: str | None  # the job's code_version (None: not known)
    running: str  # the agent's code version in this worker
    on_change: str = "run"  # the agent's on_version_change
    reached: set[Mark] = field(default_factory=set)
    pending: dict[str, bool] = field(default_factory=dict)  # patched answers to record
    answered: dict[str, bool] = field(default_factory=dict)  # patched answers of this run
    new_paid_calls: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether this run's code is other than the job started on."""
        return self.started_on is not None and self.started_on != self.running

    @property
    def replaying(self) -> bool:
        """Whether some recorded work is not reached yet."""
        return not self.record.marks <= self.reached

    def reach(self, kind: str, name: str) -> None:
        self.reached.add((kind, name))

    def patched(self, name: str) -> bool:
        """`ctx.patched(name)`: the recorded answer, else True unless replaying."""
        check_name(name, "patch")
        answer = self.record.patches.get(name, self.answered.get(name))
        if answer is None:
            answer = self.answered[name] = self.pending[name] = not self.replaying
        return answer

    async def save(self, engine: AsyncEngine, job_id: str, attempt: int) -> None:
        """Record the `ctx.patched` answers not recorded yet (before anything after them)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        now = datetime.now(UTC)
        async with transaction(engine) as conn:
            dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            rows = [
                {"job_id": job_id, "name": PATCH_PREFIX + name, "attempt": attempt}
                | {"result": answer, "created_at": now}
                for name, answer in pending.items()
            ]
            await conn.execute(dialect_insert(steps).on_conflict_do_nothing(), rows)

    def is_new_spend(self, name: str) -> bool:
        """Whether paid call `name` is new spend of changed code: a call the record does not
        have, made while the record is still being replayed (noted for the report)."""
        if not self.changed or (PAID_CALL, name) in self.record.marks or not self.replaying:
            return False
        if name not in self.new_paid_calls:
            self.new_paid_calls.append(name)
        return True

    @property
    def approval(self) -> str:
        """The approval a job waits on before new spend of changed code."""
        return f"{VERSION_APPROVAL}{self.running}"

    def not_reached(self) -> list[str]:
        """The recorded work this run has not reached, as "kind name"."""
        left = self.record.marks - self.reached
        return [f"{kind} {name}" for kind, name in sorted(left)]

    def summary(self, name: str) -> str:
        """What the approval before new spend asks."""
        left = self.not_reached()
        return (
            f"the job started on code version {self.started_on} and resumed on {self.running}: "
            f"it would make paid call {name!r}, which its record does not have, while "
            f"{', '.join(left) or 'nothing'} is not reached yet (renamed or removed?). "
            "Approve to let it spend; reject to fail it."
        )

    def report(self) -> dict[str, Any] | None:
        """The `version_changed` event of a run of changed code, when it has news."""
        if not self.changed:
            return None
        left = self.not_reached()
        if not left and not self.new_paid_calls:
            return None
        return {
            "from": self.started_on,
            "to": self.running,
            "not_reached": left,
            "new_paid_calls": list(self.new_paid_calls),
        }


async def last_report(conn: AsyncConnection, job_id: str) -> dict[str, Any] | None:
    """The latest `version_changed` report of `job_id` (what `jobs show` prints), if any."""
    data: dict[str, Any] | None = await conn.scalar(
        select(job_events.c.data)
        .where(job_events.c.job_id == job_id, job_events.c.kind == EVENT)
        .order_by(job_events.c.seq.desc())
        .limit(1)
    )
    return data


def report_lines(report: dict[str, Any]) -> list[str]:
    """`jobs show`'s lines for a `version_changed` report.

    >>> for line in report_lines({"from": "1", "to": "2", "not_reached": ["step draft"],
    ...                           "new_paid_calls": ["write"]}):
    ...     print(line)
         code changed  1 -> 2 while in flight
          not reached  step draft
       new paid calls  write
    """
    return [
        f"{'code changed':>17}  {report['from']} -> {report['to']} while in flight",
        f"{'not reached':>17}  {', '.join(report['not_reached']) or 'nothing'}",
        f"{'new paid calls':>17}  {', '.join(report['new_paid_calls']) or 'none'}",
    ]
