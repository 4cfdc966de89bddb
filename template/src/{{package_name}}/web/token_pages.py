"""The console's Tokens page, for admins: list, create (the token shown once, on the page
that answers the create), revoke (template-owned: copier-agent-worker).

The same functions as `tokens create|list|revoke` (tokens.py), audited there with the
session's token as the actor. A new token is never put in a URL, a cookie or a log: the
page that shows it is the POST's own answer (sent `Cache-Control: no-store`, as every page).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import tokens
from ..tokens import Principal, Role
from .auth import Session
from .pages import page, redirect_back, render
from .services import Services


@page(Role.ADMIN)
async def tokens_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    return await _shown(request, services, principal, session)


@page(Role.ADMIN)
async def create(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Make a token; this answer is the only place it is ever shown."""
    form = await request.form()
    name = str(form.get("name") or "").strip()
    try:
        role = tokens.Role.parse(str(form.get("role") or ""))
        secret = await tokens.create(services.engine, name, role, actor=principal.name)
    except tokens.TokenError as exc:
        return await _shown(request, services, principal, session, 400, str(exc))
    return await _shown(request, services, principal, session, created=(name, role.label, secret))


@page(Role.ADMIN)
async def revoke(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Stop a token working at once (its console sessions too)."""
    form = await request.form()
    name = str(form.get("name") or "")
    try:
        await tokens.revoke(services.engine, name, actor=principal.name)
    except tokens.TokenError as exc:
        return await _shown(request, services, principal, session, 400, str(exc))
    return redirect_back("/tokens", f"token {name} is revoked")


async def _shown(
    request: Request,
    services: Services,
    principal: Principal,
    session: Session,
    status: int = 200,
    problem: str | None = None,
    created: tuple[str, str, str] | None = None,
) -> Response:
    async with services.engine.connect() as conn:
        found = await tokens.list_tokens(conn)
    return render(
        request,
        "tokens.html",
        status,
        principal=principal,
        session=session,
        tokens=found,
        roles=[role.label for role in tokens.Role],
        created=created,
        problem=problem,
        message=None if problem or created else request.query_params.get("message"),
    )


def routes() -> list[BaseRoute]:
    return [
        Route("/tokens", tokens_page, methods=["GET"]),
        Route("/tokens", create, methods=["POST"]),
        Route("/tokens/revoke", revoke, methods=["POST"]),
    ]
