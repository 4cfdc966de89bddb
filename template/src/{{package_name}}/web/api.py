"""The JSON API under /api/: bearer tokens only, the same functions as the CLI
(template-owned: copier-agent-worker).

Errors are `{"error": "<one sentence>"}`: 400 bad input (nothing written), 401 no valid
token, 403 a role that may not, 404 no such job, 409 a state conflict, and 500 with an
`error_id` that the log line of the traceback carries (app.py). Numbers and money are read
by the same functions as the CLI's (`submit.parse_delay`, `spend.parse_usd`), bounds and all;
inputs.py holds the readers the console shares. Every body in and out goes through its model
in bodies.py, from which openapi.py builds the document at /api/openapi.json.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NoReturn

from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .. import (
    actions,
    approvals,
    audit,
    budgets,
    catalog,
    dlq,
    events,
    paid_calls,
    queries,
    reruns,
    spend,
)
from ..deadlines import DeadlineRefused, parse_deadline
from ..observe import stats
from ..queue import JobQueue, QueueUnavailable
from ..states import JobState
from ..submit import RecordedNotQueued, SubmitError, parse_delay, priority_rank
from ..tokens import Principal, Role
from . import bodies
from .auth import bearer_principal, require
from .inputs import (
    InputError,
    blank,
    checked,
    optional_str,
    parse_after,
    parse_cap,
    parse_count,
    parse_limit,
    parse_state,
    refuse_nul,
)
from .services import Services

BODY_SLACK = 64 * 1024  # room for the fields around a payload of the largest size
STREAM_PING_S = 15  # a comment line this often keeps proxies from closing a quiet stream
JOB_FIELDS = ("agent", "payload", "owner", "delay_s", "priority", "budget_usd", "deadline_s")
REPLAY_FIELDS = ("cause_id", "job_ids", "limit", "reason", "allow_spent", "dry_run")
MAX_STEP_NAME = 200  # steps.name


Handler = Callable[[Request, Services, Principal], Awaitable[Response]]


def endpoint(role: Role) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """Authenticate the bearer token and check `role` before the handler runs."""

    def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            services = request.app.state.services
            principal = await bearer_principal(request, services.engine)
            require(principal, role)
            refuse_nul(request.query_params.multi_items(), "query parameter")
            refuse_nul(request.path_params.items(), "path parameter")
            return await handler(request, services, principal)

        run.__doc__ = handler.__doc__
        return run

    return wrap


# Jobs ------------------------------------------------------------------------------------


@endpoint(Role.OPERATOR)
async def submit_job(request: Request, services: Services, principal: Principal) -> Response:
    """Record a job and queue it: 201 with its id and state, or 200 with the job an earlier
    request with the same Idempotency-Key (and owner) made."""
    body = await _json_object(request, JOB_FIELDS)
    agent, owner, delay_s, priority, budget_usd = _submission(body)
    deadline_s = body.get("deadline_s")
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= 200:
        raise InputError(400, "the Idempotency-Key header must be 1 to 200 characters")
    warning, created = None, True
    try:
        if delay_s is not None:
            delay_s = parse_delay(delay_s, field='"delay_s"')
        services.submitter.check(agent, body["payload"])
        priority_rank(priority)
        if budget_usd is not None:
            services.submitter.budget(agent, budget_usd)
        if deadline_s is not None:  # 3600.0 is an integer to JSON Schema: read as 3600
            deadline_s = body["deadline_s"] = parse_deadline(deadline_s, field='"deadline_s"')
        checked(bodies.SubmitJob, body)
        job_id, created = await services.submitter.submit_or_get(
            agent,
            body["payload"],
            owner=owner,
            idempotency_key=key,
            delay_s=delay_s,
            priority=priority,
            budget_usd=budget_usd,
            deadline_s=deadline_s,
        )
    except (SubmitError, DeadlineRefused) as exc:
        raise InputError(400, str(exc)) from None
    except RecordedNotQueued as exc:
        job_id, warning = exc.job_id, str(exc)
    async with services.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    assert job is not None
    out: dict[str, Any] = {"id": job.id, "state": job.state.value}
    if warning:
        out["warning"] = warning
    return reply(bodies.Submitted, out, 201 if created else 200)


def _submission(body: dict[str, Any]) -> tuple[str, str | None, Any, str, str | None]:
    """A submit body's fields by JSON type: (agent, owner, delay_s, priority, budget_usd);
    a missing or mistyped one is a 400 that says what to write."""
    agent = body.get("agent")
    if not isinstance(agent, str):
        raise InputError(400, 'give "agent", the name of an agent, as a string')
    if "payload" not in body:
        raise InputError(400, 'give "payload", a JSON object, e.g. {"text": "hello"}')
    owner = optional_str(body, "owner", bodies.MAX_OWNER)
    delay_s = body.get("delay_s")
    if delay_s is not None and (isinstance(delay_s, bool) or not isinstance(delay_s, int | float)):
        raise InputError(400, '"delay_s" must be a number of seconds, e.g. 60')
    priority = body.get("priority", "normal")
    if not isinstance(priority, str):
        raise InputError(400, '"priority" must be "high", "normal" or "low"')
    budget_usd = body.get("budget_usd")
    if budget_usd is not None and not isinstance(budget_usd, str):
        raise InputError(400, '"budget_usd" must be dollars as a string, e.g. "2.00"')
    return agent, owner, delay_s, priority, budget_usd


@endpoint(Role.VIEWER)
async def get_job(request: Request, services: Services, principal: Principal) -> Response:
    """One job with its attempts, paid calls, audit entries, cost and webhook notifications."""
    job_id = request.path_params["job_id"]
    async with services.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
        if job is None:
            raise InputError(404, f"no job with id {job_id}")
        out = job.as_dict()
        out["attempt_log"] = [_plain(a.__dict__) for a in await queries.job_attempts(conn, job_id)]
        out["paid_calls"] = [_plain(c.__dict__) for c in await paid_calls.calls_of(conn, job_id)]
        out["audit"] = [e.as_dict() for e in await audit.entries(conn, target=job_id)]
        out["cost"] = await budgets.cost_of(conn, job_id, job.budget_id)
        found = await queries.job_deliveries(conn, job_id)
        out["webhook_deliveries"] = [_plain(d.__dict__) for d in found]
    return reply(bodies.JobDetail, out)


@endpoint(Role.VIEWER)
async def list_jobs(request: Request, services: Services, principal: Principal) -> Response:
    """Jobs newest first; `before` (a job id) pages on from the last one seen."""
    query = request.query_params
    unknown = set(query) - {"state", "agent", "owner", "limit", "before"}
    if unknown:
        raise InputError(400, f"unknown parameter {sorted(unknown)[0]!r}")
    state = parse_state(query.get("state"))
    limit = parse_limit(query.get("limit"), bodies.MAX_LIST)
    async with services.engine.connect() as conn:
        found = await queries.list_jobs(
            conn,
            state=state,
            agent=query.get("agent") or None,
            owner=query.get("owner"),
            before=query.get("before") or None,
            limit=limit,
        )
    next_before = found[-1].id if len(found) == limit else None
    return reply(
        bodies.JobsPage, {"jobs": [j.as_dict() for j in found], "next_before": next_before}
    )


@endpoint(Role.VIEWER)
async def job_events(request: Request, services: Services, principal: Principal) -> Response:
    """The job's events after `after` (or Last-Event-ID): a JSON page, or Server-Sent Events
    for a client that accepts text/event-stream."""
    job_id = request.path_params["job_id"]
    query = request.query_params
    unknown = set(query) - {"after", "limit"}
    if unknown:
        raise InputError(400, f"unknown parameter {sorted(unknown)[0]!r}")
    after = parse_after(request)
    limit = parse_limit(query.get("limit"), bodies.MAX_LIST)
    async with services.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
        if job is None:
            raise InputError(404, f"no job with id {job_id}")
        if "text/event-stream" in request.headers.get("accept", ""):
            return EventSourceResponse(stream_events(services, job_id, after), ping=STREAM_PING_S)
        page, trimmed = await events.page_after(conn, job_id, after, limit=limit)
    body = {
        "events": [e.as_dict() for e in page],
        "trimmed": None if trimmed is None else trimmed.as_dict(),
        "next_after": page[-1].seq if page else after,
        "state": job.state.value,
    }
    return reply(bodies.EventsPage, body)


async def stream_events(services: Services, job_id: str, after: int) -> Any:
    """Each event as it is written (events.follow), with `id:` its seq."""
    with contextlib.suppress(events.NoSuchJob):  # deleted (pruned) while streaming: the end
        async for event in events.follow(services.engine, job_id, after):
            body = bodies.JobEvent.model_validate(event.as_dict()).model_dump(mode="json")
            yield ServerSentEvent(data=json.dumps(body), event=event.kind, id=str(event.seq))


@endpoint(Role.OPERATOR)
async def cancel_job(request: Request, services: Services, principal: Principal) -> Response:
    """Cancel a job wherever it is (a running one is stopped by its worker), with
    `children` its whole tree; audited with the token's name."""
    job_id = request.path_params["job_id"]
    body = await _json_object(request, ("children",), empty_ok=True)
    if not isinstance(body.get("children", False), bool):
        raise InputError(400, '"children" must be true or false')
    wanted = checked(bodies.Cancel, body)
    reach = await actions.cancel(
        services.settings,
        services.engine,
        job_id,
        actor=principal.name,
        with_children=wanted.children,
    )
    if not reach:
        await _conflict_or_missing(services, job_id, "has finished")
    state = JobState.CANCELLED if reach.cancelled[:1] == [job_id] else JobState.ACTIVE
    reached = {"cancelled": reach.cancelled, "stopping": reach.stopping}
    return reply(bodies.Cancelled, {"id": job_id, "state": state.value, **reached})


