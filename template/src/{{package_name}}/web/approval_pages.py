"""The console's Approvals page: jobs waiting for a person, approved or rejected by an
operator (template-owned: copier-agent-worker).

A decision goes through `actions.decide`, as `approvals approve|reject` and
`POST /api/approvals/{job_id}/decide` do; the decider is the session's token. A `budget`
ask may be approved with a raise (`raise_budget_usd`, dollars read as a Decimal by
`budgets.parse_budget`, never a float). Bad input re-renders the page with one line saying
what is wrong, as a 400, and writes nothing.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import actions, approvals, budgets, spend
from ..budget_asks import BUDGET
from ..money import usd
from ..tokens import Principal, Role
from .auth import Session
from .inputs import InputError, blank
from .pages import page, redirect_back, render
from .services import Services

MAX_REASON = 2000


@page(Role.VIEWER)
async def approvals_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    return await _shown(request, services, principal, session)


@page(Role.OPERATOR)
async def decide(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Approve (with a raise, for a `budget` ask) or reject one job's pending approval."""
    job_id = request.path_params["job_id"]
    form = await request.form()
    try:
        approved, reason, raise_micros = await _read(services, job_id, form)
    except InputError as exc:
        return await _shown(request, services, principal, session, exc.status, exc.message)
    try:
        state = await actions.decide(
            services.settings,
            services.engine,
            job_id,
            approved=approved,
            by=principal.name,
            reason=reason,
            raise_micros=raise_micros,
        )
    except approvals.ApprovalError as exc:
        return await _shown(request, services, principal, session, 409, str(exc))
    verb = "approved" if approved else "rejected"
    raised = f" with {usd(spend.to_usd(raise_micros))} more to spend" if raise_micros else ""
    return redirect_back("/approvals", f"job {job_id} {verb}{raised}; it is now {state.value}")


async def _read(services: Services, job_id: str, form: Any) -> tuple[bool, str | None, int | None]:
    """(approved, reason, raise in micro-dollars) from the form, or InputError (400)."""
    decision = form.get("decision")
    if decision not in ("approve", "reject"):
        raise InputError(400, "choose Approve or Reject")
    approved = decision == "approve"
    reason = str(form.get("reason") or "").strip() or None
    if reason is not None and len(reason) > MAX_REASON:
        raise InputError(400, f"the reason is longer than {MAX_REASON} characters; shorten it")
    if not approved and blank(reason):
        raise InputError(400, "a rejection needs a reason: the job fails with it")
    amount = str(form.get("raise_budget_usd") or "").strip()
    if not amount:
        return approved, reason, None
    if not approved:
        raise InputError(400, "a raise goes with an approval, not a rejection; nothing changed")
    try:
        micros = budgets.parse_budget(amount, field="the raise")
    except budgets.BudgetRefused as exc:
        raise InputError(400, str(exc)) from None
    async with services.engine.connect() as conn:
        waiting = [a for a in await approvals.of_job(conn, job_id) if a.state == "pending"]
    if waiting and waiting[0].name != BUDGET:
        raise InputError(
            400,
            f"job {job_id} waits on {waiting[0].name!r}, not its budget: approve it "
            "without a raise",
        )
    return approved, reason, micros


async def _shown(
    request: Request,
    services: Services,
    principal: Principal,
    session: Session,
    status: int = 200,
    problem: str | None = None,
) -> Response:
    async with services.engine.connect() as conn:
        found = await approvals.pending(conn)
    return render(
        request,
        "approvals.html",
        status,
        principal=principal,
        session=session,
        approvals=found,
        budget=BUDGET,
        problem=problem,
        message=None if problem else request.query_params.get("message"),
    )


def routes() -> list[BaseRoute]:
    return [
        Route("/approvals", approvals_page, methods=["GET"]),
        Route("/approvals/{job_id}/decide", decide, methods=["POST"]),
    ]
