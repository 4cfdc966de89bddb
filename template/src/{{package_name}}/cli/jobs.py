"""`submit`, `jobs show/list/watch/cancel` and `prune` (template-owned: copier-agent-worker)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..money import usd
from ..states import PARKED, TERMINAL
from .app import app
from .support import (
    JsonFlag,
    attempt_dict,
    fail,
    load_settings,
    parse_state,
    run,
    short_time,
    table,
)

if TYPE_CHECKING:
    from .. import actions, approvals, budgets, cancels, paid_calls, queries, reruns, steps

# Each command imports the service's modules it uses when it runs (support.py says why).

jobs_app = typer.Typer(help="Look at jobs.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@app.command()
def submit(
    agent: Annotated[str, typer.Argument(help="Agent name.")],
    input_json: Annotated[
        str | None, typer.Option("--input", help="Payload, a JSON object.")
    ] = None,
    input_file: Annotated[
        Path | None,
        typer.Option("--input-file", help="File holding the JSON payload (- reads stdin)."),
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Same key + owner = same job.")
    ] = None,
    owner: Annotated[str | None, typer.Option(help="Who the job is for.")] = None,
    delay: Annotated[
        str | None,
        typer.Option("--delay", help="Run no sooner than SECONDS from now (at most 365 days)."),
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", help="Run no sooner than this ISO-8601 UTC time.")
    ] = None,
    priority: Annotated[str, typer.Option("--priority", help="high, normal or low.")] = "normal",
    budget_usd: Annotated[
        str | None,
        typer.Option(
            "--budget-usd",
            help="What the job and its children may spend in all (default: the agent's).",
        ),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            "--deadline-s",
            help="SECONDS from now by which it must have finished, over all its attempts and "
            "waits, or it fails (default: the agent's deadline_s).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Record a job and queue it; prints the job id."""
    from .. import queries
    from ..budgets import BudgetRefused, parse_budget
    from ..deadlines import DeadlineRefused, parse_deadline
    from ..submit import SubmitError, Submitter, due_at, parse_delay, priority_rank

    payload = _read_payload(input_json, input_file)
    run_at = _read_time("--at", at)
    try:
        delay_s = None if delay is None else parse_delay(delay, field="--delay")
        due_at(datetime.now(UTC), delay_s=delay_s, run_at=run_at)
        priority_rank(priority)
        parse_budget(budget_usd, field="--budget-usd")
        deadline_s = None if deadline is None else parse_deadline(deadline, field="--deadline-s")
    except SubmitError as exc:
        fail(str(exc).replace("run_at", "--at").replace("a delay", "--delay"))
    except (BudgetRefused, DeadlineRefused) as exc:
        fail(str(exc))
    settings = load_settings()

    async def go() -> dict[str, Any] | str:
        submitter = Submitter(settings)
        try:
            job_id = await submitter.submit(
                agent,
                payload,
                owner=owner,
                idempotency_key=idempotency_key,
                delay_s=delay_s,
                run_at=run_at,
                priority=priority,
                budget_usd=budget_usd,
                deadline_s=deadline_s,
            )
            if not as_json:
                return job_id
            async with submitter.engine.connect() as conn:
                job = await queries.get_job(conn, job_id)
            assert job is not None
            return job.as_dict()
        finally:
            await submitter.close()

    out = run(go(), settings)
    typer.echo(json.dumps(out, indent=2) if as_json else out)