@endpoint(Role.OPERATOR)
async def rerun_job(request: Request, services: Services, principal: Principal) -> Response:
    """Plan (`dry_run`) or make a rerun of a finished job from one of its recorded steps;
    the approver is the token's name, and a rerun that makes paid calls needs a reason. A
    well-formed request the job's record refuses (a job not ended, a step it never
    recorded, a rerun that spends without a reason) is a 409; an unknown job a 404."""
    job_id = request.path_params["job_id"]
    body = await _json_object(request, ("from_step", "input", "reason", "dry_run"))
    from_step = body.get("from_step")
    if not isinstance(from_step, str) or not 1 <= len(from_step) <= MAX_STEP_NAME:
        raise InputError(400, '"from_step" must be the name of a step the job recorded')
    if body.get("input") is not None and not isinstance(body["input"], dict):
        raise InputError(400, '"input" must be a JSON object (the rerun\'s payload)')
    if not isinstance(body.get("dry_run", False), bool):
        raise InputError(400, '"dry_run" must be true or false')
    reason = optional_str(body, "reason", bodies.MAX_TEXT) or ""
    wanted = checked(bodies.Rerun, body)
    if wanted.input is not None:
        try:
            reruns.check_payload(wanted.input, services.settings.max_payload_bytes)
        except reruns.RerunRefused as exc:
            raise InputError(400, str(exc)) from None
    try:
        outcome = await actions.rerun(
            services.settings,
            services.engine,
            job_id,
            from_step=from_step,
            payload=wanted.input,
            approved_by=principal.name,
            reason="" if blank(reason) else reason,
            dry_run=wanted.dry_run,
        )
    except reruns.NoSuchJob as exc:
        raise InputError(404, str(exc)) from None
    except reruns.RerunRefused as exc:  # the job's record: its state, the step, no reason
        raise InputError(409, str(exc)) from None
    made = {**outcome.plan.as_dict(), "new_job_id": outcome.job_id}
    return reply(bodies.RerunPlan, made, status=200 if outcome.job_id is None else 201)


