"""Bearer tokens of the HTTP API and the web console, with their roles
(template-owned: copier-agent-worker).

A token is shown once, when it is made; the database keeps only its SHA-256 hash (a token
is 256 random bits, so a fast hash is enough: there is nothing to guess). Roles are ordered:
a viewer reads everything, an operator also submits, cancels, replays and decides approvals,
an admin also changes caps and tokens. Every check reads the row, so a revoked token stops
working on its next request. Creating and revoking a token are audited.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import audit
from .db import transaction
from .models import api_tokens

TOKEN_PREFIX = "awt_"  # noqa: S105 (a marker, not a secret)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")


class Role(IntEnum):
    """What a token may do; each role may do everything the ones below it may."""

    VIEWER = 1  # reads jobs, parked jobs, stats, caps and the audit log
    OPERATOR = 2  # also submits, cancels, replays and decides approvals
    ADMIN = 3  # also changes caps and tokens

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Role:
        """The role named `text`, or TokenError saying which roles exist.

        >>> Role.parse("operator") >= Role.VIEWER
        True
        """
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise TokenError(
                f"unknown role {text!r}; roles: {', '.join(r.label for r in cls)}"
            ) from None


class TokenError(ValueError):
    """A token request that breaks a rule; nothing was changed."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name and role. The name is the actor in the audit log."""

    name: str
    role: Role

    def may(self, needed: Role) -> bool:
        return self.role >= needed


@dataclass(frozen=True)
class ApiToken:
    """A token's row, without the hash."""

    name: str
    role: Role
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role.label,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "revoked_by": self.revoked_by,
        }


def hash_token(token: str) -> str:
    """The stored form of a token.

    >>> len(hash_token("awt_x"))
    64
    """
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    """Refuse a name that could not be shown plainly in logs and the audit log."""
    if not NAME.match(name):
        raise TokenError(
            f"token name {name!r} is not allowed; use 1-100 letters, digits, '_', '.', '@' "
            "or '-', starting with a letter or digit (e.g. ana or ci-bot)"
        )
    return name


async def create(engine: AsyncEngine, name: str, role: Role, *, actor: str) -> str:
    """Make a token and return it (the only time it is seen); audited."""
    check_name(name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        exists = await conn.scalar(select(api_tokens.c.name).where(api_tokens.c.name == name))
        if exists is not None:
            raise TokenError(f"a token named {name!r} exists already; choose another name")
        await conn.execute(
            insert(api_tokens).values(
                name=name,
                role=role.label,
                token_hash=hash_token(token),
                created_at=now,
                created_by=actor,
            )
        )
        await audit.record(
            conn,
            actor=actor,
            action="token_create",
            target=f"token:{name}",
            details={"role": role.label},
            now=now,
        )
    return token


async def revoke(engine: AsyncEngine, name: str, *, actor: str) -> None:
    """Stop a token working, at once; audited. Revoking twice is refused."""
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        moved = await conn.execute(
            update(api_tokens)
            .where(api_tokens.c.name == name, api_tokens.c.revoked_at.is_(None))
            .values(revoked_at=now, revoked_by=actor)
        )
        if moved.rowcount != 1:
            raise TokenError(f"no active token named {name!r} (see `tokens list`)")
        await audit.record(
            conn, actor=actor, action="token_revoke", target=f"token:{name}", details={}, now=now
        )


async def list_tokens(conn: AsyncConnection) -> list[ApiToken]:
    """Every token, active ones first, by name."""
    rows = await conn.execute(
        select(
            api_tokens.c.name,
            api_tokens.c.role,
            api_tokens.c.created_at,
            api_tokens.c.created_by,
            api_tokens.c.revoked_at,
            api_tokens.c.revoked_by,
        ).order_by(api_tokens.c.revoked_at.is_not(None), api_tokens.c.name)
    )
    return [ApiToken(**{**row._mapping, "role": Role.parse(row.role)}) for row in rows]


async def authenticate(conn: AsyncConnection, token: str) -> Principal | None:
    """The principal of an active token, or None for a wrong, unknown or revoked one."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = (
        await conn.execute(
            select(api_tokens.c.name, api_tokens.c.role).where(
                api_tokens.c.token_hash == hash_token(token), api_tokens.c.revoked_at.is_(None)
            )
        )
    ).first()
    return None if row is None else Principal(row.name, Role.parse(row.role))


async def principal_of(conn: AsyncConnection, name: str, token_hash: str) -> Principal | None:
    """The principal behind a console session (the token's name and hash), if still active."""
    row = (
        await conn.execute(
            select(api_tokens.c.role).where(
                api_tokens.c.name == name,
                api_tokens.c.token_hash == token_hash,
                api_tokens.c.revoked_at.is_(None),
            )
        )
    ).first()
    return None if row is None else Principal(name, Role.parse(row.role))
