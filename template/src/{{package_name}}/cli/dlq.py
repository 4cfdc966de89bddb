"""Admin commands for parked jobs: `dlq list/causes/show/replay/resolve`
(template-owned: copier-agent-worker)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..money import usd
from ..states import PARKED, JobState
from .app import app
from .support import (
    JsonFlag,
    attempt_dict,
    fail,
    load_settings,
    parse_state,
    progress,
    run,
    short_time,
    table,
    with_conn,
)

if TYPE_CHECKING:
    from .. import actions

# Each command imports the service's modules it uses when it runs (support.py says why).

dlq_app = typer.Typer(help="Parked jobs: group by cause, replay with approval, resolve.")
app.add_typer(dlq_app, name="dlq")
ApprovedBy = Annotated[str | None, typer.Option(help="Who approved this (required).")]


@dlq_app.command("list")
def dlq_list(
    state: Annotated[
        str | None, typer.Option(help="failed, dead_lettered, denied or in_doubt.")
    ] = None,
    cause: Annotated[str | None, typer.Option(help="A cause id from `dlq causes`.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's jobs.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Parked jobs, oldest first."""
    from .. import dlq

    wanted = parse_state(state)
    if wanted is not None and wanted not in PARKED:
        fail(f"{wanted.value} is not a parked state; use one of {', '.join(sorted(PARKED))}")
    settings = load_settings()
    found = run(
        with_conn(settings, lambda c: dlq.parked(c, state=wanted, cause=cause, agent=agent)),
        settings,
    )
    if as_json:
        typer.echo(json.dumps([job.as_dict() for job in found], indent=2))
        return
    table(
        ["id", "agent", "state", "cause id", "paid", "cause"],
        [
            [
                j.id,
                j.agent,
                j.state.value,
                j.cause_id,
                "yes" if j.has_paid_calls else "",
                j.cause[:70],
            ]
            for j in found
        ],
    )


@dlq_app.command("causes")
def dlq_causes(as_json: JsonFlag = False) -> None:
    """Parked jobs grouped by cause (error class + message with ids and numbers masked)."""
    from .. import dlq

    settings = load_settings()
    groups = run(with_conn(settings, dlq.causes), settings)
    if as_json:
        typer.echo(json.dumps([g.as_dict() for g in groups], indent=2))
        return
    table(
        ["cause id", "count", "agents", "states", "first seen", "last seen", "cause"],
        [
            [
                g.cause_id,
                str(g.count),
                ",".join(sorted(g.agents)),
                ",".join(sorted(g.states)),
                short_time(g.first_seen) if g.first_seen else "",
                short_time(g.last_seen) if g.last_seen else "",
                g.cause[:60],
            ]
            for g in groups
        ],
    )


@dlq_app.command("show")
def dlq_show(job_id: str, as_json: JsonFlag = False) -> None:
    """One parked job: input, every attempt with its traceback, paid calls, audit rows."""
    from .. import audit, paid_calls, queries

    settings = load_settings()

    async def go(conn: Any) -> tuple[Any, ...]:
        return (
            await queries.get_job(conn, job_id),
            await queries.job_attempts(conn, job_id),
            await paid_calls.calls_of(conn, job_id),
            await audit.entries(conn, target=job_id),
        )

    job, attempts, calls, entries = run(with_conn(settings, go), settings)
    if job is None:
        fail(f"no job with id {job_id}")
    if as_json:
        out = job.as_dict()
        out["attempt_log"] = [attempt_dict(a) for a in attempts]
        out["paid_calls"] = [attempt_dict(c) for c in calls]
        out["audit"] = [attempt_dict(e) for e in entries]
        typer.echo(json.dumps(out, indent=2, default=str))
        return
    typer.echo(f"job {job.id}  agent {job.agent}  state {job.state.value}")
    typer.echo(f"attempts {job.attempts}/{job.max_attempts}  last error {job.last_error or ''}")
    typer.echo(f"input: {json.dumps(job.payload)}")
    for a in attempts:
        outcome = a.outcome or "(running)"
        typer.echo(f"\nattempt {a.number} on {a.worker} at {short_time(a.started_at)}: {outcome}")
        if a.error_class:
            typer.echo(f"  {a.error_class}: {a.error_message}")
        if a.traceback:
            typer.echo("  " + a.traceback.rstrip().replace("\n", "\n  "))
    for c in calls:
        cost = "" if c.cost_usd is None else f", cost {usd(c.cost_usd)}"
        call = f"paid call {c.name} (attempt {c.attempt})"
        typer.echo(f"\n{call}: {c.state}, max {usd(c.max_cost_usd)}{cost}")
    for e in entries:
        typer.echo(f"\naudit {short_time(e.at)} {e.actor} {e.action} {json.dumps(e.details)}")