@endpoint(Role.OPERATOR)
async def resolve_job(request: Request, services: Services, principal: Principal) -> Response:
    """Settle an in_doubt job: outcome completed, failed or retry, with a note."""
    job_id = request.path_params["job_id"]
    body = await _json_object(request, ("outcome", "note"))
    outcome, note = _resolution(body)
    checked(bodies.Resolve, body)
    try:
        state = await actions.resolve(
            services.settings,
            services.engine,
            job_id,
            outcome=outcome,
            approved_by=principal.name,
            note=note,
        )
    except dlq.ReplayRefused:
        await _conflict_or_missing(services, job_id, "is not in_doubt")
    return reply(bodies.Moved, {"id": job_id, "state": state.value})


def _resolution(body: dict[str, Any]) -> tuple[str, str]:
    """The outcome and note of a resolution; InputError(400) when invalid."""
    outcome = body.get("outcome")
    if outcome not in dlq.OUTCOMES:
        raise InputError(
            400, '"outcome" must be one of ' + ", ".join(f'"{o}"' for o in dlq.OUTCOMES)
        )
    note = optional_str(body, "note", bodies.MAX_TEXT)
    if note is None or blank(note):
        raise InputError(400, 'give "note": what the provider showed')
    return outcome, note


# Dead letters ----------------------------------------------------------------------------


