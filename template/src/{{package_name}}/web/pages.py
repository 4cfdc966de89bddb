"""The console: server-rendered pages (Jinja2, autoescape) over the same functions as the
CLI and the API (template-owned: copier-agent-worker).

Every page needs a session (else it goes to /login); every state-changing request is a POST
with the session's `csrf_token`, refused cross-site, and checked for the role on the server.
Job data (payloads, errors, results) only ever reaches a template as text: autoescape is on
and nothing is marked safe.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from .. import (
    actions,
    audit,
    budgets,
    cancels,
    catalog,
    dlq,
    events,
    paid_calls,
    queries,
    reruns,
    spend,
)
from ..models import GLOBAL
from ..money import usd
from ..observe import stats
from ..queue import JobQueue, QueueUnavailable
from ..states import PARKED, TERMINAL, JobState
from ..tokens import Principal, Role, authenticate
from . import job_facts
from .auth import SESSION_COOKIE, Denied, Session, Sessions, check_csrf, session_principal
from .inputs import InputError, parse_cap, refuse_nul
from .services import Services

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


def as_json(value: Any, indent: int | None = None) -> str:
    """Job data as JSON text; autoescape then makes it safe (unlike Jinja's `tojson`, which
    escapes `<` as `\\u003c` and would show that to the reader).

    >>> as_json({"error": "<b>"})
    '{"error": "<b>"}'
    """
    return json.dumps(value, indent=indent, sort_keys=True, default=str, ensure_ascii=False)


def when(value: datetime | None) -> str:
    """A UTC time to the second, or nothing.

    >>> when(datetime(2026, 1, 31, 9, 5, 7, 123, tzinfo=UTC))
    '2026-01-31 09:05:07Z'
    """
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


TEMPLATES.filters.update(
    usd=usd, as_json=as_json, when=when, cap_label=spend.cap_label, duration=job_facts.duration
)
PAGE_SIZE = 50
TIMELINE_ROWS = 200  # the job page's latest events; `jobs watch JOB --after N` has the rest
CHART_BUCKETS = 12  # five-minute bars over the last hour
CHART_BUCKET = timedelta(minutes=5)

View = Callable[[Request, Services, Principal, Session], Awaitable[Response]]


def page(role: Role) -> Callable[[View], Callable[[Request], Awaitable[Response]]]:
    """Require a console session with `role`; a POST also needs its csrf_token."""

    def wrap(view: View) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            services = request.app.state.services
            found = await session_principal(request, services.engine, services.sessions)
            if found is None:
                if request.method != "GET":
                    raise Denied(401, "your session has ended; log in again")
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            principal, session = found
            refuse_nul(request.query_params.multi_items(), "query parameter")
            if request.method == "POST":
                form = await request.form()
                check_csrf(request, session, form)
                refuse_nul(form.multi_items(), "field")
            if not principal.may(role):
                raise Denied(
                    403, f"this needs the {role.label} role; you are a {principal.role.label}"
                )
            return await view(request, services, principal, session)

        return run

    return wrap


def render(
    request: Request,
    name: str,
    status_code: int = 200,
    *,
    principal: Principal | None = None,
    session: Session | None = None,
    **context: Any,
) -> HTMLResponse:
    html = TEMPLATES.get_template(name).render(
        principal=principal,
        csrf_token=session.csrf if session else "",
        operator=principal is not None and principal.may(Role.OPERATOR),
        admin=principal is not None and principal.may(Role.ADMIN),
        path=request.url.path,
        service=catalog.PROJECT_NAME,
        refused=request.query_params.get("refused") == "yes",
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


# What each refusal is called at the top of its page.
ERROR_TITLES = {
    400: "That request was not valid",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed here",
    409: "Not in a state that allows it",
    500: "Something went wrong on the server",
    503: "A service it needs is not answering",
}


async def error_page(request: Request, status: int, message: str) -> Response:
    """A refusal in the console's layout, with its nav when the session is still good, so
    the reader can go on from where they are."""
    if status == 401 and request.method == "GET":
        return RedirectResponse("/login", status_code=303)
    services = request.app.state.services
    try:
        found = await session_principal(request, services.engine, services.sessions)
    except Exception:  # noqa: BLE001 - the page of a failing database must still show
        found = None
    principal, session = found if found is not None else (None, None)
    if message == HTTPStatus(status).phrase:  # Starlette's bare "Not Found" and friends
        message = {
            404: f"there is no page at {request.url.path}; the links above lead to every page",
            405: f"{request.url.path} does not take a {request.method} request",
        }.get(status, message)
    return render(
        request,
        "error.html",
        status,
        principal=principal,
        session=session,
        status=status,
        title=ERROR_TITLES.get(status, "Refused"),
        refusal=message,
    )


# Login -------------------------------------------------------------------------------------


async def login_form(request: Request) -> Response:
    return render(request, "login.html", next=_safe_next(request.query_params.get("next")))


async def login(request: Request) -> Response:
    """Trade a token for a signed session cookie (HttpOnly, SameSite=Strict, Secure on HTTPS)."""
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if (site is not None and site not in {"same-origin", "none"}) or (
        origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}"
    ):
        raise Denied(403, "cross-site requests are refused")
    form = await request.form()
    token, target = form.get("token"), _safe_next(str(form.get("next") or "/"))
    services = request.app.state.services
    principal = None
    if isinstance(token, str) and token.strip():
        async with services.engine.connect() as conn:
            principal = await authenticate(conn, token.strip())
    if principal is None:
        return render(
            request, "login.html", 401, next=target, error="the token is wrong, unknown or revoked"
        )
    sessions: Sessions = services.sessions
    _, value = sessions.new(principal, str(token).strip())
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(value=value, **sessions.cookie_options(request))
    return response


@page(Role.VIEWER)
async def logout(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _safe_next(target: str | None) -> str:
    """Only a local path: never an open redirect to another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# Overview ----------------------------------------------------------------------------------