@dlq_app.command("replay")
def dlq_replay(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Jobs to replay, by id.")] = None,
    cause: Annotated[str | None, typer.Option(help="Replay jobs of this cause id.")] = None,
    limit: Annotated[
        int | None, typer.Option(help="At most this many (required with --cause).")
    ] = None,
    approved_by: ApprovedBy = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the audit log.")] = None,
    allow_spent: Annotated[
        bool, typer.Option(help="Also replay named jobs that made paid calls.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Show what would be replayed; change nothing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Put parked jobs back to queued with a fresh attempt budget (approved, audited)."""
    from .. import actions, dlq
    from ..db import create_engine

    if not approved_by:
        fail("a replay needs --approved-by NAME (who approved running these jobs again)")
    if cause is not None and limit is None:
        fail("--cause needs --limit N (how many jobs to replay at most)")
    settings = load_settings()

    async def go() -> actions.ReplayOutcome:
        engine = create_engine(settings)
        try:
            return await actions.replay(
                settings,
                engine,
                job_ids=job_ids or [],
                cause=cause,
                limit=limit,
                approved_by=approved_by,
                reason=reason,
                allow_spent=allow_spent,
                dry_run=dry_run,
                progress=lambda total: progress(total, "replaying"),
            )
        finally:
            await engine.dispose()

    try:
        outcome = run(go(), settings)
    except dlq.ReplayRefused as exc:
        fail(str(exc))
    plan, replayed = outcome.plan, outcome.replayed
    if outcome.push_warning:
        typer.echo(f"warning: {outcome.push_warning}", err=True)
    chosen = [job.id for job in plan.replay] if dry_run else replayed
    if as_json:
        skipped = [{"id": job_id, "reason": why} for job_id, why in plan.skipped]
        typer.echo(json.dumps({"dry_run": dry_run, "replayed": chosen, "skipped": skipped}))
    else:
        verb = "would replay" if dry_run else "replayed"
        typer.echo(f"{verb} {len(chosen)} job(s): {' '.join(chosen)}".rstrip(": "))
        for job_id, why in plan.skipped:
            typer.echo(f"skipped {job_id}: {why}")
    if not chosen and plan.skipped:
        raise typer.Exit(1)


@dlq_app.command("resolve")
def dlq_resolve(
    job_id: Annotated[str | None, typer.Argument(help="The in_doubt job (or use --cause).")] = None,
    outcome: Annotated[str, typer.Option(help="completed, failed, retry or not-charged.")] = "",
    approved_by: ApprovedBy = None,
    note: Annotated[str | None, typer.Option(help="What the provider showed (required).")] = None,
    cause: Annotated[
        str | None, typer.Option(help="Resolve in_doubt jobs of this cause id instead.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="With --cause: at most this many.")] = None,
) -> None:
    """Settle in_doubt jobs after checking with the provider: one by id, or a cause's.

    not-charged: the provider did not bill, so the cost counted for the job's in-doubt calls
    is given back and the job is queued again (as retry, which keeps that cost spent).
    """
    from .. import actions, dlq
    from ..db import create_engine

    try:
        dlq.check_resolution(outcome, approved_by or "", note or "")
    except dlq.ReplayRefused as exc:
        fail(str(exc))
    if (job_id is None) == (cause is None):
        fail("name one in_doubt job, or a cause with --cause ID --limit N (not both)")
    if cause is not None and (limit is None or limit < 1):
        fail("--cause needs --limit N (at least 1): how many of its jobs to resolve")
    settings = load_settings()

    async def go() -> list[tuple[str, JobState]]:
        engine = create_engine(settings)
        try:
            if cause is not None:
                return await actions.resolve_cause(
                    settings,
                    engine,
                    cause,
                    limit=limit or 0,
                    outcome=outcome,
                    approved_by=approved_by or "",
                    note=note or "",
                )
            state = await actions.resolve(
                settings,
                engine,
                job_id or "",
                outcome=outcome,
                approved_by=approved_by or "",
                note=note or "",
            )
            return [(job_id or "", state)]
        finally:
            await engine.dispose()

    try:
        resolved = run(go(), settings)
    except dlq.ReplayRefused as exc:
        fail(str(exc))
    if cause is not None and not resolved:
        fail(f"no in_doubt job has cause {cause}; see `dlq causes`")
    for resolved_id, state in resolved:
        typer.echo(f"job {resolved_id} is now {state.value}")
