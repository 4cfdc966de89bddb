"""Admin commands for schedules: `schedules list/pause/resume` (template-owned:
copier-agent-worker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from .app import app
from .support import JsonFlag, fail, load_settings, run, short_time, table, with_conn

if TYPE_CHECKING:
    from .. import schedules
    from ..settings import Settings

# Each command imports the service's modules it uses when it runs (support.py says why).

schedules_app = typer.Typer(help="Schedules: list them, pause and resume with approval.")
app.add_typer(schedules_app, name="schedules")
ApprovedBy = Annotated[str | None, typer.Option(help="Who approved this (required).")]


def _configured(settings: Settings) -> dict[str, schedules.Schedule]:
    from .. import registry

    return registry.schedules_of(settings)


@schedules_app.command("list")
def schedules_list(as_json: JsonFlag = False) -> None:
    """Each schedule with its next tick and its last job."""
    from .. import schedules

    settings = load_settings()
    found = _configured(settings)
    now = datetime.now(UTC)
    states = run(with_conn(settings, lambda c: schedules.states(c, found, now)), settings)
    if as_json:
        typer.echo(json.dumps([state.as_dict() for state in states], indent=2))
        return
    if not states:
        typer.echo("no schedules (add them with copier update -d 'schedules={...}')")
        return
    table(
        ["name", "agent", "when", "state", "next tick", "last tick", "last job"],
        [
            [
                state.name,
                state.schedule.agent,
                state.schedule.cron or f"every {state.schedule.every_s}s",
                f"paused by {state.paused_by}" if state.paused else "active",
                short_time(state.next_tick_at),
                short_time(state.last_tick_at) if state.last_tick_at else "-",
                state.last_job_id or "-",
            ]
            for state in states
        ],
    )


def _set_paused(name: str, approved_by: str | None, *, paused: bool) -> None:
    from .. import schedules
    from ..db import create_engine, transaction

    verb = "pause" if paused else "resume"
    if not approved_by:
        fail(f"schedules {verb} needs --approved-by NAME (who approved it)")
    settings = load_settings()
    found = _configured(settings)
    if name not in found:
        fail(f"no schedule named {name!r}; the schedules are: {', '.join(sorted(found)) or 'none'}")

    async def go() -> bool:
        engine = create_engine(settings)
        try:
            async with transaction(engine) as conn:
                return await schedules.set_paused(
                    conn,
                    found,
                    name,
                    paused=paused,
                    approved_by=approved_by,
                    now=datetime.now(UTC),
                )
        finally:
            await engine.dispose()

    changed = run(go(), settings)
    state = "paused" if paused else "resumed"
    typer.echo(f"{name} {state}" if changed else f"{name} was already {state}")


@schedules_app.command("pause")
def schedules_pause(
    name: Annotated[str, typer.Argument(help="Schedule name.")], approved_by: ApprovedBy = None
) -> None:
    """Stop a schedule making jobs (audited)."""
    _set_paused(name, approved_by, paused=True)


@schedules_app.command("resume")
def schedules_resume(
    name: Annotated[str, typer.Argument(help="Schedule name.")], approved_by: ApprovedBy = None
) -> None:
    """Let a paused schedule make jobs again from its next tick (audited)."""
    _set_paused(name, approved_by, paused=False)
