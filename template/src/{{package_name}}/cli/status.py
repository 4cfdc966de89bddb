"""`stats` and `doctor`: how the service is doing (template-owned: copier-agent-worker)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from ..money import usd
from .app import app
from .support import JsonFlag, fail, load_settings, run, table

# Each command imports the service's modules it uses when it runs (support.py says why).


@app.command()
def doctor(
    as_json: JsonFlag = False,
    probe: Annotated[
        str | None,
        typer.Option(
            help="live or ready: ask this machine's worker (its /livez or /readyz) and print "
            "nothing; exit code 0 when it answers 200.",
        ),
    ] = None,
) -> None:
    """Check the database, Redis (reachable, no eviction, memory, TLS) and spend caps; exit
    code 1 when any check fails."""
    from pydantic import ValidationError

    from ..observe import doctor as checks
    from ..settings import ENV_PREFIX, Settings, SettingsError, check_database

    if probe is not None:
        if probe not in ("live", "ready"):
            fail(f"--probe must be live or ready (got {probe!r})")
        settings = load_settings()
        if settings.http_port == 0:
            fail(f"{ENV_PREFIX}HTTP_PORT is 0: the worker serves no probes; set a port")
        raise typer.Exit(checks.probe(settings, probe))
    try:
        settings = Settings()  # not get_settings(): a TLS mistake is one of doctor's lines
    except ValidationError:
        settings = load_settings()  # says which setting is invalid, and exits 2
    try:
        check_database(settings)
    except SettingsError as exc:
        fail(str(exc))
    results = asyncio.run(checks.run_checks(settings))
    ok = checks.passed(results)
    if as_json:
        out = {"ok": ok, "checks": [check.as_dict() for check in results]}
        typer.echo(json.dumps(out, indent=2))
    else:
        for check in results:
            typer.echo(check.line())
    raise typer.Exit(0 if ok else 1)


@app.command()
def stats(as_json: JsonFlag = False) -> None:
    """Counts by state, queue depth per lane, parked causes, spend today, unsent replies,
    and what each limit runs and holds waiting."""
    from .. import catalog, limits
    from ..db import create_engine
    from ..observe import stats as service
    from ..queue import JobQueue

    settings = load_settings()

    async def go() -> dict[str, Any]:
        engine = create_engine(settings)
        queue = await JobQueue.connect(settings, conn_retries=0)
        try:
            async with engine.connect() as conn:
                found = await service.read_service_stats(conn)
            depths = await service.lane_depths(queue, catalog.LANES)
            held = await service.limits_usage(queue, settings)
        finally:
            await queue.close()
            await engine.dispose()
        return {**service.as_json(found, depths, catalog.LANES), "limits": held}

    out = run(go(), settings)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    rough = set(out["estimated_states"])  # "~": PostgreSQL's estimate, past 100,000 rows
    counts = out["jobs_by_state"].items()
    table(["state", "jobs"], [[s, f"~{n}" if s in rough else str(n)] for s, n in counts])
    typer.echo("")
    table(
        ["lane", "in redis", "oldest due for", "scheduled"],
        [
            [
                lane,
                str(v["redis_depth"]),
                "" if v["oldest_queued_age_s"] is None else f"{v['oldest_queued_age_s']} s",
                str(v["scheduled"]),
            ]
            for lane, v in out["lanes"].items()
        ],
    )
    typer.echo("")
    table(
        ["cause id", "parked", "cause"],
        [[c["cause_id"], str(c["count"]), c["cause"][:60]] for c in out["parked_by_cause"]],
    )
    typer.echo("")
    table(
        ["agent", "cap", "spent today", "reserved"],
        [
            [c["agent"], usd(c["cap_usd"]), usd(c["spent_usd"]), usd(c["reserved_usd"])]
            for c in out["spend_today"]
        ],
    )
    typer.echo(f"\nunsent replies: {out['unsent_replies']}")
    if out["unsent_webhooks"] or out["failed_webhooks"]:
        typer.echo(
            f"webhook notifications: {out['unsent_webhooks']} unsent, "
            f"{out['failed_webhooks']} given up"
        )
    if out["limits"]:
        typer.echo("")
        table(
            ["limit", "running", "sizes", f"waiting (last {limits.WAITING_RECENT_S:g} s)"],
            [
                [
                    str(row["limit"]),
                    "-" if row["running"] is None else str(row["running"]),
                    ", ".join(
                        f"{k}={v}"
                        for k, v in row.items()
                        if k not in {"limit", "running", "waiting"} and v is not None
                    ),
                    str(row["waiting"]),
                ]
                for row in out["limits"]
            ],
        )
