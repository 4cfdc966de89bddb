"""`stats` and `doctor`: how the service is doing (template-owned: copier-agent-worker)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import ValidationError

from .. import catalog, dlq, job_store, replies, spend
from ..db import create_engine
from ..queue import JobQueue
from ..settings import Settings, SettingsError, check_database
from ..states import JobState
from .app import app
from .support import JsonFlag, fail, load_settings, run, table


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check the database, Redis (reachable, no eviction, memory, TLS) and spend caps; exit
    code 1 when any check fails."""
    from .. import doctor as checks

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
    """Counts by state, queue depth per lane, parked causes, spend today, unsent replies."""
    settings = load_settings()

    async def go() -> dict[str, Any]:
        engine = create_engine(settings)
        queue = await JobQueue.connect(settings, conn_retries=0)
        try:
            async with engine.connect() as conn:
                by_state = await job_store.count_by_state(conn)
                oldest = await job_store.oldest_queued(conn)
                causes = await dlq.causes(conn)
                caps = await spend.caps_for_day(conn, datetime.now(UTC).date())
                unsent = await replies.unsent(conn)
            depth = {lane: await queue.depth(lane) for lane in catalog.LANES}
        finally:
            await queue.close()
            await engine.dispose()
        now = datetime.now(UTC)
        return {
            "jobs_by_state": {s.value: by_state.get(s.value, 0) for s in JobState},
            "lanes": {
                lane: {
                    "redis_depth": depth[lane],
                    "oldest_queued_age_s": round((now - oldest[lane]).total_seconds(), 1)
                    if lane in oldest
                    else None,
                }
                for lane in catalog.LANES
            },
            "parked_by_cause": [
                {"cause_id": g.cause_id, "count": g.count, "cause": g.cause} for g in causes
            ],
            "spend_today": [
                {
                    "agent": c.agent,
                    "cap_usd": str(c.cap_usd),
                    "spent_usd": str(c.spent_usd),
                    "reserved_usd": str(c.reserved_usd),
                }
                for c in caps
            ],
            "unsent_replies": unsent,
        }

    out = run(go(), settings)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    table(["state", "jobs"], [[s, str(n)] for s, n in out["jobs_by_state"].items()])
    typer.echo("")
    table(
        ["lane", "in redis", "oldest queued"],
        [
            [
                lane,
                str(v["redis_depth"]),
                "" if v["oldest_queued_age_s"] is None else f"{v['oldest_queued_age_s']} s",
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
            [c["agent"], f"${c['cap_usd']}", f"${c['spent_usd']}", f"${c['reserved_usd']}"]
            for c in out["spend_today"]
        ],
    )
    typer.echo(f"\nunsent replies: {out['unsent_replies']}")
