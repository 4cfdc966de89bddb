"""The API's request and response bodies as pydantic models (template-owned:
copier-agent-worker).

openapi.py builds the document from these models (`model_json_schema`), the handlers check
every request body against its model after their own checks (which give the friendlier
sentences) and build every success body through its model: a body the document does not
describe is a bug the tests see, not a client's surprise. Names that come from the answers
(agents, lanes) are enums in the document; openapi.py fills them in per app.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, RootModel

from ..deadlines import MAX_DEADLINE_S
from ..dlq import OUTCOMES
from ..states import JobState
from ..submit import MAX_DELAY_S

MAX_TEXT = 2000  # a reason or a note
MAX_OWNER = 200
MAX_LIST = 500  # rows one listing returns
MAX_BATCH = 10_000  # jobs one replay or resolve by cause may touch
SEQ_MAX = 2**31 - 1  # the largest event seq (job_events.seq is a 32-bit integer)

Time = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Usd = Annotated[str, Field(description="Dollars as a decimal string, never a float.")]
Outcome = Literal["completed", "failed", "retry", "not-charged"]
assert set(OUTCOMES) == set(get_args(Outcome)), "dlq.OUTCOMES and Outcome differ"
# What counts as blank, spelled out: `\s` means different sets in Python, in pydantic's regex
# engine and in JSON Schema's (ECMA 262), and the server and the document must agree.
BLANK = " \t\n\v\f\r\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# No NUL character (\u0000) anywhere: PostgreSQL's text columns cannot hold one, so the API
# refuses it in every text field it stores or searches by (inputs.refuse_nul); a payload, a
# JSON column, keeps it.
NO_NUL = r"^[^\x00]*$"
NON_BLANK = f"[^{BLANK}]"
NOT_BLANK = f"^[^\\x00]*[^{BLANK}\\x00][^\\x00]*$"  # a NON_BLANK character, and no NUL
Text = Annotated[str, Field(pattern=NO_NUL)]
Note = Annotated[str, Field(min_length=1, max_length=MAX_TEXT, pattern=NOT_BLANK)]
Reason = Annotated[str, Field(max_length=MAX_TEXT, pattern=NO_NUL)]
# Lax: JSON Schema counts 418.0 as an integer, so the server takes it too (inputs.parse_count
# has already refused strings and booleans).
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH, strict=False)]
# Dollars above 0, at most 1000000, in whole micro-dollars (a string: money is never a float).
BUDGET_PATTERN = (
    r"^([1-9]\d{0,5}(\.\d{1,6})?|1000000(\.0{1,6})?"
    r"|0?\.([1-9]\d{0,5}|0[1-9]\d{0,4}|00[1-9]\d{0,3}|000[1-9]\d{0,2}|0000[1-9]\d?|00000[1-9]))$"
)


class Request(BaseModel):
    """A request body: exactly these fields, JSON types as given (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Response(BaseModel):
    """A success body: exactly these fields."""

    model_config = ConfigDict(extra="forbid")


# Requests ---------------------------------------------------------------------------------


class SubmitJob(Request):
    agent: str = Field(description="An agent's name (an enum of this service's agents).")
    payload: dict[str, Any]
    owner: Annotated[str, Field(max_length=MAX_OWNER, pattern=NO_NUL)] | None = None
    delay_s: Annotated[float, Field(ge=0, le=MAX_DELAY_S)] | None = None
    priority: Literal["high", "normal", "low"] = "normal"
    # Above 0 to 1000000 dollars in whole micro-dollars: what budgets.parse_budget takes.
    budget_usd: Annotated[str, Field(pattern=BUDGET_PATTERN)] | None = None
    # Whole seconds from submit to a terminal state: what deadlines.parse_deadline takes.
    deadline_s: Annotated[int, Field(ge=1, le=MAX_DEADLINE_S)] | None = None


class Cancel(Request):
    children: bool = Field(
        False, description="Also cancel every unsettled job below it; running ones are stopped."
    )


class Rerun(Request):
    from_step: str = Field(
        min_length=1,
        max_length=200,
        pattern=NO_NUL,
        description="A step the job recorded: run again from it.",
    )
    input: dict[str, Any] | None = Field(
        None, description="A new payload for the rerun (default: the job's own)."
    )
    reason: Reason = Field("", description="Why; needed when the rerun makes paid calls.")
    dry_run: bool = Field(False, description="Only say what it reuses and would pay for.")


class Resolve(Request):
    outcome: Outcome
    note: Note


class ResolveCause(Request):
    cause_id: Annotated[str, Field(min_length=1, pattern=NO_NUL)]
    limit: Batch
    outcome: Outcome
    note: Note


class ReplayByCause(Request):
    cause_id: Text
    limit: Batch
    reason: Reason | None = None
    allow_spent: bool = False
    dry_run: bool = False


class ReplayByIds(Request):
    job_ids: Annotated[list[Text], Field(min_length=1)]
    limit: Batch | None = None
    reason: Reason | None = None
    allow_spent: bool = False
    dry_run: bool = False


class Replay(RootModel[ReplayByCause | ReplayByIds]):
    """By cause (with a limit) or by ids, never both."""


class Approve(Request):
    approved: Literal[True]
    reason: Reason | None = None
    # For a job waiting on its budget: added to the budget or the day's cap that stopped it.
    raise_budget_usd: Annotated[str, Field(pattern=BUDGET_PATTERN)] | None = None


class Reject(Request):
    approved: Literal[False]
    reason: Annotated[str, Field(min_length=1, max_length=MAX_TEXT, pattern=NOT_BLANK)]


class Decide(RootModel[Approve | Reject]):
    """An approval, or a rejection with the reason the job fails with."""


class SetCap(Request):
    agent: str = Field(pattern=NO_NUL, description='A paid agent\'s name or "*" (the global cap).')
    # 0 to 1000000 dollars in whole micro-dollars: what spend.parse_usd takes.
    usd: Annotated[str, Field(pattern=r"^(\d{1,6}(\.\d{1,6})?|1000000(\.0{1,6})?)$")]
    reason: Reason | None = None


# Responses --------------------------------------------------------------------------------


class Moved(Response):
    """A job and the state an action left it in."""

    id: str
    state: JobState


class RerunCall(Response):
    name: str
    state: str = Field(description="Its state in the original job.")
    reserved_usd: Usd
    cost_usd: Usd | None = Field(description="What it cost the original (null: unknown).")


class RerunPlan(Response):
    """What a rerun reuses from the original and what it does again; `new_job_id` is the
    rerun's id (null on a dry run)."""

    job_id: str
    agent: str
    from_step: str
    reused_steps: list[str]
    steps_again: list[str]
    reused_paid_calls: list[str] = Field(description="Copied, not paid again.")
    paid_calls_again: list[RerunCall] = Field(description="By the original's record.")
    reserved_usd: Usd = Field(description="What the calls made again reserve in all.")
    reused_approvals: list[str]
    children_again: int = Field(description="Child jobs of the original, spawned again.")
    needs_approval: bool
    new_job_id: str | None


class Cancelled(Moved):
    """`state` is `cancelled`, or `active` for a running job its worker is stopping."""

    cancelled: list[str] = Field(description="Jobs cancelled now, this one first if it was.")
    stopping: list[str] = Field(
        description="Running jobs asked to stop: each ends cancelled within a second, or "
        "in_doubt when a paid call was in flight."
    )


class Submitted(Moved):
    warning: str | None = Field(None, description="Recorded but not queued yet: why.")


class Job(Response):
    id: str
    agent: str
    lane: str
    state: JobState
    payload: dict[str, Any]
    result: dict[str, Any] | None
    owner: str
    idempotency_key: str | None
    attempts: int
    max_attempts: int
    run_after: Time | None
    lease_expires_at: Time | None
    worker: str | None
    last_error: str | None
    created_at: Time
    updated_at: Time
    claimed_at: Time | None
    finished_at: Time | None
    trace_context: dict[str, str] | None
    parent_id: str | None
    child_key: str | None
    waiting_for: str | None
    deferrals: int
    priority: Literal["high", "normal", "low"]
    budget_id: str | None = Field(description="The job whose budget covers this one.")
    event_seq: int = Field(description="The seq of the job's last event (0: none yet).")
    deadline_at: Time | None = Field(
        description="When the job must have finished, or it fails (its run deadline)."
    )
    cancel_requested_at: Time | None = Field(
        description="When an operator asked to stop it while it ran (its worker stops it)."
    )
    cancel_children: bool | None = Field(
        description="Whether that request reaches every unsettled job below it too."
    )
    rerun_of: str | None = Field(
        description="The job this one reruns from one of its steps (jobs rerun)."
    )
    code_version: str | None = Field(
        description="The version of its agent's code the job started on (set at its first claim)."
    )


class Attempt(Response):
    number: int
    worker: str
    started_at: Time
    finished_at: Time | None
    outcome: str | None
    error_class: str | None
    error_message: str | None
    traceback: str | None


class PaidCall(Response):
    name: str
    attempt: int
    state: str
    max_cost_usd: Usd
    cost_usd: Usd | None
    started_at: Time
    finished_at: Time | None


class WebhookDelivery(Response):
    """One notification of the job's end to a webhook endpoint."""

    endpoint: str
    state: str = Field(description="pending, sending, sent, or failed (given up after 72 h).")
    attempts: int = Field(description="Sends tried so far.")
    created_at: Time
    next_attempt_at: Time
    sent_at: Time | None
    last_error: str | None


class AuditEntry(Response):
    at: Time
    actor: str
    action: str
    target: str
    details: dict[str, Any]


class Budget(Response):
    job_id: str
    parent_job_id: str | None = Field(description="The budget this one is carved inside.")
    budget_usd: Usd
    reserved_usd: Usd
    spent_usd: Usd
    remaining_usd: Usd


class JobCost(Response):
    job_id: str
    spent_usd: Usd
    reserved_usd: Usd


class TreeCost(Response):
    root_id: str
    spent_usd: Usd
    reserved_usd: Usd
    jobs: list[JobCost] = Field(description="Each job's share, the root first.")


class Cost(Response):
    """What a job spent and holds reserved, the budget that covers it and its tree's spend."""

    spent_usd: Usd
    reserved_usd: Usd
    budget: Budget | None = Field(description="The budget covering the job, if any.")
    tree: TreeCost | None = Field(description="The job and its descendants, when it has any.")


class JobDetail(Job):
    attempt_log: list[Attempt]
    paid_calls: list[PaidCall]
    audit: list[AuditEntry]
    cost: Cost
    webhook_deliveries: list[WebhookDelivery]


class JobEvent(Response):
    seq: int = Field(description="Its place in the job's events, from 1 (0: the summary).")
    at: Time
    kind: str = Field(description="The service's kinds (attempt_started, step, ...) or ctx.emit's.")
    attempt: int | None
    data: dict[str, Any] | None


class EventsPage(Response):
    events: list[JobEvent]
    trimmed: JobEvent | None = Field(
        description="When events before this page were trimmed to the job's bound: how many, "
        "by kind (seq 0)."
    )
    next_after: int = Field(description="Pass as `after` for the next page.")
    state: JobState = Field(description="The job's state when the page was read.")


class JobsPage(Response):
    jobs: list[Job]
    next_before: str | None = Field(description="Pass as `before` for the next page.")


class Resolved(Response):
    resolved: list[Moved]


class CauseGroup(Response):
    cause_id: str
    cause: str
    count: int
    agents: list[str]
    states: list[JobState]
    first_seen: Time | None
    last_seen: Time | None
    sample_ids: list[str]


class Causes(RootModel[list[CauseGroup]]):
    pass


class Skipped(Response):
    id: str
    reason: str


class Replayed(Response):
    dry_run: bool
    replayed: list[str]
    skipped: list[Skipped]
    warning: str | None = None


class NoneReplayed(Replayed):
    """409: every chosen job was skipped; `error` says why the first one was."""

    error: str


class Approval(Response):
    job_id: str
    agent: str
    job_state: JobState
    name: str
    summary: str
    state: str
    requested_at: Time
    expires_at: Time | None
    decided_at: Time | None
    decided_by: str | None
    reason: str | None
    details: dict[str, str | None] | None = None


class Approvals(RootModel[list[Approval]]):
    pass


class LaneStats(Response):
    redis_depth: int
    oldest_queued_age_s: float | None
    scheduled: int


class ParkedCause(Response):
    cause_id: str
    count: int
    cause: str


class SpendToday(Response):
    agent: str
    cap_usd: Usd
    spent_usd: Usd
    reserved_usd: Usd


class Stats(Response):
    jobs_by_state: dict[JobState, int]
    estimated_states: list[JobState] = Field(
        description="States whose count is PostgreSQL's estimate from the table's statistics "
        "(completed or cancelled past 100,000 jobs), not a count of rows."
    )
    lanes: dict[str, LaneStats] = Field(description="Keyed by lane (an enum of the lanes).")
    parked_by_cause: list[ParkedCause]
    spend_today: list[SpendToday]
    unsent_replies: int
    unsent_webhooks: int = Field(description="Webhook notifications not sent yet.")
    failed_webhooks: int = Field(
        description="Webhook notifications given up after three days of failed sends."
    )


class CapUse(Response):
    agent: str
    day: Annotated[str, Field(json_schema_extra={"format": "date"})]
    cap_usd: Usd
    reserved_usd: Usd
    spent_usd: Usd
    remaining_usd: Usd
    over_by_usd: Usd


class Caps(RootModel[list[CapUse]]):
    pass


class CapChanged(Response):
    agent: str
    old_usd: Usd | None
    usd: Usd


class AuditLog(RootModel[list[AuditEntry]]):
    pass


class Error(Response):
    error: str = Field(description="One sentence saying what is wrong and what to do.")
    error_id: str | None = Field(None, description="On a 500: the id of its log line.")
