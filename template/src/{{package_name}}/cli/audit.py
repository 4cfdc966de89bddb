"""`audit list`: who changed a cap, replayed, cancelled or resolved a job, or made or
revoked a token, and when (template-owned: copier-agent-worker)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import app
from .support import JsonFlag, load_settings, run, short_time, table, with_conn

if TYPE_CHECKING:
    from .. import audit

audit_app = typer.Typer(help="The audit log.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


@audit_app.command("list")
def audit_list(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    actor: Annotated[str | None, typer.Option(help="Only entries by this actor.")] = None,
    target: Annotated[
        str | None, typer.Option(help="Only entries about this job id, agent or token:NAME.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """The newest audit entries, newest first."""
    from .. import audit  # here, not at the top: the other commands do not load it

    settings = load_settings()

    async def read(conn: Any) -> list[audit.AuditEntry]:
        return await audit.recent(conn, limit=limit, actor=actor, target=target)

    found = run(with_conn(settings, read), settings)
    if as_json:
        typer.echo(json.dumps([e.as_dict() for e in found], indent=2))
        return
    table(
        ["at", "actor", "action", "target", "details"],
        [
            [short_time(e.at), e.actor, e.action, e.target, json.dumps(e.details)[:70]]
            for e in found
        ],
    )
