"""The API's OpenAPI 3.1 document, served at /api/openapi.json
(template-owned: copier-agent-worker).

The operations are written here next to the routes; every body's schema comes from its
pydantic model in bodies.py (`models_json_schema`), the models the handlers check requests
against and build responses through, so the document cannot drift from the server. The
names the answers give are enums: agents (what a submit takes), the agents a cap is for,
lanes (the keys of /api/stats) and job states. A test checks that every route is described
here and nothing here is missing from the app.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..states import JobState
from . import bodies

REF = "#/components/schemas/{model}"
_ERROR = {"$ref": "#/components/responses/Error"}
_ERRORS = {"400": _ERROR, "401": _ERROR, "403": _ERROR, "500": _ERROR}
_TEXT = {"type": "string", "pattern": bodies.NO_NUL}  # inputs.refuse_nul
_JOB_ID = [{"name": "job_id", "in": "path", "required": True, "schema": _TEXT}]
_LIMIT = {"type": "integer", "minimum": 1, "maximum": bodies.MAX_LIST, "default": 50}
_STATES = {"type": "string", "enum": [s.value for s in JobState]}
_AFTER = {"type": "integer", "minimum": 0, "maximum": bodies.SEQ_MAX, "default": 0}

REQUESTS: tuple[type[BaseModel], ...] = (
    bodies.SubmitJob,
    bodies.Cancel,
    bodies.Rerun,
    bodies.Resolve,
    bodies.ResolveCause,
    bodies.Replay,
    bodies.Decide,
    bodies.SetCap,
)
RESPONSES: tuple[type[BaseModel], ...] = (
    bodies.Submitted,
    bodies.JobsPage,
    bodies.JobDetail,
    bodies.EventsPage,
    bodies.Moved,
    bodies.Cancelled,
    bodies.RerunPlan,
    bodies.Resolved,
    bodies.Causes,
    bodies.Replayed,
    bodies.NoneReplayed,
    bodies.Approvals,
    bodies.Stats,
    bodies.Caps,
    bodies.CapChanged,
    bodies.AuditLog,
    bodies.Error,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _op(
    summary: str,
    role: str,
    ok: type[BaseModel],
    *,
    status: str = "200",
    body: type[BaseModel] | None = None,
    body_optional: bool = False,
    errors: Iterable[str] = (),
    responses: dict[str, Any] | None = None,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    answers: dict[str, Any] = {status: _json(ok), **_ERRORS}
    answers.update({code: _ERROR for code in errors})
    if body is not None:
        answers["413"] = _ERROR
    answers.update(responses or {})
    op: dict[str, Any] = {
        "summary": summary,
        "description": f"Role: {role} or above.",
        "responses": dict(sorted(answers.items())),
    }
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {
            "required": not body_optional,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    return op


def document(
    agents: Iterable[str], cap_agents: Iterable[str], lanes: Iterable[str]
) -> dict[str, Any]:
    """The document for a service with these agents (what a submit takes), cap targets
    (paid agents and "*") and lanes."""
    _, defs = models_json_schema(
        [(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in RESPONSES],
        ref_template=REF,
    )
    schemas: dict[str, Any] = defs["$defs"]
    schemas["SubmitJob"]["properties"]["agent"]["enum"] = sorted(agents)
    schemas["SetCap"]["properties"]["agent"]["enum"] = sorted(cap_agents)
    schemas["Stats"]["properties"]["lanes"]["propertyNames"] = {"enum": sorted(lanes)}
    return {
        "openapi": "3.1.0",
        "info": {"title": f"{__name__.split('.')[0]} API", "version": "1"},
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
            "responses": {"Error": _json(bodies.Error, "One sentence: what is wrong, what to do.")},
        },
        "paths": _paths(),
    }


def _paths() -> dict[str, Any]:
    return {
        "/api/openapi.json": {
            "get": {
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/api/jobs": {
            "post": _op(
                "Record a job and queue it: 201 when created, 200 with the job an earlier "
                "request with the same Idempotency-Key and owner made.",
                "operator",
                bodies.Submitted,
                status="201",
                body=bodies.SubmitJob,
                responses={"200": _json(bodies.Submitted, "The job this Idempotency-Key made")},
                parameters=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                        "description": "Same key and owner: the same job.",
                    }
                ],
            ),
            "get": _op(
                "Jobs, newest first; `before` (a job id) pages on from the last one seen.",
                "viewer",
                bodies.JobsPage,
                parameters=[
                    {"name": "state", "in": "query", "schema": _STATES},
                    *(
                        {"name": name, "in": "query", "schema": _TEXT}
                        for name in ("agent", "owner", "before")
                    ),
                    {"name": "limit", "in": "query", "schema": _LIMIT},
                ],
            ),
        },
        "/api/jobs/{job_id}": {
            "get": _op(
                "One job with attempts, paid calls and audit entries.",
                "viewer",
                bodies.JobDetail,
                parameters=_JOB_ID,
                errors=["404"],
            )
        },
        "/api/jobs/{job_id}/events": {
            "get": _op(
                "The job's events after `after` (or the Last-Event-ID header), oldest first: a "
                "JSON page, or with `Accept: text/event-stream` Server-Sent Events whose `id` is "
                "the event's seq (a reconnect resumes after it), ending once the job has "
                "finished or parked and every event was sent.",
                "viewer",
                bodies.EventsPage,
                parameters=[
                    *_JOB_ID,
                    {"name": "after", "in": "query", "schema": _AFTER},
                    {"name": "limit", "in": "query", "schema": _LIMIT},
                    {"name": "Last-Event-ID", "in": "header", "schema": _AFTER},
                ],
                errors=["404"],
                responses={
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {"schema": _ref(bodies.EventsPage)},
                            "text/event-stream": {
                                "schema": {"type": "string"},
                                "description": "`id: SEQ`, `event: KIND`, `data:` the JobEvent "
                                "as JSON; `event: trimmed` first when older events were trimmed.",
                            },
                        },
                    }
                },
            )
        },
        "/api/jobs/{job_id}/cancel": {
            "post": _op(
                "Cancel a job wherever it is; a running one is stopped by its worker within a "
                "second. With children, its whole tree (audited per job).",
                "operator",
                bodies.Cancelled,
                parameters=_JOB_ID,
                body=bodies.Cancel,
                body_optional=True,
                errors=["404", "409"],
            )
        },
        "/api/jobs/{job_id}/rerun": {
            "post": _op(
                "Run a finished job again from one of its recorded steps, as a new job that "
                "reuses the record before that step (not run, not paid again). dry_run only "
                "says what it reuses and which paid calls it makes again, with their "
                "reservation; a rerun that reserves money needs a reason (the approver is the "
                "token's name). 201 with new_job_id when made (audited). 409 for a job that "
                "has not ended, a step it never recorded, or a rerun that spends without a "
                "reason.",
                "operator",
                bodies.RerunPlan,
                parameters=_JOB_ID,
                body=bodies.Rerun,
                errors=["400", "404", "409"],
                responses={"201": _json(bodies.RerunPlan)},
            )
        },
        "/api/jobs/{job_id}/resolve": {
            "post": _op(
                "Settle an in_doubt job (audited).",
                "operator",
                bodies.Moved,
                parameters=_JOB_ID,
                body=bodies.Resolve,
                errors=["404", "409"],
            )
        },
        "/api/dlq/resolve": {
            "post": _op(
                "Settle up to limit in_doubt jobs of one cause the same way (audited per job). "
                "not-charged gives back the cost counted for their in-doubt calls.",
                "operator",
                bodies.Resolved,
                body=bodies.ResolveCause,
                errors=["409"],
            )
        },
        "/api/dlq/causes": {
            "get": _op("Parked jobs grouped by cause, largest first.", "viewer", bodies.Causes)
        },
        "/api/dlq/replay": {
            "post": _op(
                "Replay parked jobs by cause (with a limit) or by id; audited, the approver is "
                "the token's name. Jobs that made paid calls need allow_spent and their ids.",
                "operator",
                bodies.Replayed,
                body=bodies.Replay,
                responses={"409": _json(bodies.NoneReplayed, "No job was replayed")},
            )
        },
        "/api/approvals": {
            "get": _op("Pending approvals, oldest first.", "viewer", bodies.Approvals)
        },
        "/api/approvals/{job_id}/decide": {
            "post": _op(
                "Approve or reject what a waiting job asked for (audited; the decider is the "
                "token's name). A rejection needs a reason; the job then fails with it.",
                "operator",
                bodies.Moved,
                parameters=_JOB_ID,
                body=bodies.Decide,
                errors=["404", "409"],
            )
        },
        "/api/stats": {
            "get": _op(
                "Counts by state, lanes, parked causes, spend (503 when Redis is down).",
                "viewer",
                bodies.Stats,
                errors=["503"],
            )
        },
        "/api/caps": {
            "get": _op("Daily caps with today's use.", "viewer", bodies.Caps),
            "post": _op(
                "Change a daily cap (audited).", "admin", bodies.CapChanged, body=bodies.SetCap
            ),
        },
        "/api/audit": {
            "get": _op(
                "The audit log, newest first.",
                "viewer",
                bodies.AuditLog,
                parameters=[
                    {"name": "limit", "in": "query", "schema": _LIMIT},
                    {"name": "actor", "in": "query", "schema": _TEXT},
                    {"name": "target", "in": "query", "schema": _TEXT},
                ],
            )
        },
    }
