"""Job states and the transitions between them (template-owned: copier-agent-worker).

A state names who acts next. The same string is used in the database, the logs, the CLI
and the docs; `TRANSITIONS` is the single table the job store, the docs diagram and the
tests read.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Where a job is; one line of meaning per member."""

    QUEUED = "queued"  # waiting for a worker (first run, retry, or not before run_after)
    ACTIVE = "active"  # a worker holds the lease
    COMPLETED = "completed"  # finished; result stored
    FAILED = "failed"  # permanent failure (bad input, GiveUp): never retried automatically
    DEAD_LETTERED = "dead_lettered"  # retries exhausted; waits for an approved replay
    DENIED = "denied"  # spend policy refused it before any paid call
    IN_DOUBT = "in_doubt"  # a worker died during a paid call; the charge may have happened
    CANCELLED = "cancelled"  # stopped by an operator
    WAITING = "waiting"  # an approval or the job's children act next; no lease, no arq entry


RUNNABLE = frozenset({JobState.QUEUED})
IN_FLIGHT = frozenset({JobState.ACTIVE})
PARKED = frozenset({JobState.FAILED, JobState.DEAD_LETTERED, JobState.DENIED, JobState.IN_DOUBT})
TERMINAL = frozenset({JobState.COMPLETED, JobState.CANCELLED})
WAITING = frozenset({JobState.WAITING})
# A child in one of these states has settled: its parent's `wait_children` may go on.
SETTLED = TERMINAL | PARKED - {JobState.IN_DOUBT}

Q, A, W = JobState.QUEUED, JobState.ACTIVE, JobState.WAITING

# verb -> (states it moves from, state it moves to). job_store has one function per verb.
TRANSITIONS: dict[str, tuple[frozenset[JobState], JobState]] = {
    "claim": (frozenset({Q, A}), A),  # from ACTIVE only when the lease has expired
    "heartbeat": (frozenset({A}), A),
    "complete": (frozenset({A}), JobState.COMPLETED),
    "retry": (frozenset({A}), Q),
    "defer": (frozenset({A}), Q),  # an upstream rate limit: no attempt used
    "fail": (frozenset({A}), JobState.FAILED),
    "dead_letter": (frozenset({A}), JobState.DEAD_LETTERED),
    "deny": (frozenset({Q, A}), JobState.DENIED),
    "rescue": (frozenset({A}), Q),  # recovery: the lease expired and no paid call is open
    "mark_in_doubt": (frozenset({A}), JobState.IN_DOUBT),
    "replay": (PARKED, Q),  # operator-approved; from IN_DOUBT only by `dlq resolve --outcome retry`
    "resolve": (frozenset({JobState.IN_DOUBT}), JobState.COMPLETED),
    "reject": (frozenset({JobState.IN_DOUBT}), JobState.FAILED),
    "cancel": (RUNNABLE | PARKED | WAITING, JobState.CANCELLED),
    "stop": (frozenset({A}), JobState.CANCELLED),  # a cancel reached the running job (cancels.py)
    "wait": (frozenset({A}), W),  # the run reached an undecided approval or unsettled children
    "resume": (WAITING, Q),  # the approval was decided, or the last child settled
    "decline": (WAITING, JobState.FAILED),  # a person rejected the job's approval
    "expire": (RUNNABLE | WAITING, JobState.FAILED),  # its run deadline passed (deadlines.py)
}


def sources(verb: str) -> frozenset[JobState]:
    """The states `verb` may move a job from.

    >>> sorted(sources("complete"))
    [<JobState.ACTIVE: 'active'>]
    """
    return TRANSITIONS[verb][0]


def target(verb: str) -> JobState:
    """The state `verb` moves a job to.

    >>> target("dead_letter").value
    'dead_lettered'
    """
    return TRANSITIONS[verb][1]


def mermaid() -> str:
    """The lifecycle as a Mermaid state diagram, one edge per (verb, source) pair.

    >>> mermaid().splitlines()[:3]
    ['stateDiagram-v2', '    [*] --> queued: enqueue', '    queued --> active: claim']
    """
    lines = ["stateDiagram-v2", f"    [*] --> {JobState.QUEUED.value}: enqueue"]
    for verb, (froms, to) in TRANSITIONS.items():
        for source in sorted(froms, key=list(JobState).index):
            lines.append(f"    {source.value} --> {to.value}: {verb}")
    for state in sorted(TERMINAL, key=list(JobState).index):
        lines.append(f"    {state.value} --> [*]")
    return "\n".join(lines)
