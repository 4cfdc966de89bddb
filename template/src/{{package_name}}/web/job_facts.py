"""What a job's console page says about it, worked out from its row, attempts and audit
entries (template-owned: copier-agent-worker).

Pure functions, so the words the page shows are tested as doctests: how its attempts stand
(a wait or a deferral gives the attempt back, a replay gives fresh ones), how long it
waited and ran, and whether its last error is still why it is where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..audit import AuditEntry
from ..queries import Attempt, Job
from ..states import PARKED, JobState

# Audit actions that set a job's attempts afresh (dlq.replay; dlq.resolve to a retry).
RESETS = frozenset({"replay", "resolve_retry", "resolve_not_charged"})
# Outcomes of the latest attempt whose error is why a `queued` job waits to run again.
REQUEUED_BY_ERROR = frozenset({"retry", "lost", "deferred"})


@dataclass(frozen=True)
class Facts:
    """The job page's derived lines."""

    attempts: str
    queued_for: timedelta | None  # from its creation to its first start
    ran_for: timedelta | None  # the attempts' run times added up
    error: str | None  # the last error, only while it is why the job is where it is


def facts(job: Job, attempts: Sequence[Attempt], entries: Sequence[AuditEntry]) -> Facts:
    """The derived lines of one job's page."""
    reset = last_reset(entries)
    since = [a for a in attempts if reset is None or a.started_at > reset]
    return Facts(
        attempts=attempts_text(
            job.attempts,
            job.max_attempts,
            [a.outcome for a in since],
            used_before=len(attempts) - len(since),
        ),
        queued_for=_queued_for(job, attempts),
        ran_for=_ran_for(attempts),
        error=job.last_error if error_is_current(job, since) else None,
    )


def last_reset(entries: Sequence[AuditEntry]) -> datetime | None:
    """When an operator last gave the job fresh attempts (a replay), if ever."""
    times = [entry.at for entry in entries if entry.action in RESETS]
    return max(times) if times else None


def attempts_text(
    attempts: int, max_attempts: int, outcomes: Sequence[str | None], *, used_before: int = 0
) -> str:
    """The attempt count as a person reads it. `outcomes` are those of the attempts since
    the last replay; a wait or a deferral gave its attempt back (job_store.wait, defer), so
    the maximum grew by one each; `used_before` attempts were spent before a replay.

    >>> attempts_text(1, 3, ["completed"])
    '1 of 3'
    >>> attempts_text(2, 4, ["waiting", "completed"])
    '2 of 4 (3 + 1 for a wait)'
    >>> attempts_text(5, 7, ["deferred", "waiting", "deferred", "retry", None])
    '5 of 7 (4 + 1 for a wait + 2 for deferrals)'
    >>> attempts_text(5, 8, ["waiting", "retry"], used_before=3)
    '5 of 8 (3 before a replay + 4 + 1 for a wait)'
    """
    waits = sum(1 for outcome in outcomes if outcome == "waiting")
    deferrals = sum(1 for outcome in outcomes if outcome == "deferred")
    if not (waits or deferrals or used_before):
        return f"{attempts} of {max_attempts}"
    parts = [f"{used_before} before a replay"] if used_before else []
    parts.append(str(max_attempts - used_before - waits - deferrals))
    for count, what in ((waits, "wait"), (deferrals, "deferral")):
        if count:
            parts.append(f"1 for a {what}" if count == 1 else f"{count} for {what}s")
    return f"{attempts} of {max_attempts} ({' + '.join(parts)})"


def error_is_current(job: Job, since_reset: Sequence[Attempt]) -> bool:
    """Whether the job's last error is why it is in its state now: it is parked (failed,
    dead-lettered, denied, in doubt), or queued again by a retry, a lost worker or a
    deferral since its last replay. Not on a completed job (an old error of a replayed one),
    nor on a waiting, cancelled or running one.

    >>> from dataclasses import replace
    >>> from datetime import UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> job = Job("j", "a", "default", JobState.COMPLETED, {}, None, "o", None, 2, 3, None,
    ...           None, None, "boom", t, t, t, t)
    >>> retry = Attempt(1, "w", t, t, "retry", "E", "boom", None)
    >>> queued = replace(job, state=JobState.QUEUED)
    >>> error_is_current(job, [retry]), error_is_current(queued, [retry])
    (False, True)
    >>> error_is_current(replace(job, state=JobState.DEAD_LETTERED), [])
    True
    >>> error_is_current(replace(job, state=JobState.QUEUED), [])  # replayed, not run yet
    False
    """
    if not job.last_error:
        return False
    if job.state in PARKED:
        return True
    return (
        job.state is JobState.QUEUED
        and bool(since_reset)
        and since_reset[-1].outcome in REQUEUED_BY_ERROR
    )


def _queued_for(job: Job, attempts: Sequence[Attempt]) -> timedelta | None:
    """From its creation to its first start (a delay asked at submit counts too)."""
    if not attempts:
        return None
    due = job.created_at
    first = attempts[0].started_at
    return max(first - due, timedelta(0))


def _ran_for(attempts: Sequence[Attempt]) -> timedelta | None:
    """The finished attempts' run times added up (a running one is not counted yet)."""
    spans = [a.finished_at - a.started_at for a in attempts if a.finished_at is not None]
    return sum(spans, timedelta(0)) if spans else None


def duration(span: timedelta | None) -> str:
    """A duration to a tenth of a second, in the largest unit that reads well.

    >>> duration(timedelta(seconds=0.25)), duration(timedelta(seconds=75)), duration(None)
    ('0.2 s', '1 min 15 s', '')
    >>> duration(timedelta(hours=2, minutes=3))
    '2 h 3 min'
    """
    if span is None:
        return ""
    seconds = span.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