def _read_time(option: str, value: str | None) -> datetime | None:
    """An ISO-8601 time given on the command line; one without a zone is refused."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} {value!r} is not an ISO-8601 time; write e.g. 2026-12-24T18:00:00Z")
    if moment.tzinfo is None:
        fail(f"{option} {value!r} has no time zone; write it in UTC, e.g. {value}Z")
    return moment


def _read_payload(input_json: str | None, input_file: Path | None) -> Any:
    if (input_json is None) == (input_file is None):
        fail("give the payload with exactly one of --input '{...}' or --input-file FILE")
    if input_file is not None:
        input_json = _read_input_file(input_file)
    assert input_json is not None
    try:
        return json.loads(input_json)
    except json.JSONDecodeError as exc:
        fail(
            f"the payload is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            """write a JSON object such as '{"text": "hello"}'"""
        )


def _read_input_file(path: Path) -> str:
    """The payload file's text (`-`: standard input), UTF-8 with or without the byte-order
    mark some Windows editors write."""
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        fail(f"cannot read --input-file {path}: {exc.strerror}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        fail(
            f"--input-file {path} is not UTF-8 text (byte {exc.start} is "
            f"0x{data[exc.start]:02x}; a UTF-16 file?): save it as UTF-8"
        )


@dataclass
class JobView:
    """Everything `jobs show` prints about one job."""

    job: queries.Job
    attempts: list[queries.Attempt]
    calls: list[paid_calls.PaidCall]
    done_steps: list[steps.Step]
    asked: list[approvals.Approval]
    children: list[queries.Job]
    deliveries: list[queries.Delivery]
    cost: dict[str, Any]
    version_change: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        out = self.job.as_dict()
        out["attempt_log"] = [attempt_dict(a) for a in self.attempts]
        out["paid_calls"] = [attempt_dict(c) for c in self.calls]
        out["steps"] = [
            {"name": s.name, "attempt": s.attempt, "result": s.result, "at": s.created_at}
            for s in self.done_steps
        ]
        out["approvals"] = [a.as_dict() for a in self.asked]
        out["children"] = [
            {"key": k.child_key, "id": k.id, "agent": k.agent, "state": k.state.value}
            for k in self.children
        ]
        out["webhook_deliveries"] = [attempt_dict(d) for d in self.deliveries]
        out["cost"] = self.cost
        out["version_change"] = self.version_change
        return out


@jobs_app.command("show")
def jobs_show(job_id: str, as_json: JsonFlag = False) -> None:
    """One job with every attempt."""
    from .. import approvals, budgets, paid_calls, queries, steps, versions
    from ..db import create_engine

    settings = load_settings()

    async def go() -> JobView | None:
        engine = create_engine(settings)
        try:
            async with engine.connect() as conn:
                job = await queries.get_job(conn, job_id)
                if job is None:
                    return None
                return JobView(
                    job,
                    await queries.job_attempts(conn, job_id),
                    await paid_calls.calls_of(conn, job_id),
                    await steps.steps_of(conn, job_id),
                    await approvals.of_job(conn, job_id),
                    await queries.children_of(conn, job_id),
                    await queries.job_deliveries(conn, job_id),
                    await budgets.cost_of(conn, job_id, job.budget_id),
                    await versions.last_report(conn, job_id),
                )
        finally:
            await engine.dispose()

    view = run(go(), settings)
    if view is None:
        fail(f"no job with id {job_id}")
    if as_json:
        typer.echo(json.dumps(view.as_dict(), indent=2, default=str))
        return
    job, changed = view.job, view.version_change
    for key, value in job.as_dict().items():
        if key not in {"payload", "result"}:
            typer.echo(f"{key:>17}  {'' if value is None else value}")
    typer.echo(f"{'payload':>17}  {json.dumps(job.payload)}")
    typer.echo(f"{'result':>17}  {json.dumps(job.result) if job.result is not None else ''}")
    for line in cost_lines(view.cost) + ([] if changed is None else versions.report_lines(changed)):
        typer.echo(line)
    typer.echo("")
    table(
        ["#", "started", "outcome", "error"],
        [
            [
                str(a.number),
                short_time(a.started_at),
                a.outcome or "(running)",
                f"{a.error_class}: {a.error_message}" if a.error_class else "",
            ]
            for a in view.attempts
        ],
    )
    if view.calls:
        typer.echo("")
        table(
            ["paid call", "attempt", "state", "max cost", "cost"],
            [
                [
                    c.name,
                    str(c.attempt),
                    c.state,
                    usd(c.max_cost_usd),
                    "" if c.cost_usd is None else usd(c.cost_usd),
                ]
                for c in view.calls
            ],
        )
    _show_durable(view.done_steps, view.asked, view.children)
    _show_deliveries(view.deliveries)


def cost_lines(cost: dict[str, Any]) -> list[str]:
    """`jobs show`'s money: the job's own spend, the budget that covers it, its tree's.

    >>> cost_lines({"spent_usd": "0.1", "reserved_usd": "0", "budget": None, "tree": None})
    ['             cost  $0.10 spent, $0.00 reserved']
    """
    lines = [f"{'cost':>17}  {usd(cost['spent_usd'])} spent, {usd(cost['reserved_usd'])} reserved"]
    budget = cost["budget"]
    if budget is not None:
        lines.append(
            f"{'budget':>17}  {usd(budget['budget_usd'])} (job {budget['job_id']}): "
            f"{usd(budget['spent_usd'])} spent, {usd(budget['reserved_usd'])} reserved, "
            f"{usd(budget['remaining_usd'])} left"
        )
    tree = cost["tree"]
    if tree is not None:
        shares = ", ".join(f"{share['job_id']} {usd(share['spent_usd'])}" for share in tree["jobs"])
        lines.append(
            f"{'tree':>17}  {usd(tree['spent_usd'])} spent, {usd(tree['reserved_usd'])} reserved "
            f"over {len(tree['jobs'])} jobs ({shares})"
        )
    return lines


def _show_durable(
    done_steps: list[steps.Step], asked: list[approvals.Approval], kids: list[queries.Job]
) -> None:
    """The steps, approvals and children of `jobs show`."""
    if done_steps:
        typer.echo("")
        table(
            ["step", "attempt", "done", "result"],
            [
                [s.name, str(s.attempt), short_time(s.created_at), json.dumps(s.result)[:60]]
                for s in done_steps
            ],
        )
    if asked:
        typer.echo("")
        table(
            ["approval", "state", "requested", "decided by", "reason"],
            [
                [a.name, a.state, short_time(a.requested_at), a.decided_by or "", a.reason or ""]
                for a in asked
            ],
        )
    if kids:
        typer.echo("")
        table(
            ["child key", "id", "agent", "state", "last error"],
            [
                [k.child_key or "", k.id, k.agent, k.state.value, (k.last_error or "")[:60]]
                for k in kids
            ],
        )


def _show_deliveries(deliveries: list[queries.Delivery]) -> None:
    """`jobs show`'s webhook notifications: each endpoint told, how far, and why not yet."""
    if not deliveries:
        return
    typer.echo("")
    table(
        ["webhook", "state", "tries", "sent", "last error"],
        [
            [
                d.endpoint,
                d.state,
                str(d.attempts),
                short_time(d.sent_at) if d.sent_at is not None else "",
                (d.last_error or "")[:60],
            ]
            for d in deliveries
        ],
    )