@page(Role.VIEWER)
async def overview(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    context = await _overview(services)
    return render(request, "overview.html", principal=principal, session=session, **context)


@page(Role.VIEWER)
async def overview_counts(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """The live part of the overview, polled by htmx."""
    context = await _overview(services)
    return render(request, "_counts.html", principal=principal, session=session, **context)


async def _overview(services: Services) -> dict[str, Any]:
    """The overview's numbers, read through the same functions as `stats` and `/metrics`."""
    now = datetime.now(UTC)
    # Bars start on whole five minutes, so their labels read 09:05, 09:10, ...
    start = _floor(now, CHART_BUCKET) - CHART_BUCKET * (CHART_BUCKETS - 1)
    async with services.engine.connect() as conn:
        found = await stats.read_service_stats(conn, causes=False)
        buckets = await queries.finished_per_bucket(
            conn, start=start, width=CHART_BUCKET, buckets=CHART_BUCKETS
        )
    depths: dict[str, int | None] = dict.fromkeys(catalog.LANES)
    redis_error = None
    try:
        queue = await JobQueue.connect(services.settings, conn_retries=0)
        try:
            depths = {**depths, **await stats.lane_depths(queue, catalog.LANES)}
        finally:
            await queue.close()
    except QueueUnavailable as exc:
        redis_error = str(exc)
    return {
        "counts": list(found.jobs_by_state.items()),
        "estimated": found.estimated_states,
        "lanes": [
            (lane, depths[lane], _whole(found.oldest_queued_age_s(lane))) for lane in catalog.LANES
        ],
        "redis_error": redis_error,
        "caps": found.caps,
        "chart": _chart(buckets, start),
        "now": now,
    }


def _floor(moment: datetime, width: timedelta) -> datetime:
    """The start of the `width`-long slot of the UTC day that holds `moment`.

    >>> _floor(datetime(2026, 1, 31, 9, 7, 42, tzinfo=UTC), timedelta(minutes=5))
    datetime.datetime(2026, 1, 31, 9, 5, tzinfo=datetime.timezone.utc)
    """
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return day + width * ((moment - day) // width)


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds)


def _chart(buckets: list[tuple[int, int, int]], start: datetime) -> dict[str, Any]:
    """Bar geometry for an inline SVG (no script, no inline style: the CSP allows neither),
    with each bar's start time (UTC) under it."""
    top = max([1, *(sum(bucket) for bucket in buckets)])
    bars = []
    for i, (done, failed, doubt) in enumerate(buckets):
        h_done, h_failed, h_doubt = (round(100 * n / top) for n in (done, failed, doubt))
        bars.append(
            {
                "x": i * 25,
                "done": done,
                "failed": failed,
                "in_doubt": doubt,
                "h_done": h_done,
                "h_failed": h_failed,
                "h_doubt": h_doubt,
                "label": (start + CHART_BUCKET * i).strftime("%H:%M"),
            }
        )
    return {"bars": bars, "top": top, "width": CHART_BUCKETS * 25}


# Jobs --------------------------------------------------------------------------------------


@page(Role.VIEWER)
async def jobs_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    query = request.query_params
    filters = {k: query.get(k, "") for k in ("state", "agent", "owner", "since")}
    errors = []
    state = None
    if filters["state"]:
        try:
            state = JobState(filters["state"])
        except ValueError:
            errors.append(f"unknown state {filters['state']!r}")
    since = None
    if filters["since"]:
        try:
            since = datetime.fromisoformat(filters["since"]).replace(tzinfo=UTC)
        except ValueError:
            errors.append(
                f"'since' must be a time like 2026-01-31T09:00 (got {filters['since']!r})"
            )
    found: list[queries.Job] = []
    costs: dict[str, budgets.Cost] = {}
    if not errors:
        async with services.engine.connect() as conn:
            found = await queries.list_jobs(
                conn,
                state=state,
                agent=filters["agent"] or None,
                owner=filters["owner"] or None,
                since=since,
                before=query.get("before") or None,
                limit=PAGE_SIZE,
            )
            costs = await budgets.costs(conn, [job.id for job in found])
    more = None
    if len(found) == PAGE_SIZE:
        more = "/jobs?" + urlencode(
            {**{k: v for k, v in filters.items() if v}, "before": found[-1].id}
        )
    return render(
        request,
        "jobs.html",
        principal=principal,
        session=session,
        jobs=found,
        costs=costs,
        filters=filters,
        states=[s.value for s in JobState],
        agents=sorted(catalog.AGENTS),
        parked=[state.value for state in PARKED],  # whose last error is why they are there
        errors=errors,
        more=more,
    )


@page(Role.VIEWER)
async def job_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    job_id = request.path_params["job_id"]
    async with services.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
        if job is None:
            raise Denied(404, f"no job with id {job_id}")
        attempts = await queries.job_attempts(conn, job_id)
        calls = await paid_calls.calls_of(conn, job_id)
        entries = await audit.entries(conn, target=job_id)
        cost = await budgets.cost_of(conn, job_id, job.budget_id)
        # The timeline starts from the latest events; timeline.js follows on from there.
        start = max(job.event_seq - TIMELINE_ROWS, 0)
        timeline = await events.read_after(conn, job_id, start, limit=TIMELINE_ROWS)
        trimmed = await events.trimmed(conn, job_id)
        children = await queries.children_of(conn, job_id)
        deliveries = await queries.job_deliveries(conn, job_id)
        # What a rerun from each recorded step reuses and would pay for, shown before its
        # button (an operator's; the steps are few).
        plans = (
            await reruns.plans(conn, job_id)
            if principal.may(Role.OPERATOR) and job.state in reruns.RERUNNABLE
            else []
        )
    return render(
        request,
        "job.html",
        children=children,
        timeline=timeline,
        trimmed=trimmed,
        timeline_after=timeline[-1].seq if timeline else start,
        live=job.state not in TERMINAL | PARKED,
        principal=principal,
        session=session,
        job=job,
        attempts=attempts,
        calls=calls,
        cost=cost,
        deliveries=deliveries,
        entries=entries,
        facts=job_facts.facts(job, attempts, entries),
        priority=queries.PRIORITY_NAMES.get(job.priority, str(job.priority)),
        cancellable=job.state not in TERMINAL,
        replayable=job.state in PARKED - {JobState.IN_DOUBT},
        spent=bool(calls),
        in_doubt=job.state is JobState.IN_DOUBT,
        rerun_plans=plans,
        message=request.query_params.get("message"),
    )


@page(Role.OPERATOR)
async def cancel_job(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Cancel this job (with the form's `children`, its tree), as `jobs cancel` does."""
    job_id = request.path_params["job_id"]
    form = await request.form()
    reach = await actions.cancel(
        services.settings,
        services.engine,
        job_id,
        actor=principal.name,
        with_children=form.get("children") == "yes",
    )
    path = f"/jobs/{quote(job_id)}"
    return redirect_back(path, cancel_message(job_id, reach), refused=not reach)


def cancel_message(job_id: str, reach: cancels.Reach) -> str:
    """What a cancel did, in one line."""
    if not reach:
        return "not cancelled: it has finished"
    if reach.cancelled[:1] == [job_id]:
        line = "cancelled"
    else:
        line = (
            "running: its worker stops it within a second (cancelled, or in_doubt when a "
            "paid call was in flight)"
        )
    below = len(reach.ids) - 1
    return line + (f"; {below} jobs below it reached too" if below else "")


@page(Role.OPERATOR)
async def rerun_job(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Rerun this job from the form's `from_step` (with its optional `input` and `reason`), as
    `jobs rerun` does, approved by the signed-in operator; then show the new job."""
    job_id = request.path_params["job_id"]
    form = await request.form()
    back = f"/jobs/{quote(job_id)}"
    text = str(form.get("input") or "").strip()
    try:
        payload = json.loads(text) if text else None
    except ValueError:
        return redirect_back(back, "the input is not valid JSON: write a JSON object", refused=True)
    try:
        outcome = await actions.rerun(
            services.settings,
            services.engine,
            job_id,
            from_step=str(form.get("from_step") or ""),
            payload=payload,
            approved_by=principal.name,
            reason=str(form.get("reason") or "").strip(),
        )
    except reruns.RerunRefused as exc:
        return redirect_back(back, f"not rerun: {exc}", refused=True)
    assert outcome.job_id is not None
    done = f"a rerun of {job_id} from step {outcome.plan.from_step}, queued"
    return redirect_back(f"/jobs/{quote(outcome.job_id)}", done)


@page(Role.OPERATOR)
async def replay_job(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Replay this one parked job, as `dlq replay --id` does; one that made a paid call
    needs the form's `allow_spent`, as the CLI needs `--allow-spent`."""
    job_id = request.path_params["job_id"]
    form = await request.form()
    try:
        outcome = await actions.replay(
            services.settings,
            services.engine,
            job_ids=[job_id],
            approved_by=principal.name,
            reason=str(form.get("reason") or "").strip() or None,
            allow_spent=form.get("allow_spent") == "yes",
        )
    except dlq.ReplayRefused as exc:
        return redirect_back(f"/jobs/{quote(job_id)}", str(exc), refused=True)
    if not outcome.replayed:
        why = "; ".join(reason for _, reason in outcome.plan.skipped) or "it moved meanwhile"
        return redirect_back(f"/jobs/{quote(job_id)}", f"not replayed: {why}", refused=True)
    message = "replayed: queued again with fresh attempts"
    if outcome.push_warning:
        message += f"; {outcome.push_warning}"
    return redirect_back(f"/jobs/{quote(job_id)}", message)


@page(Role.OPERATOR)
async def resolve_job(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    job_id = request.path_params["job_id"]
    form = await request.form()
    outcome, note = form.get("outcome"), str(form.get("note") or "").strip()
    if outcome not in dlq.OUTCOMES or not note:
        raise Denied(400, "choose an outcome and write a note saying what the provider showed")
    try:
        state = await actions.resolve(
            services.settings,
            services.engine,
            job_id,
            outcome=str(outcome),
            approved_by=principal.name,
            note=note,
        )
    except dlq.ReplayRefused as exc:
        return redirect_back(f"/jobs/{quote(job_id)}", str(exc), refused=True)
    return redirect_back(f"/jobs/{quote(job_id)}", f"resolved: now {state.value}")


# Dead letters ------------------------------------------------------------------------------


@page(Role.VIEWER)
async def dlq_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    async with services.engine.connect() as conn:
        groups = await dlq.causes(conn)
        in_doubt = await dlq.parked(conn, state=JobState.IN_DOUBT)
    return render(
        request,
        "dlq.html",
        principal=principal,
        session=session,
        groups=groups,
        in_doubt=in_doubt,
        outcomes=dlq.OUTCOMES,
        message=request.query_params.get("message"),
    )


@page(Role.OPERATOR)
async def dlq_resolve(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Settle up to `limit` in_doubt jobs of one cause, approved by the session's token."""
    form = await request.form()
    cause, limit_text = str(form.get("cause_id") or ""), str(form.get("limit") or "")
    outcome, note = str(form.get("outcome") or ""), str(form.get("note") or "").strip()
    if not cause or not limit_text.isdigit() or int(limit_text) < 1:
        return redirect_back(
            "/dlq", "resolving needs a cause and a limit: a whole number, 1 or more", refused=True
        )
    if outcome not in dlq.OUTCOMES or not note:
        return redirect_back(
            "/dlq",
            "choose an outcome and write a note saying what the provider showed",
            refused=True,
        )
    try:
        resolved = await actions.resolve_cause(
            services.settings,
            services.engine,
            cause,
            limit=int(limit_text),
            outcome=outcome,
            approved_by=principal.name,
            note=note,
        )
    except dlq.ReplayRefused as exc:
        return redirect_back("/dlq", str(exc), refused=True)
    return redirect_back("/dlq", f"resolved {len(resolved)} in-doubt job(s) as {outcome}")


@page(Role.OPERATOR)
async def dlq_replay(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    """Replay up to `limit` jobs of one cause, approved by the session's token."""
    form = await request.form()
    cause, limit_text = str(form.get("cause_id") or ""), str(form.get("limit") or "")
    reason = str(form.get("reason") or "").strip() or None
    if not cause or not limit_text.isdigit() or int(limit_text) < 1:
        return redirect_back(
            "/dlq", "a replay needs a cause and a limit: a whole number, 1 or more", refused=True
        )
    try:
        outcome = await actions.replay(
            services.settings,
            services.engine,
            cause=cause,
            limit=int(limit_text),
            approved_by=principal.name,
            reason=reason,
        )
    except dlq.ReplayRefused as exc:
        return redirect_back("/dlq", str(exc), refused=True)
    message = f"replayed {len(outcome.replayed)} job(s)"
    if outcome.plan.skipped:
        message += f"; skipped {len(outcome.plan.skipped)} that made paid calls (replay by id)"
    if outcome.push_warning:
        message += f"; {outcome.push_warning}"
    return redirect_back("/dlq", message)


# Caps and audit ----------------------------------------------------------------------------


@page(Role.VIEWER)
async def caps_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    async with services.engine.connect() as conn:
        caps = await spend.caps_for_day(conn, datetime.now(UTC).date())
    return render(
        request,
        "caps.html",
        principal=principal,
        session=session,
        caps=caps,
        agents=[GLOBAL, *sorted(catalog.AGENTS)],
        message=request.query_params.get("message"),
    )


@page(Role.ADMIN)
async def set_cap(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    form = await request.form()
    try:
        agent, amount = parse_cap({"agent": form.get("agent"), "usd": str(form.get("usd") or "")})
    except InputError as exc:
        return redirect_back("/caps", exc.message, refused=True)
    old, new = await spend.set_cap(
        services.engine,
        agent,
        amount,
        approved_by=principal.name,
        reason=str(form.get("reason") or "").strip() or None,
    )
    return redirect_back("/caps", spend.cap_changed(agent, old, new))


@page(Role.VIEWER)
async def audit_page(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    async with services.engine.connect() as conn:
        entries = await audit.recent(conn, limit=200)
    return render(request, "audit.html", principal=principal, session=session, entries=entries)


def redirect_back(path: str, message: str, *, refused: bool = False) -> Response:
    """Post/redirect/get: the outcome travels as a query parameter, shown as text; a
    refusal (nothing changed) is shown as one, not as a done thing."""
    query = {"message": message, **({"refused": "yes"} if refused else {})}
    return RedirectResponse(f"{path}?{urlencode(query)}", status_code=303)


async def favicon(request: Request) -> Response:
    return Response(status_code=204)


def routes() -> list[BaseRoute]:
    return [
        Route("/favicon.ico", favicon, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview, methods=["GET"]),
        Route("/partials/counts", overview_counts, methods=["GET"]),
        Route("/jobs", jobs_page, methods=["GET"]),
        Route("/jobs/{job_id}", job_page, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/jobs/{job_id}/resolve", resolve_job, methods=["POST"]),
        Route("/jobs/{job_id}/replay", replay_job, methods=["POST"]),
        Route("/jobs/{job_id}/rerun", rerun_job, methods=["POST"]),
        Route("/dlq/resolve", dlq_resolve, methods=["POST"]),
        Route("/dlq", dlq_page, methods=["GET"]),
        Route("/dlq/replay", dlq_replay, methods=["POST"]),
        Route("/caps", caps_page, methods=["GET"]),
        Route("/caps", set_cap, methods=["POST"]),
        Route("/audit", audit_page, methods=["GET"]),
    ]
