"""`tokens create/list/revoke`: bearer tokens of the HTTP API and the web console
(template-owned: copier-agent-worker)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .app import app
from .support import JsonFlag, fail, load_settings, run, short_time, table, with_conn

tokens_app = typer.Typer(
    help="Bearer tokens of the API and the console (viewer < operator < admin).",
    no_args_is_help=True,
)
# Each command imports the service's modules it uses when it runs (support.py says why).
app.add_typer(tokens_app, name="tokens")
By = Annotated[str, typer.Option(help="Who does this, for the audit log.")]


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Argument(help="Who or what holds the token, e.g. ana, ci-bot.")],
    role: Annotated[str, typer.Option(help="viewer, operator or admin.")],
    by: By = "cli",
) -> None:
    """Make a token; it is printed once, on the last line, and only its hash is kept."""
    from .. import tokens
    from ..db import create_engine

    try:
        wanted = tokens.Role.parse(role)
        tokens.check_name(name)
    except tokens.TokenError as exc:
        fail(str(exc))
    settings = load_settings()

    async def go() -> str:
        engine = create_engine(settings)
        try:
            return await tokens.create(engine, name, wanted, actor=by)
        finally:
            await engine.dispose()

    try:
        token = run(go(), settings)
    except tokens.TokenError as exc:
        fail(str(exc))
    typer.echo(f"token {name} ({wanted.label}) created; it is shown only now, store it safely:")
    typer.echo(token)


@tokens_app.command("list")
def tokens_list(as_json: JsonFlag = False) -> None:
    """Every token's name, role and state (never the token itself)."""
    from .. import tokens

    settings = load_settings()
    found = run(with_conn(settings, tokens.list_tokens), settings)
    if as_json:
        typer.echo(json.dumps([t.as_dict() for t in found], indent=2))
        return
    table(
        ["name", "role", "created", "by", "revoked"],
        [
            [
                t.name,
                t.role.label,
                short_time(t.created_at),
                t.created_by,
                f"{short_time(t.revoked_at)} by {t.revoked_by}" if t.revoked_at else "",
            ]
            for t in found
        ],
    )


@tokens_app.command("revoke")
def tokens_revoke(
    name: Annotated[str, typer.Argument(help="The token's name.")], by: By = "cli"
) -> None:
    """Stop a token working, at once (audited)."""
    from .. import tokens
    from ..db import create_engine

    settings = load_settings()

    async def go() -> None:
        engine = create_engine(settings)
        try:
            await tokens.revoke(engine, name, actor=by)
        finally:
            await engine.dispose()

    try:
        run(go(), settings)
    except tokens.TokenError as exc:
        fail(str(exc))
    typer.echo(f"token {name} is revoked")
