"""`approvals list/approve/reject` (template-owned: copier-agent-worker).

Both decisions call `approvals.decide`, the one implementation a web console or API would
call too; this module only reads options and prints.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..money import usd
from ..states import JobState
from .app import app
from .support import JsonFlag, fail, load_settings, run, short_time, table, with_conn

# Each command imports the service's modules it uses when it runs (support.py says why).

approvals_app = typer.Typer(
    help="Jobs waiting for a person: list, approve, reject (audited).", no_args_is_help=True
)
app.add_typer(approvals_app, name="approvals")
ApprovedBy = Annotated[str | None, typer.Option(help="Who decided (required; audited).")]


@approvals_app.command("list")
def approvals_list(as_json: JsonFlag = False) -> None:
    """Pending approvals, oldest first."""
    from .. import approvals

    settings = load_settings()
    found = run(with_conn(settings, lambda conn: approvals.pending(conn)), settings)
    if as_json:
        typer.echo(json.dumps([a.as_dict() for a in found], indent=2))
        return
    table(
        ["job", "agent", "approval", "requested", "expires", "summary"],
        [
            [
                a.job_id,
                a.agent,
                a.name,
                short_time(a.requested_at),
                short_time(a.expires_at) if a.expires_at else "",
                a.summary[:60],
            ]
            for a in found
        ],
    )


@approvals_app.command("approve")
def approvals_approve(
    job_id: str,
    approved_by: ApprovedBy = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the audit log.")] = None,
    raise_budget_usd: Annotated[
        str | None,
        typer.Option(
            "--raise-budget-usd",
            help="For a job waiting on its budget: add this much to what stopped it.",
        ),
    ] = None,
) -> None:
    """Approve what a waiting job asked for: it is queued again and goes on."""
    from .. import spend
    from ..budgets import BudgetRefused, parse_budget

    if not approved_by:
        fail("approving needs --approved-by NAME (who decided, for the audit log)")
    try:
        raise_micros = parse_budget(raise_budget_usd, field="--raise-budget-usd")
    except BudgetRefused as exc:
        fail(str(exc))
    state = _decide(job_id, approved=True, by=approved_by, reason=reason, raise_micros=raise_micros)
    raised = f", {usd(spend.to_usd(raise_micros))} more to spend" if raise_micros else ""
    typer.echo(f"job {job_id} approved by {approved_by}{raised}; it is now {state.value}")


@approvals_app.command("reject")
def approvals_reject(
    job_id: str,
    approved_by: ApprovedBy = None,
    reason: Annotated[
        str | None, typer.Option(help="Why (required): the job fails with it.")
    ] = None,
) -> None:
    """Reject what a waiting job asked for: it ends `failed` with the reason."""
    if not approved_by:
        fail("rejecting needs --approved-by NAME (who decided, for the audit log)")
    if not reason:
        fail("rejecting needs --reason TEXT (the job fails with it)")
    state = _decide(job_id, approved=False, by=approved_by, reason=reason)
    typer.echo(f"job {job_id} rejected by {approved_by}; it is now {state.value}")


def _decide(
    job_id: str, *, approved: bool, by: str, reason: str | None, raise_micros: int | None = None
) -> JobState:
    from .. import actions
    from ..approvals import ApprovalError
    from ..db import create_engine

    settings = load_settings()

    async def go() -> tuple[JobState | None, str]:
        engine = create_engine(settings)
        try:
            state = await actions.decide(
                settings,
                engine,
                job_id,
                approved=approved,
                by=by,
                reason=reason,
                raise_micros=raise_micros,
            )
            return state, ""
        except ApprovalError as exc:
            return None, str(exc)
        finally:
            await engine.dispose()

    state, refusal = run(go(), settings)
    if state is None:
        fail(refusal, code=1)
    return state
