"""The job page's timeline, live (template-owned: copier-agent-worker).

The job page lists the job's latest events (events.py) on one time axis: attempts, steps,
paid calls (model, tokens, cost, duration), children, waits and what its agent emitted.
`static/timeline.js` then follows `/jobs/{id}/events`, Server-Sent Events under the console's
session read by the same `events.follow` as the API's stream, and adds each new event as a
row of text. Once the job has finished or parked the stream sends `{"end": STATE}` and the
page stops listening.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import events, queries
from ..tokens import Principal, Role
from .auth import Denied, Session
from .inputs import InputError, parse_after
from .pages import page
from .services import Services

PING_S = 15


@page(Role.VIEWER)
async def job_events(
    request: Request, services: Services, principal: Principal, session: Session
) -> Response:
    job_id = request.path_params["job_id"]
    try:
        after = parse_after(request)
    except InputError as exc:
        raise Denied(exc.status, exc.message) from None
    async with services.engine.connect() as conn:
        if await queries.get_job(conn, job_id) is None:
            raise Denied(404, f"no job with id {job_id}")
    return EventSourceResponse(_follow(services.engine, job_id, after), ping=PING_S)


async def _follow(engine: AsyncEngine, job_id: str, after: int) -> AsyncIterator[ServerSentEvent]:
    try:
        async for event in events.follow(engine, job_id, after):
            yield ServerSentEvent(data=json.dumps(event.as_dict()), id=str(event.seq))
    except events.NoSuchJob:  # pruned meanwhile
        yield ServerSentEvent(data=json.dumps({"end": "gone"}))
        return
    async with engine.connect() as conn:
        job = await queries.get_job(conn, job_id)
    yield ServerSentEvent(data=json.dumps({"end": "gone" if job is None else job.state.value}))


def routes() -> list[BaseRoute]:
    return [Route("/jobs/{job_id}/events", job_events, methods=["GET"])]
