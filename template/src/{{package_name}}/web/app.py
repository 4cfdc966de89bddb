"""The one ASGI app behind `<slug> web`: the JSON API under /api/ and the console
(template-owned: copier-agent-worker).

Safe by default: it binds 127.0.0.1 unless told otherwise (`web --host`), refuses to start
in prod without `<PREFIX>WEB_SECRET` (the key that signs console sessions), sends a
Content-Security-Policy on every response and checks roles on the server for every request.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import catalog
from ..models import GLOBAL
from ..settings import ENV_PREFIX, Settings, SettingsError
from . import api, approval_pages, pages, timeline_pages, token_pages
from .auth import Denied, SecurityHeaders
from .inputs import InputError
from .openapi import document
from .services import Services

STATIC = Path(__file__).parent / "static"
SECRET_VAR = f"{ENV_PREFIX}WEB_SECRET"
MIN_SECRET_CHARS = 32
log = structlog.get_logger("web")


class WebSettings(BaseSettings):
    """The web app's own settings: `<PREFIX>WEB_SECRET` signs console sessions."""

    model_config = SettingsConfigDict(env_prefix=f"{ENV_PREFIX}WEB_", extra="ignore")

    secret: SecretStr | None = None


def web_secret(settings: Settings, web: WebSettings) -> tuple[str, bool]:
    """The session-signing secret and whether it was made up for this run (dev only).

    Prod refuses to start without one, or with one too short to be a key.
    """
    value = web.secret.get_secret_value() if web.secret is not None else ""
    if value and len(value) < MIN_SECRET_CHARS:
        raise SettingsError(
            f"{SECRET_VAR} is {len(value)} characters; use at least {MIN_SECRET_CHARS} random "
            """ones, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"""
        )
    if value:
        return value, False
    if settings.env != "dev":
        raise SettingsError(
            f"{SECRET_VAR} is not set and {ENV_PREFIX}ENV is {settings.env!r}: set it to a long "
            """random string (python -c 'import secrets; print(secrets.token_urlsafe(32))')"""
        )
    return secrets.token_urlsafe(32), True


def create_app(settings: Settings, secret: str) -> Starlette:
    """Build the app; the caller has checked the secret (`web_secret`)."""
    services = Services(settings, secret)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await services.close()

    app = Starlette(
        routes=[
            Mount("/api", routes=api.routes()),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            *pages.routes(),
            *approval_pages.routes(),
            *token_pages.routes(),
            *timeline_pages.routes(),
        ],
        # Outermost first: the security headers go on every response, the 500s too.
        middleware=[Middleware(SecurityHeaders), Middleware(Unexpected)],
        exception_handlers={InputError: on_error, Denied: on_error, HTTPException: on_error},
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.openapi = document(
        services.submitter.agents,
        [GLOBAL, *(name for name, config in catalog.AGENTS.items() if config.paid)],
        catalog.LANES,
    )
    return app


async def on_error(request: Request, exc: Exception) -> Response:
    """JSON `{"error": ...}` under /api/; a page (or the way to /login) in the console."""
    headers: dict[str, str] = {}
    if isinstance(exc, InputError | Denied):
        status, message = exc.status, exc.message
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:  # pragma: no cover - only the three classes above are registered
        raise exc
    if status == 405:  # every method of the path, not only those of the route tried first
        # Matched afresh from the app's root: the scope here is the matched route's own.
        scope = {
            "type": "http",
            "method": request.method,
            "path": request.scope["path"],
            "root_path": request.scope.get("app_root_path", ""),
        }
        headers["allow"] = ", ".join(sorted(allowed_methods(request.app.routes, scope)))
    if request.url.path.startswith("/api/"):
        if status == 401:
            headers["www-authenticate"] = "Bearer"
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    response = await pages.error_page(request, status, message)
    response.headers.update(headers)
    return response


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> set[str]:
    """The methods some route answers at this path (Starlette's 405 names only the first
    route matched; the API and the console have several routes per path)."""
    found: set[str] = set()
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.NONE:
            continue
        if isinstance(route, Mount):
            found |= allowed_methods(route.routes, {**scope, **child})
        elif isinstance(route, Route):
            found |= route.methods or set()
    return found


class Unexpected:
    """ASGI middleware: an exception no handler answered becomes a 500 that says so, with
    an `error_id` that the logged traceback carries too; never a bare text page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_watched)
        except Exception as exc:
            error_id = uuid.uuid4().hex[:12]
            log.error(
                "web_request_failed",
                error_id=error_id,
                method=scope["method"],
                path=scope["path"],
                exc_info=exc,
            )
            if started:  # half a response is out: only the server can end it
                raise
            response = await unexpected_response(Request(scope), error_id)
            await response(scope, receive, send)


async def unexpected_response(request: Request, error_id: str) -> Response:
    """The 500 of `Unexpected`: JSON under /api/, the console's error page elsewhere."""
    message = f"something went wrong on the server; its log has the details under {error_id}"
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message, "error_id": error_id}, status_code=500)
    return await pages.error_page(request, 500, message)