@endpoint(Role.VIEWER)
async def dlq_causes(request: Request, services: Services, principal: Principal) -> Response:
    """Parked jobs grouped by cause, largest group first."""
    async with services.engine.connect() as conn:
        groups = await dlq.causes(conn)
    return reply(bodies.Causes, [g.as_dict() for g in groups])


@endpoint(Role.OPERATOR)
async def dlq_replay(request: Request, services: Services, principal: Principal) -> Response:
    """Replay parked jobs by cause (with a limit) or by id; the approver is the token."""
    body = await _json_object(request, REPLAY_FIELDS)
    request_ = parse_replay(body)
    try:
        outcome = await actions.replay(
            services.settings, services.engine, approved_by=principal.name, **request_
        )
    except dlq.ReplayRefused as exc:
        raise InputError(400, str(exc)) from None
    chosen = [j.id for j in outcome.plan.replay] if request_["dry_run"] else outcome.replayed
    out: dict[str, Any] = {
        "dry_run": request_["dry_run"],
        "replayed": chosen,
        "skipped": [{"id": i, "reason": why} for i, why in outcome.plan.skipped],
    }
    if outcome.push_warning:
        out["warning"] = outcome.push_warning
    if not chosen and outcome.plan.skipped:
        first = outcome.plan.skipped[0]
        out["error"] = f"no job was replayed; {first[0]}: {first[1]}"
        return reply(bodies.NoneReplayed, out, 409)
    return reply(bodies.Replayed, out)


@endpoint(Role.OPERATOR)
async def dlq_resolve(request: Request, services: Services, principal: Principal) -> Response:
    """Settle up to `limit` in_doubt jobs of one cause the same way (audited per job)."""
    body = await _json_object(request, ("cause_id", "limit", "outcome", "note"))
    cause, limit = body.get("cause_id"), body.get("limit")
    if not isinstance(cause, str) or not cause:
        raise InputError(400, 'give "cause_id": a cause id from /api/dlq/causes')
    limit = parse_count(limit)
    outcome, note = _resolution(body)
    checked(bodies.ResolveCause, body)
    resolved = await actions.resolve_cause(
        services.settings,
        services.engine,
        cause,
        limit=limit,
        outcome=outcome,
        approved_by=principal.name,
        note=note,
    )
    if not resolved:
        raise InputError(409, f"no in_doubt job has cause {cause}; see /api/dlq/causes")
    return reply(
        bodies.Resolved,
        {"resolved": [{"id": job_id, "state": state.value} for job_id, state in resolved]},
    )


