"""The API's OpenAPI 3.1 document, served at /api/openapi.json
(template-owned: copier-agent-worker).

Written by hand next to the routes; a test checks that every route is described here and
that nothing here is missing from the app.
"""

from __future__ import annotations

from typing import Any

from ..dlq import OUTCOMES
from ..job_store import PRIORITIES
from ..submit import MAX_DELAY_S

_ERROR = {"$ref": "#/components/responses/Error"}
_ERRORS = {"400": _ERROR, "401": _ERROR, "403": _ERROR}


def _op(summary: str, role: str, ok: str = "200", **extra: Any) -> dict[str, Any]:
    responses: dict[str, Any] = {ok: {"description": "OK", "content": {"application/json": {}}}}
    responses.update(_ERRORS)
    responses.update(extra.pop("responses", {}))
    return {
        "summary": summary,
        "description": f"Role: {role} or above.",
        "responses": responses,
        **extra,
    }


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_JOB_ID = [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_STR = {"type": "string"}
_OUTCOME = {"enum": list(OUTCOMES)}
_404 = {"404": _ERROR}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 500}  # api.MAX_LIST
_BATCH = {"type": "integer", "minimum": 1, "maximum": 10_000}  # api.MAX_BATCH
_409 = {"409": _ERROR}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": f"{__name__.split('.')[0]} API", "version": "1"},
    "security": [{"bearer": []}],
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "responses": {
            "Error": {
                "description": "One sentence saying what is wrong and what to do.",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "error": _STR,
                                "error_id": {
                                    "type": "string",
                                    "description": "On a 500: the id of its log line.",
                                },
                            },
                            "required": ["error"],
                        }
                    }
                },
            }
        },
    },
    "paths": {
        "/api/openapi.json": {
            "get": {
                "summary": "This document.",
                "security": [],
                "responses": {"200": {"description": "OK"}},
            }
        },
        "/api/jobs": {
            "post": _op(
                "Record a job and queue it: 201 when created, 200 with the job an earlier "
                "request with the same Idempotency-Key and owner made.",
                "operator",
                ok="201",
                responses={
                    "200": {
                        "description": "The job already made with this Idempotency-Key",
                        "content": {"application/json": {}},
                    }
                },
                parameters=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": _STR,
                        "description": "Same key and owner: the same job.",
                    }
                ],
                requestBody=_body(
                    {
                        "agent": _STR,
                        "payload": {"type": "object"},
                        "owner": _STR,
                        "delay_s": {
                            "type": ["number", "null"],
                            "minimum": 0,
                            "maximum": MAX_DELAY_S,
                        },
                        "priority": {"enum": [*PRIORITIES, None]},
                    },
                    ["agent", "payload"],
                ),
            ),
            "get": _op(
                "Jobs, newest first.",
                "viewer",
                parameters=[
                    {"name": name, "in": "query", "schema": _STR}
                    for name in ("state", "agent", "owner", "before")
                ]
                + [{"name": "limit", "in": "query", "schema": _LIMIT}],
            ),
        },
        "/api/jobs/{job_id}": {
            "get": _op(
                "One job with attempts, paid calls and audit entries.",
                "viewer",
                parameters=_JOB_ID,
                responses=_404,
            )
        },
        "/api/jobs/{job_id}/cancel": {
            "post": _op(
                "Cancel a queued or parked job (audited).",
                "operator",
                parameters=_JOB_ID,
                responses={**_404, **_409},
            )
        },
        "/api/jobs/{job_id}/resolve": {
            "post": _op(
                "Settle an in_doubt job (audited).",
                "operator",
                parameters=_JOB_ID,
                requestBody=_body({"outcome": _OUTCOME, "note": _STR}, ["outcome", "note"]),
                responses={**_404, **_409},
            )
        },
        "/api/dlq/resolve": {
            "post": _op(
                "Settle up to limit in_doubt jobs of one cause the same way (audited per job). "
                "not-charged gives back the cost counted for their in-doubt calls.",
                "operator",
                requestBody=_body(
                    {
                        "cause_id": _STR,
                        "limit": _BATCH,
                        "outcome": _OUTCOME,
                        "note": _STR,
                    },
                    ["cause_id", "limit", "outcome", "note"],
                ),
                responses=_409,
            )
        },
        "/api/dlq/causes": {"get": _op("Parked jobs grouped by cause.", "viewer")},
        "/api/dlq/replay": {
            "post": _op(
                "Replay parked jobs by cause (with a limit) or by id; audited, the approver is "
                "the token's name. Jobs that made paid calls need allow_spent and their ids.",
                "operator",
                requestBody=_body(
                    {
                        "cause_id": _STR,
                        "job_ids": {"type": "array", "items": _STR},
                        "limit": _BATCH,
                        "reason": _STR,
                        "allow_spent": {"type": "boolean"},
                        "dry_run": {"type": "boolean"},
                    },
                    [],
                ),
                responses=_409,
            )
        },
        "/api/approvals": {"get": _op("Pending approvals, oldest first.", "viewer")},
        "/api/approvals/{job_id}/decide": {
            "post": _op(
                "Approve or reject what a waiting job asked for (audited; the decider is the "
                "token's name). A rejection needs a reason; the job then fails with it.",
                "operator",
                parameters=_JOB_ID,
                requestBody=_body({"approved": {"type": "boolean"}, "reason": _STR}, ["approved"]),
                responses=_409,
            )
        },
        "/api/stats": {"get": _op("Counts by state, lanes, parked causes, spend.", "viewer")},
        "/api/caps": {
            "get": _op("Daily caps with today's use.", "viewer"),
            "post": _op(
                "Change a daily cap (audited).",
                "admin",
                requestBody=_body(
                    {
                        "agent": _STR,
                        # At most 1000000 (checked by the server), in whole micro-dollars.
                        "usd": {"type": "string", "pattern": r"^\d{1,7}(\.\d{1,6})?$"},
                        "reason": _STR,
                    },
                    ["agent", "usd"],
                ),
            ),
        },
        "/api/audit": {
            "get": _op(
                "The audit log, newest first.",
                "viewer",
                parameters=[
                    {"name": "limit", "in": "query", "schema": _LIMIT},
                    {"name": "actor", "in": "query", "schema": _STR},
                    {"name": "target", "in": "query", "schema": _STR},
                ],
            )
        },
    },
}