@jobs_app.command("list")
def jobs_list(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's jobs.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Newest jobs first."""
    from .. import budgets, queries
    from ..db import create_engine

    wanted = parse_state(state)
    settings = load_settings()

    async def go() -> tuple[list[queries.Job], dict[str, budgets.Cost]]:
        engine = create_engine(settings)
        try:
            async with engine.connect() as conn:
                found = await queries.list_jobs(conn, state=wanted, agent=agent, limit=limit)
                return found, await budgets.costs(conn, [job.id for job in found])
        finally:
            await engine.dispose()

    jobs, costs = run(go(), settings)
    if as_json:
        typer.echo(
            json.dumps(
                [{**job.as_dict(), "cost": costs[job.id].as_dict()} for job in jobs], indent=2
            )
        )
        return
    now = datetime.now(UTC)
    table(
        ["id", "agent", "state", "attempts", "cost", "created", "last error / waiting for"],
        [
            [
                j.id,
                j.agent,
                j.state.value,
                f"{j.attempts}/{j.max_attempts}",
                _cost_cell(costs[j.id]),
                short_time(j.created_at),
                _why_waiting(j, now)[:60],
            ]
            for j in jobs
        ],
    )


def _cost_cell(cost: budgets.Cost) -> str:
    """A job's spend for `jobs list`, with what it holds reserved when it holds any."""
    held = f" (+{usd(cost.reserved_usd)} reserved)" if cost.reserved_usd else ""
    return f"{usd(cost.spent_usd)}{held}"


def _why_waiting(job: queries.Job, now: datetime) -> str:
    """What a listed job waits for: its run_after while in the future (a delay, a backoff,
    a deferral: scheduled, not stuck), an approval or children, else its last error."""
    due = job.scheduled_for(now)
    if due is not None:
        return f"scheduled for {short_time(due)}" + (
            f"; {job.last_error}" if job.last_error else ""
        )
    if job.waiting_for:
        return f"waiting for {job.waiting_for}"
    return job.last_error or ""


@jobs_app.command("watch")
def jobs_watch(
    job_id: str,
    after: Annotated[int, typer.Option(min=0, help="Start after this event seq.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON lines (the default when not on a terminal).")
    ] = False,
) -> None:
    """Follow a job's events as they are written, until it finishes or parks (Ctrl-C stops
    watching, never the job)."""
    from .. import events, queries
    from ..db import create_engine

    settings = load_settings()
    lines = as_json or not sys.stdout.isatty()

    async def go() -> str:
        engine = create_engine(settings)
        try:
            width = shutil.get_terminal_size().columns
            async for event in events.follow(engine, job_id, after):
                typer.echo(json.dumps(event.as_dict()) if lines else event.line(width))
            async with engine.connect() as conn:
                job = await queries.get_job(conn, job_id)
            return "gone" if job is None else job.state.value
        finally:
            await engine.dispose()

    try:
        state = run(go(), settings)
    except events.NoSuchJob as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if not lines:
        typer.echo(f"job {job_id} is {state}", err=True)


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: str,
    by: Annotated[str, typer.Option(help="Who cancels it, for the audit log.")] = "operator",
    with_children: Annotated[
        bool,
        typer.Option("--children", help="Also cancel every unsettled job below it, running too."),
    ] = False,
) -> None:
    """Stop a job: queued, waiting or parked at once; running, by its worker within a
    second (cancelled, or in_doubt when a paid call was in flight)."""
    from .. import actions
    from ..db import create_engine

    settings = load_settings()

    async def go() -> cancels.Reach:
        engine = create_engine(settings)
        try:
            return await actions.cancel(
                settings, engine, job_id, actor=by, with_children=with_children
            )
        finally:
            await engine.dispose()

    reach = run(go(), settings)
    if not reach:
        fail(f"job {job_id} was not cancelled: it has finished or is unknown", code=1)
    if reach.cancelled[:1] == [job_id]:
        typer.echo(f"job {job_id} is now cancelled")
    else:
        typer.echo(f"job {job_id} is running: its worker stops it within a second")
    below = [i for i in reach.cancelled if i != job_id], [i for i in reach.stopping if i != job_id]
    if any(below):
        typer.echo(f"below it: {len(below[0])} cancelled, {len(below[1])} running and stopping")


