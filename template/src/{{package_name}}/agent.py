"""The agent contract: what an agent module defines and what it is given (template-owned:
copier-agent-worker).

An agent is a module in `agents/` with `async def run(ctx: AgentContext, payload: dict) ->
dict`. Its settings (lane, timeout, attempts, spend) come from the template answers
(`catalog.AGENTS`) or a module-level `CONFIG = AgentConfig(...)`; it ends a job early by
raising one of the errors below (errors.py). How agents are found is registry.py's business;
this module is all an agent module needs to import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any, Literal

import structlog

from .approvals import Decision
from .budgets import BudgetRefused, parse_budget
from .children import ChildOutcome
from .durable import Durable
from .errors import GiveUp, InvalidPayload, RateLimited, RetryLater
from .events import Emitter, EventRefused
from .limits import CallLimits, Grant
from .limits.upstream import retry_after_s
from .paid_calls import Cost, PaidCalls
from .versions import APPROVAL, CHILD, PAID_CALL, STEP

__all__ = [
    "AGENT_LIMIT",
    "AgentConfig",
    "AgentContext",
    "AgentFn",
    "AgentLimit",
    "GiveUp",
    "InvalidPayload",
    "RateLimited",
    "RetryLater",
    "bind_logger",
    "retry_after_s",
]


@dataclass(frozen=True)
class AgentConfig:
    """How one agent's jobs run: from the template answers or the module's CONFIG."""

    lane: str
    timeout_s: int
    paid: bool = False
    daily_cap_usd: Decimal | None = None
    max_attempts: int | None = None
    # Jobs of this agent running at once across every worker, and per owner (limits/).
    max_concurrent: int | None = None
    max_concurrent_per_owner: int | None = None
    # The named limit its paid calls wait for unless they name another (the answer `limit`).
    limit: str | None = None
    # Paid calls one job may make over all its attempts (a runaway guard); None: no count.
    max_paid_calls: int | None = None
    # What one job (with the children that draw on it) may spend in all, unless its submit
    # gives a budget (budgets.py); None: no per-job budget, only the daily caps.
    job_budget_usd: Decimal | None = None
    # A paid call that a budget or a daily cap cannot cover: "deny" ends the job `denied`;
    # "wait" parks it on an approval named `budget` for a person to raise (budget_asks.py).
    on_budget: Literal["deny", "wait"] = "deny"
    # Seconds from a job's submit to a terminal state, over all its attempts, deferrals and
    # waits, unless its submit gives one (deadlines.py); None: no deadline.
    deadline_s: int | None = None
    # The webhook endpoints (by name, from <PREFIX>WEBHOOK_URLS) told when a job of this
    # agent ends (webhooks.py); None: every endpoint, (): none.
    webhooks: tuple[str, ...] | None = None
    # A job resumed on new code that would make a paid call its record does not have while
    # recorded work is not reached yet: "run" reports it and goes on; "wait" also parks the
    # job on an approval named `version:<new version>` before that call (versions.py).
    on_version_change: Literal["run", "wait"] = "run"


class AgentLimit(Enum):
    AGENT = "the agent's limit"


# `ctx.paid_call(limit=AGENT_LIMIT)`, the default: the limit of the agent's settings, if any.
AGENT_LIMIT = AgentLimit.AGENT


@dataclass(frozen=True)
class AgentContext:
    """What an agent gets besides its payload."""

    job_id: str
    agent: str
    attempt: int
    max_attempts: int
    log: Any  # a structlog logger bound to job_id, agent and attempt
    paid: PaidCalls | None = None
    durable: Durable | None = None
    limits: CallLimits | None = None
    deadline: float | None = None  # the event loop's time when the job's timeout ends
    default_limit: str | None = None  # the agent's `limit`: what paid calls wait for
    events: Emitter | None = None  # where ctx.emit goes (events.py)

    async def emit(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Record an event of this job (`kind`, a JSON dict of at most 16 KiB) for whoever
        watches it (`jobs watch`, the API's event stream, the console's timeline). Returns at
        once; the worker writes emitted events within a fraction of a second, and before the
        attempt's outcome. A service kind (`step`, `attempt_started`, ...) or bad data raises
        InvalidPayload. Outside a worker (no runner context) it does nothing."""
        if self.events is None:
            return
        try:
            self.events.emit(kind, data)
        except EventRefused as exc:
            raise InvalidPayload(str(exc)) from None

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run `fn()` once per job under `name` and return its JSON result; every later run
        of the job (a retry, a resume after waiting) gets the stored result without calling
        `fn` again."""
        durable = self._durable()
        await durable.reach(STEP, name)
        return await durable.step(name, fn)

    async def approval(
        self, name: str, *, summary: str, timeout_s: float | None = None
    ) -> Decision:
        """Wait for a person to approve `name` (`approvals approve|reject JOB_ID`).

        The first time, the job parks `waiting` (this run stops here; it uses no attempt)
        and re-runs from the top once decided. Returns the decision: `.approved`, `.by`,
        `.reason`, `.at`. A rejection fails the job instead; after `timeout_s` the decision
        is "expired" (not approved, by "timeout").
        """
        durable = self._durable()
        await durable.reach(APPROVAL, name)
        return await durable.approval(name, summary=summary, timeout_s=timeout_s)

    async def spawn(
        self,
        agent: str,
        payload: dict[str, Any],
        *,
        key: str,
        budget_usd: Decimal | str | int | None = None,
    ) -> str:
        """Submit a child job running `agent` at most once per (this job, `key`); its id.

        The child's paid calls draw on this job's budget (and its tree's); `budget_usd`
        also gives it a budget of its own, a limit inside this job's.
        """
        try:
            budget = parse_budget(budget_usd, field="budget_usd of a child")
        except BudgetRefused as exc:
            raise InvalidPayload(str(exc)) from None
        durable = self._durable()
        await durable.reach(CHILD, key)
        return await durable.spawn(agent, payload, key=key, budget_micros=budget)

    async def wait_children(self) -> dict[str, ChildOutcome]:
        """Each child's outcome (`.state`, `.result`, `.error`) by key, once every child has
        settled; until then the job parks `waiting` (using no attempt). A child's failure is
        in its outcome, never raised here."""
        durable = self._durable()
        await durable.record_patches()
        return await durable.wait_children()

    def patched(self, name: str) -> bool:
        """Whether the code guarded by `if ctx.patched(name):` runs for this job: True for a
        job that reaches it with nothing of its record left to replay (a job started on
        this code, or one past all it had recorded), False for a job that started on older
        code and is replaying what that code recorded. The answer is recorded, so a job
        gets the same one on every run (versions.py). Use a new name for each change."""
        return self._durable().replay.patched(name)

    def _durable(self) -> Durable:
        if self.durable is None:
            raise RuntimeError("steps, approvals and children need the context the runner gives")
        return self.durable

    def limit(self, name: str, *, tokens: int = 0) -> AbstractAsyncContextManager[Grant]:
        """Hold a place under the named limit `name` for the block: `async with
        ctx.limit("llm", tokens=800) as grant: ...`. Waits for a concurrency slot and the
        rate windows; a wait longer than the job has left raises `RateLimited` (the job goes
        back to the queue, using no attempt). Set `grant.used(n)` to settle the tokens."""
        if self.limits is None:
            raise RuntimeError("ctx.limit needs the context the runner gives an agent")
        left = None if self.deadline is None else self.deadline - asyncio.get_running_loop().time()
        return self._noting_waits(self.limits.hold(name, tokens=tokens, left_s=left))

    @contextlib.asynccontextmanager
    async def _noting_waits(self, held: AbstractAsyncContextManager[Grant]) -> AsyncIterator[Grant]:
        """The held place, with a `limit_wait` event when taking it had to wait."""
        async with held as grant:
            if grant.waited_s and self.events is not None:
                waited = {"limit": grant.name, "waited_s": round(grant.waited_s, 3)}
                self.events.note("limit_wait", waited)
            yield grant

    async def paid_call(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        max_cost_usd: Decimal | str | int,
        cost_usd: Cost = None,
        limit: str | Literal[AgentLimit.AGENT] | None = AGENT_LIMIT,
        tokens: int = 0,
        tokens_used: int | Callable[[Any], int] | None = None,
    ) -> Any:
        """Call a paid provider at most once per job under `name`, within the spend caps.

        Reserves `max_cost_usd` first (a missing or spent cap denies the job), then calls
        `fn()`, records its cost and stores the result; a later attempt gets the stored
        result back (an SDK response as its own type) without calling again. The cost is
        `cost_usd` (a Decimal, or a function of the result); left out, an OpenAI or Anthropic
        result is priced from its own model and usage. A provider's 429 sends the job back
        to wait (no attempt used); its 4xx fails the job, nothing spent (paid_calls.py).

        With `limit` (by default the agent's own, from its settings; None for none), the call
        first waits for its place under that named limit, reserving `tokens` (an estimate),
        settled to `tokens_used` (a number, or a function of the result; left out, the
        result's own total tokens).
        """
        if self.paid is None:
            raise RuntimeError("paid_call needs the context the runner gives an agent")
        if self.durable is not None:
            await self._check_new_spend(name)
        if limit is AgentLimit.AGENT:
            limit = self.default_limit
        if limit is None or await self.paid.is_settled(name):
            return await self.paid.call(name, fn, max_cost_usd=max_cost_usd, cost_usd=cost_usd)
        async with self.limit(limit, tokens=tokens) as grant:
            result = await self.paid.call(name, fn, max_cost_usd=max_cost_usd, cost_usd=cost_usd)
            used = tokens_used(result) if callable(tokens_used) else tokens_used
            if used is None:
                from .pricing import tokens_used as of_usage  # loads the price table: lazily

                used = of_usage(result)
            if used is not None:
                grant.used(used)
        return result

    async def _check_new_spend(self, name: str) -> None:
        """Before paid call `name`: on code other than the job started on, a call its record
        does not have while replaying is new spend; with `on_version_change: wait` it waits
        for a person's approval (versions.py)."""
        durable = self._durable()
        replay = durable.replay
        if replay.is_new_spend(name):
            self.log.warning(
                "paid_call_new_on_changed_code",
                call=name,
                started_on=replay.started_on,
                running=replay.running,
                not_reached=replay.not_reached(),
            )
            if replay.on_change == "wait":
                decision = await self.approval(replay.approval, summary=replay.summary(name))
                if not decision.approved:
                    raise GiveUp(
                        f"paid call {name!r} on code version {replay.running} was not approved "
                        f"({decision.outcome} by {decision.by or 'nobody'})"
                    )
        await durable.reach(PAID_CALL, name)


AgentFn = Callable[[AgentContext, dict[str, Any]], Awaitable[dict[str, Any]]]


def bind_logger(job_id: str, agent: str, attempt: int) -> Any:
    """A logger whose every event carries the job id, agent and attempt."""
    return structlog.get_logger("agent").bind(job_id=job_id, agent=agent, attempt=attempt)


# Names this module carried before the registry was carved out (the contract no longer
# carries discovery): importable from here for one release, with a warning, so code written
# against the old layout keeps running. Looked up by name at call time, because the registry
# imports this module and never the other way round.
_MOVED = {
    "Agent": "registry",
    "AgentError": "registry",
    "discover": "registry",
    "ReplyFn": "replies",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = f"{__package__}.{_MOVED[name]}"
    warnings.warn(
        f"{__name__}.{name} moved to {home}; import it from there", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(home), name)
