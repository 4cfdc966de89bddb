"""Who is calling, and may they: bearer tokens for the API, a signed session cookie and
CSRF tokens for the console, security headers for every response
(template-owned: copier-agent-worker).

Every check reads the token's row, so a revoked token (and every console session opened
with it) stops working on its next request. Roles are checked here, on the server, for every
request: the console hides buttons a role may not use, but that is a courtesy, not the check.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..tokens import Principal, Role, authenticate, hash_token, principal_of

SESSION_COOKIE = "console_session"
SESSION_MAX_AGE_S = 12 * 3600
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class Denied(Exception):
    """A request refused for who is asking: 401 (no valid credentials) or 403 (role, CSRF)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def require(principal: Principal, needed: Role) -> None:
    """Refuse (403) a principal whose role is below `needed`."""
    if not principal.may(needed):
        raise Denied(
            403,
            f"this needs the {needed.label} role; token {principal.name!r} is a "
            f"{principal.role.label}",
        )


async def bearer_principal(request: Request, engine: AsyncEngine) -> Principal:
    """The API caller, from `Authorization: Bearer <token>` only (never the console cookie)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Denied(401, "send a token: Authorization: Bearer <token> (see `tokens create`)")
    async with engine.connect() as conn:
        principal = await authenticate(conn, token.strip())
    if principal is None:
        raise Denied(401, "the token is wrong, unknown or revoked")
    return principal


@dataclass(frozen=True)
class Session:
    """A console session: the token's name and hash (never the token) and its CSRF token."""

    name: str
    token_hash: str
    csrf: str


class Sessions:
    """Signs and reads the console's session cookie (itsdangerous, with the web secret)."""

    def __init__(self, secret: str) -> None:
        self._signer = URLSafeTimedSerializer(secret, salt="console-session")

    def new(self, principal: Principal, token: str) -> tuple[Session, str]:
        session = Session(principal.name, hash_token(token), secrets.token_urlsafe(24))
        value = self._signer.dumps({"n": session.name, "h": session.token_hash, "c": session.csrf})
        return session, value

    def read(self, request: Request) -> Session | None:
        value = request.cookies.get(SESSION_COOKIE)
        if not value:
            return None
        try:
            data = self._signer.loads(value, max_age=SESSION_MAX_AGE_S)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in "nhc"):
            return None
        return Session(data["n"], data["h"], data["c"])

    @staticmethod
    def cookie_options(request: Request) -> dict[str, Any]:
        """HttpOnly, SameSite=Strict, and Secure when the request came over HTTPS (behind a
        proxy, run `web --proxy-headers` so that the scheme is the client's)."""
        return {
            "key": SESSION_COOKIE,
            "max_age": SESSION_MAX_AGE_S,
            "httponly": True,
            "samesite": "strict",
            "secure": request.url.scheme == "https",
            "path": "/",
        }


async def session_principal(
    request: Request, engine: AsyncEngine, sessions: Sessions
) -> tuple[Principal, Session] | None:
    """The console user, if the cookie is valid and its token is still active."""
    session = sessions.read(request)
    if session is None:
        return None
    async with engine.connect() as conn:
        principal = await principal_of(conn, session.name, session.token_hash)
    return None if principal is None else (principal, session)


def check_csrf(request: Request, session: Session, form: Mapping[str, Any]) -> None:
    """Refuse (403) a console POST that is cross-site or lacks the session's CSRF token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in {"same-origin", "none"}:
        raise Denied(403, "cross-site requests are refused")
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise Denied(403, "cross-site requests are refused")
    sent = form.get("csrf_token")
    if not isinstance(sent, str) or not hmac.compare_digest(sent, session.csrf):
        raise Denied(403, "the form's csrf_token is missing or wrong; reload the page")


class SecurityHeaders:
    """ASGI middleware: a Content-Security-Policy and friends on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