def parse_replay(body: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `actions.replay` from a request body; InputError(400) when invalid."""
    cause, job_ids, limit = body.get("cause_id"), body.get("job_ids"), body.get("limit")
    if (cause is None) == (job_ids is None):
        raise InputError(400, 'give either "cause_id" (with "limit") or "job_ids", not both')
    if cause is not None and not isinstance(cause, str):
        raise InputError(400, '"cause_id" must be a cause id string from /api/dlq/causes')
    if job_ids is not None and (
        not isinstance(job_ids, list) or not job_ids or not all(isinstance(i, str) for i in job_ids)
    ):
        raise InputError(400, '"job_ids" must be a non-empty list of job id strings')
    if cause is not None and limit is None:
        raise InputError(400, 'a replay by "cause_id" needs "limit": how many jobs at most')
    if limit is not None:
        limit = parse_count(limit)
    for flag in ("allow_spent", "dry_run"):
        if not isinstance(body.get(flag, False), bool):
            raise InputError(400, f'"{flag}" must be true or false')
    checked(bodies.Replay, body)
    return {
        "job_ids": job_ids or [],
        "cause": cause,
        "limit": limit,
        "reason": optional_str(body, "reason", bodies.MAX_TEXT),
        "allow_spent": body.get("allow_spent", False),
        "dry_run": body.get("dry_run", False),
    }


# Approvals --------------------------------------------------------------------------------


@endpoint(Role.VIEWER)
async def list_approvals(request: Request, services: Services, principal: Principal) -> Response:
    """Pending approvals, oldest first."""
    async with services.engine.connect() as conn:
        found = await approvals.pending(conn)
    return reply(bodies.Approvals, [_plain(a.as_dict()) for a in found])


@endpoint(Role.OPERATOR)
async def decide_approval(request: Request, services: Services, principal: Principal) -> Response:
    """Approve or reject what a waiting job asked for; the decider is the token's name."""
    job_id = request.path_params["job_id"]
    body = await _json_object(request, ("approved", "reason", "raise_budget_usd"))
    approved = body.get("approved")
    if not isinstance(approved, bool):
        raise InputError(400, '"approved" must be true (approve) or false (reject)')
    reason = optional_str(body, "reason", bodies.MAX_TEXT)
    if not approved and blank(reason):
        raise InputError(400, 'a rejection needs "reason": the job fails with it')
    raise_micros = _raise_of(body, approved)
    checked(bodies.Decide, body)
    try:
        state = await actions.decide(
            services.settings,
            services.engine,
            job_id,
            approved=approved,
            by=principal.name,
            reason=reason,
            raise_micros=raise_micros,
        )
    except approvals.ApprovalError as exc:
        await _conflict_or_missing(services, job_id, f"has no pending approval ({exc})")
    return reply(bodies.Moved, {"id": job_id, "state": state.value})


def _raise_of(body: dict[str, Any], approved: bool) -> int | None:
    """An approval's `"raise_budget_usd"` in micro-dollars (a 400 for one that is not a
    raise, or one given with a rejection)."""
    amount = body.get("raise_budget_usd")
    if amount is None:
        return None
    if not approved:
        raise InputError(400, '"raise_budget_usd" goes with an approval, not a rejection')
    if not isinstance(amount, str):
        raise InputError(400, '"raise_budget_usd" must be dollars as a string, e.g. "2.00"')
    try:
        return budgets.parse_budget(amount, field='"raise_budget_usd"')
    except budgets.BudgetRefused as exc:
        raise InputError(400, str(exc)) from None


# Service -----------------------------------------------------------------------------------


@endpoint(Role.VIEWER)
async def get_stats(request: Request, services: Services, principal: Principal) -> Response:
    """What `stats --json` prints: counts by state, lanes, parked causes, spend, replies."""
    async with services.engine.connect() as conn:
        service = await stats.read_service_stats(conn)
    try:
        queue = await JobQueue.connect(services.settings, conn_retries=0)
    except QueueUnavailable as exc:
        raise InputError(503, str(exc)) from None
    try:
        depths = await stats.lane_depths(queue, catalog.LANES)
    finally:
        await queue.close()
    return reply(bodies.Stats, stats.as_json(service, depths, catalog.LANES))


@endpoint(Role.VIEWER)
async def get_caps(request: Request, services: Services, principal: Principal) -> Response:
    """Every daily cap with today's (UTC) use: remaining, or how far over (never negative)."""
    today = datetime.now(UTC).date()
    async with services.engine.connect() as conn:
        caps = await spend.caps_for_day(conn, today)
    return reply(bodies.Caps, [c.as_dict(today) for c in caps])


@endpoint(Role.ADMIN)
async def set_cap(request: Request, services: Services, principal: Principal) -> Response:
    """Change a daily cap (admin; audited with the token's name as the approver)."""
    body = await _json_object(request, ("agent", "usd", "reason"))
    agent, amount = parse_cap(body)
    try:
        old, new = await spend.set_cap(
            services.engine,
            agent,
            amount,
            approved_by=principal.name,
            reason=optional_str(body, "reason", bodies.MAX_TEXT),
        )
    except spend.CapChangeRefused as exc:
        raise InputError(400, str(exc)) from None
    return reply(
        bodies.CapChanged,
        {"agent": agent, "old_usd": None if old is None else str(old), "usd": str(new)},
    )


@endpoint(Role.VIEWER)
async def list_audit(request: Request, services: Services, principal: Principal) -> Response:
    """The newest audit entries, newest first."""
    limit = parse_limit(request.query_params.get("limit"), bodies.MAX_LIST)
    async with services.engine.connect() as conn:
        entries = await audit.recent(
            conn,
            limit=limit,
            actor=request.query_params.get("actor"),
            target=request.query_params.get("target"),
        )
    return reply(bodies.AuditLog, [e.as_dict() for e in entries])


async def openapi(request: Request) -> Response:
    """This API's OpenAPI document (public: it holds no data)."""
    return JSONResponse(request.app.state.openapi)


def reply(model: type[BaseModel], content: Any, status: int = 200) -> Response:
    """A success body built through its model (bodies.py): what the document promises,
    or a 500 here rather than a surprise for a generated client."""
    body = model.model_validate(content).model_dump(mode="json", exclude_unset=True)
    return JSONResponse(body, status_code=status)


def routes() -> list[BaseRoute]:
    return [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/jobs", submit_job, methods=["POST"]),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs/{job_id}", get_job, methods=["GET"]),
        Route("/jobs/{job_id}/events", job_events, methods=["GET"]),
        Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/jobs/{job_id}/rerun", rerun_job, methods=["POST"]),
        Route("/jobs/{job_id}/resolve", resolve_job, methods=["POST"]),
        Route("/dlq/resolve", dlq_resolve, methods=["POST"]),
        Route("/dlq/causes", dlq_causes, methods=["GET"]),
        Route("/dlq/replay", dlq_replay, methods=["POST"]),
        Route("/approvals", list_approvals, methods=["GET"]),
        Route("/approvals/{job_id}/decide", decide_approval, methods=["POST"]),
        Route("/stats", get_stats, methods=["GET"]),
        Route("/caps", get_caps, methods=["GET"]),
        Route("/caps", set_cap, methods=["POST"]),
        Route("/audit", list_audit, methods=["GET"]),
    ]


