"""Parking a run in `waiting` (template-owned: copier-agent-worker).

A run that reaches an undecided approval or unsettled children raises `Wait`; the runner
then parks the job with `park`: `waiting`, no lease, no arq entry, and the attempt not
counted. A decision (approvals.py) or the last child settling (job_store) moves it back to
`queued` in the transaction that records it; the job then re-runs from the top.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from . import job_store, queries


class Wait(BaseException):
    """Stop this run: the job waits for `reason` ("approval:NAME" or "children").

    A BaseException, so an agent's `except Exception` cannot swallow it by accident.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"waiting for {reason}")
        self.reason = reason


def approval_reason(name: str) -> str:
    """The `waiting_for` of a job waiting for approval `name`.

    >>> approval_reason("send")
    'approval:send'
    """
    return f"approval:{name}"


async def park(
    conn: AsyncConnection, job_id: str, *, attempt: int, reason: str, now: datetime
) -> Literal["waiting", "queued"] | None:
    """Move attempt `attempt`'s job to `waiting`; None when that attempt no longer holds it.

    Children may all have settled between the run's check and this write (each settling
    found the parent still `active`), so a parent whose children are done is queued again
    at once ("queued"): the caller hands it straight back to arq.
    """
    if not await job_store.wait(conn, job_id, attempt=attempt, reason=reason, now=now):
        return None
    if reason == queries.CHILDREN and await job_store.resume_if_children_settled(
        conn, job_id, now=now
    ):
        return "queued"
    return "waiting"
