"""`caps show/set` and `spend show`: daily spend caps and what paid calls spent
(template-owned: copier-agent-worker)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Annotated

import typer

from .. import money
from .app import app
from .support import JsonFlag, fail, load_settings, run, table

# Each command imports the service's modules it uses when it runs (support.py says why).

caps_app = typer.Typer(help="Daily spend caps (audited).", no_args_is_help=True)
spend_app = typer.Typer(help="What paid calls spent.", no_args_is_help=True)
app.add_typer(caps_app, name="caps")
app.add_typer(spend_app, name="spend")


@caps_app.command("show")
def caps_show(as_json: JsonFlag = False) -> None:
    """Every daily cap with today's (UTC) use."""
    _show_caps(datetime.now(UTC).date(), as_json)


@caps_app.command("set")
def caps_set(
    agent: Annotated[str, typer.Argument(help="Agent name, or '*' for the global cap.")],
    usd: Annotated[
        str, typer.Argument(help="The new daily cap in US dollars, 0 to 1000000, e.g. 25.00.")
    ],
    approved_by: Annotated[
        str | None, typer.Option(help="Who approved it; required to raise a cap.")
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the audit log.")] = None,
) -> None:
    """Change a daily cap of a paid agent or the global one ('*'). Raising one needs
    --approved-by; every change is audited."""
    from .. import actions, spend
    from ..db import create_engine

    try:
        amount = spend.parse_usd(usd, field="USD")
        actions.cap_target(agent)
    except spend.CapChangeRefused as exc:
        fail(str(exc))
    settings = load_settings()

    async def go() -> tuple[Decimal | None, Decimal]:
        engine = create_engine(settings)
        try:
            return await spend.set_cap(
                engine, agent, amount, approved_by=approved_by, reason=reason
            )
        finally:
            await engine.dispose()

    try:
        old, new = run(go(), settings)
    except spend.CapChangeRefused as exc:
        fail(str(exc))
    typer.echo(spend.cap_changed(agent, old, new))


@spend_app.command("show")
def spend_show(
    day: Annotated[str | None, typer.Option(help="UTC day, YYYY-MM-DD; default today.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Reserved and spent per agent on one UTC day, against each cap."""
    try:
        when = datetime.strptime(day, "%Y-%m-%d").date() if day else datetime.now(UTC).date()
    except ValueError:
        fail(f"--day must be a date like 2026-01-31 (got {day!r})")
    _show_caps(when, as_json)


def _show_caps(when: date, as_json: bool) -> None:
    from .. import catalog, spend
    from ..db import create_engine

    settings = load_settings()

    async def go() -> list[spend.Cap]:
        engine = create_engine(settings)
        try:
            async with engine.connect() as conn:
                return await spend.caps_for_day(conn, when)
        finally:
            await engine.dispose()

    caps = run(go(), settings)
    if as_json:
        typer.echo(json.dumps([c.as_dict(when) for c in caps], indent=2))
        return
    table(
        ["agent", "day", "cap", "reserved", "spent", "remaining"],
        [
            [
                spend.cap_label(c.agent),
                when.isoformat(),
                money.usd(c.cap_usd),
                money.usd(c.reserved_usd),
                money.usd(c.spent_usd),
                (
                    f"over by {money.usd(c.over_by_usd)}"
                    if c.over_by_usd
                    else money.usd(c.remaining_usd)
                ),
            ]
            for c in caps
        ],
    )
    capped = {cap.agent for cap in caps}
    for name, config in catalog.AGENTS.items():
        if config.paid and name not in capped:
            typer.echo(f"paid agent {name} has no cap: every job of it is denied (`caps set`)")