# Input -------------------------------------------------------------------------------------


async def _json_object(
    request: Request, fields: tuple[str, ...], *, empty_ok: bool = False
) -> dict[str, Any]:
    raw = await _read_body(request)
    if empty_ok and not raw:  # no body at all; whitespace alone is not JSON (a 400)
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:  # also UnicodeDecodeError, and an int past Python's digit limit
        where = (
            f" ({exc.msg} at line {exc.lineno} column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise InputError(400, f"the body is not valid JSON{where}; send a JSON object") from None
    if not isinstance(body, dict):
        raise InputError(400, "the body must be a JSON object")
    unknown = set(body) - set(fields)
    if unknown:
        raise InputError(
            400, f"unknown field {sorted(unknown)[0]!r}; fields: {', '.join(fields) or 'none'}"
        )
    refuse_nul(((name, value) for name, value in body.items() if name != "payload"), "field")
    return body


async def _read_body(request: Request) -> bytes:
    """The body, refused (413) unread past the payload limit plus room for the other fields."""
    limit = request.app.state.services.settings.max_payload_bytes + BODY_SLACK
    too_large = InputError(413, f"the request body is over {limit} bytes; send a smaller payload")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _conflict_or_missing(services: Services, job_id: str, conflict: str) -> NoReturn:
    async with services.engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    if job is None:
        raise InputError(404, f"no job with id {job_id}")
    raise InputError(409, f"job {job_id} {conflict}: it is {job.state.value}")


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready: times as ISO 8601, money (Decimal) as strings."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        elif isinstance(value, Decimal):
            value = str(value)
        out[key] = value
    return out
