"""The agent contract and agent discovery (template-owned: copier-agent-worker).

An agent is a module with `async def run(ctx: AgentContext, payload: dict) -> dict`.
Modules in `agents/` are found by listing the package, never imported by a fixed name; their
settings (lane, timeout, attempts, spend) come from `catalog.AGENTS` or from a module-level
`CONFIG = AgentConfig(...)`.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import structlog

from .limits import CallLimits, Grant
from .paid_calls import Cost, PaidCalls
from .replies import ReplyFn
from .upstream import RateLimited, retry_after_s

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentContext",
    "GiveUp",
    "RateLimited",
    "RetryLater",
    "discover",
    "retry_after_s",
]

if TYPE_CHECKING:  # durable.py imports the retry rules, which import this module
    from .approvals import Decision
    from .children import ChildOutcome
    from .durable import Durable


class GiveUp(Exception):
    """Raise from an agent to fail the job permanently: it is never retried automatically."""


class RetryLater(Exception):
    """Raise from an agent to try again after `after_s` seconds (counts as an attempt)."""

    def __init__(self, after_s: float, reason: str = "") -> None:
        if after_s < 0:
            raise ValueError("after_s must be zero or more seconds")
        super().__init__(reason or f"retry requested in {after_s:g}s")
        self.after_s = after_s


@dataclass(frozen=True)
class AgentConfig:
    """How one agent's jobs run: from the template answers or the module's CONFIG."""

    lane: str
    timeout_s: int
    paid: bool = False
    daily_cap_usd: Decimal | None = None
    max_attempts: int | None = None
    # Jobs of this agent running at once across every worker, and per owner (limits.py).
    max_concurrent: int | None = None
    max_concurrent_per_owner: int | None = None
    # The named limit its paid calls wait for unless they name another (the answer `limit`).
    limit: str | None = None


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

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run `fn()` once per job under `name` and return its JSON result; every later run
        of the job (a retry, a resume after waiting) gets the stored result without calling
        `fn` again."""
        return await self._durable().step(name, fn)

    async def approval(
        self, name: str, *, summary: str, timeout_s: float | None = None
    ) -> Decision:
        """Wait for a person to approve `name` (`approvals approve|reject JOB_ID`).

        The first time, the job parks `waiting` (this run stops here; it uses no attempt)
        and re-runs from the top once decided. Returns the decision: `.approved`, `.by`,
        `.reason`, `.at`. A rejection fails the job instead; after `timeout_s` the decision
        is "expired" (not approved, by "timeout").
        """
        return await self._durable().approval(name, summary=summary, timeout_s=timeout_s)

    async def spawn(self, agent: str, payload: dict[str, Any], *, key: str) -> str:
        """Submit a child job running `agent` at most once per (this job, `key`); its id."""
        return await self._durable().spawn(agent, payload, key=key)

    async def wait_children(self) -> dict[str, ChildOutcome]:
        """Each child's outcome (`.state`, `.result`, `.error`) by key, once every child has
        settled; until then the job parks `waiting` (using no attempt). A child's failure is
        in its outcome, never raised here."""
        return await self._durable().wait_children()

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
        return self.limits.hold(name, tokens=tokens, left_s=left)

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


AgentFn = Callable[[AgentContext, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Agent:
    """A discovered agent: its name, settings and entry point."""

    name: str
    config: AgentConfig
    run: AgentFn
    permanent_errors: tuple[type[BaseException], ...] = ()
    example_payload: Mapping[str, Any] | None = None
    reply: ReplyFn | None = None  # the module's `async def reply(ctx, result)`, if any


class AgentError(RuntimeError):
    """An agent module is missing its settings or its `run` function."""


def discover(
    package: str, catalog: Mapping[str, AgentConfig], extra_modules: list[str] | None = None
) -> dict[str, Agent]:
    """Every agent module in `package` (non-underscore modules) plus `extra_modules`."""
    pkg = importlib.import_module(package)
    modules = [
        importlib.import_module(f"{package}.{info.name}")
        for info in pkgutil.iter_modules(pkg.__path__)
        if not info.name.startswith("_")
    ]
    modules += [importlib.import_module(name) for name in extra_modules or []]
    agents: dict[str, Agent] = {}
    for module in modules:
        for agent in _agents_from_module(module, catalog):
            agents[agent.name] = agent
    return agents


def _agents_from_module(module: ModuleType, catalog: Mapping[str, AgentConfig]) -> list[Agent]:
    """The agents a module defines: itself (named after the module or NAME), or, when it has
    an AGENTS mapping of name -> AgentConfig, one agent per entry sharing its `run`."""
    run = getattr(module, "run", None)
    if run is None or not callable(run):
        raise AgentError(f"agent module {module.__name__} must define async def run(ctx, payload)")
    configs: Mapping[str, AgentConfig | None] = getattr(module, "AGENTS", None) or {
        getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1]): getattr(module, "CONFIG", None)
    }
    # A module with AGENTS names its reply steps per agent in REPLIES; a single-agent module
    # defines `reply` itself.
    single = not hasattr(module, "AGENTS")
    replies_of: Mapping[str, ReplyFn] = getattr(module, "REPLIES", {})
    agents = []
    for name, own_config in configs.items():
        config = own_config or catalog.get(name)
        if config is None:
            raise AgentError(
                # Also what an agent removed by `copier update` leaves behind: the update keeps
                # the user's module (and its test) but drops the agent's settings from catalog.
                f"agent module {module.__name__} has no settings for agent {name!r}: if it was "
                "removed from the template answers, delete the module and "
                f"tests/agents/test_{name}.py; otherwise add it to the answers "
                f"(copier update -d agents=...) or define CONFIG = AgentConfig(...) in the module"
            )
        agents.append(
            Agent(
                name=name,
                config=config,
                run=run,
                permanent_errors=tuple(getattr(module, "PERMANENT_ERRORS", ())),
                example_payload=getattr(module, "EXAMPLE_PAYLOAD", None),
                reply=replies_of.get(name, getattr(module, "reply", None) if single else None),
            )
        )
    return agents


def bind_logger(job_id: str, agent: str, attempt: int) -> Any:
    """A logger whose every event carries the job id, agent and attempt."""
    return structlog.get_logger("agent").bind(job_id=job_id, agent=agent, attempt=attempt)