@jobs_app.command("rerun")
def jobs_rerun(
    job_id: str,
    from_step: Annotated[
        str, typer.Option("--from-step", help="The recorded step to run again from.")
    ],
    input_json: Annotated[
        str | None,
        typer.Option("--input", help="A new payload (a JSON object); default: the job's own."),
    ] = None,
    approved_by: Annotated[
        str, typer.Option(help="Who approved it; needed when the rerun makes paid calls.")
    ] = "",
    reason: Annotated[str, typer.Option(help="Why, for the audit log.")] = "",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what it reuses and would pay for; do nothing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run a finished job again from one of its steps as a new job: the steps before it are
    reused from the record (not run, not paid again); the paid calls it makes again are
    priced first, and a rerun that reserves money needs --approved-by and --reason."""
    from .. import actions, reruns
    from ..db import create_engine

    settings = load_settings()
    payload = None if input_json is None else _read_payload(input_json, None)

    async def go() -> actions.RerunOutcome:
        engine = create_engine(settings)
        try:
            return await actions.rerun(
                settings,
                engine,
                job_id,
                from_step=from_step,
                payload=payload,
                approved_by=approved_by,
                reason=reason,
                dry_run=dry_run,
            )
        finally:
            await engine.dispose()

    try:
        outcome = run(go(), settings)
    except reruns.RerunRefused as exc:
        fail(str(exc))
    plan = outcome.plan
    if as_json:
        typer.echo(json.dumps({**plan.as_dict(), "new_job_id": outcome.job_id}, indent=2))
    else:
        _print_rerun_plan(plan)
        if outcome.job_id is not None:
            typer.echo(f"queued {outcome.job_id}, a rerun of {job_id} from step {from_step}")
    if outcome.push_warning:
        typer.echo(outcome.push_warning, err=True)


def _print_rerun_plan(plan: reruns.RerunPlan) -> None:
    job = plan.job
    typer.echo(f"rerun of {job.id} ({job.agent}, {job.state.value}) from step {plan.from_step}")
    typer.echo(f"reuses steps: {', '.join(plan.reused_steps) or 'none'}")
    if plan.reused_calls:
        typer.echo(f"reuses paid calls: {', '.join(plan.reused_calls)} (not paid again)")
    typer.echo(f"runs again: {', '.join(plan.steps_again)} and what follows them")
    if plan.calls_again:
        typer.echo("paid calls it makes again (by the job's record):")
        table(
            ["paid call", "reserves", "cost last time"],
            [
                [
                    c.name,
                    usd(c.reserved_usd),
                    "unknown" if c.cost_usd is None else usd(c.cost_usd),
                ]
                for c in plan.calls_again
            ],
        )
    typer.echo(f"reserves up to {usd(plan.reserved_usd)} before those calls")
    if plan.children_again:
        typer.echo(f"its {plan.children_again} child job(s) are spawned again when it reaches them")
    if plan.needs_approval:
        typer.echo("needs --approved-by NAME and --reason TEXT")


@app.command()
def prune(
    older_than: Annotated[
        int, typer.Option(help="Delete jobs finished more than DAYS ago.", min=1)
    ],
    include_parked: Annotated[bool, typer.Option(help="Also delete old parked jobs.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete old finished jobs (with their attempts, paid calls and replies)."""
    from .. import job_store
    from ..db import create_engine

    settings = load_settings()
    cutoff = datetime.now(UTC) - timedelta(days=older_than)
    states = TERMINAL | (PARKED if include_parked else frozenset())

    async def go() -> int:
        engine = create_engine(settings)
        try:
            return await job_store.prune(engine, finished_before=cutoff, states=states)
        finally:
            await engine.dispose()

    deleted = run(go(), settings)
    if as_json:
        typer.echo(json.dumps({"deleted": deleted, "finished_before": cutoff.isoformat()}))
    else:
        typer.echo(f"deleted {deleted} job(s) finished before {short_time(cutoff)}")
