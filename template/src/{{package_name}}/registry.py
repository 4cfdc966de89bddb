"""The agents this service runs, found once per process (template-owned: copier-agent-worker).

An agent is a module in `agents/` (found by listing the package, never imported by a fixed
name) or one of the extra modules in the setting `agent_modules` (the test doubles); its
settings come from `catalog.AGENTS` or its own `CONFIG = AgentConfig(...)`. The extra
modules may also bring named limits (`LIMITS`), schedules (`SCHEDULES`) and longer lane
timeouts (`LANE_TIMEOUTS`): this is the one place that imports them.

From the agents, the registry works out what the rest of the service needs, so that no other
module knows how agents are found: each agent's route (lane and attempts: submit, child jobs,
schedules), the concurrency limits the gate holds jobs to, the reply steps recovery sends.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from types import ModuleType
from typing import Any, TypeVar

from . import catalog, versions
from .agent import AgentConfig, AgentFn
from .limits import Concurrency, LimitConfig
from .replies import ReplyFn
from .routes import Route
from .schedules import Schedule
from .settings import Settings
from .spend import to_micros

__all__ = [
    "Agent",
    "AgentError",
    "Registry",
    "attempts_of",
    "discover",
    "load",
    "load_agents",
    "schedules_of",
]

AGENTS_PACKAGE = __name__.rsplit(".", 1)[0] + ".agents"
T = TypeVar("T")


def attempts_of(config: AgentConfig | None) -> int:
    """The attempts a job of an agent with `config` may use: its own `max_attempts`, else the
    answered default (catalog.MAX_ATTEMPTS). The one place this rule is written."""
    return (config.max_attempts if config is not None else None) or catalog.MAX_ATTEMPTS


@dataclass(frozen=True)
class Agent:
    """A discovered agent: its name, settings and entry point."""

    name: str
    config: AgentConfig
    run: AgentFn
    permanent_errors: tuple[type[BaseException], ...] = ()
    example_payload: Mapping[str, Any] | None = None
    reply: ReplyFn | None = None  # the module's `async def reply(ctx, result)`, if any
    code_version: str = ""  # of its module (versions.py): what its jobs' first claims record

    @property
    def max_attempts(self) -> int:
        """How many attempts each of its jobs gets (attempts_of)."""
        return attempts_of(self.config)

    @property
    def route(self) -> Route:
        """Where its new jobs go: its lane, with its attempts, its per-job budget and its
        run deadline."""
        budget = self.config.job_budget_usd
        return Route(
            self.config.lane,
            self.max_attempts,
            None if budget is None else to_micros(budget),
            self.config.deadline_s,
        )


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
    code_version = versions.of_module(module)
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
                code_version=code_version,
            )
        )
    return agents


@dataclass(frozen=True)
class Registry:
    """The agents of one process and what the rest of the service needs to know of them
    (each worked out once: a worker reads its routes for every job)."""

    agents: dict[str, Agent]
    # Named limits on calls inside jobs: the answers' plus the extra modules' LIMITS.
    limits: dict[str, LimitConfig]
    # The answers' schedules plus the extra modules' SCHEDULES.
    schedules: dict[str, Schedule]
    # Each lane's job timeout: the answers', raised by the extra modules' LANE_TIMEOUTS
    # (the setting LANE_TIMEOUTS overrides both, in worker.lane_timeouts).
    lane_timeouts: dict[str, int]

    @cached_property
    def routes(self) -> dict[str, Route]:
        """Each agent's lane and attempts, for whatever makes jobs."""
        return {name: agent.route for name, agent in self.agents.items()}

    @cached_property
    def concurrency(self) -> dict[str, Concurrency]:
        """The agents with a limit on their jobs running at once, for the gate."""
        return {
            name: Concurrency(agent.config.max_concurrent, agent.config.max_concurrent_per_owner)
            for name, agent in self.agents.items()
            if agent.config.max_concurrent or agent.config.max_concurrent_per_owner
        }

    @cached_property
    def versions(self) -> dict[str, str]:
        """Each agent's code version, for the claims that record it (versions.py)."""
        return {name: agent.code_version for name, agent in self.agents.items()}

    @cached_property
    def reply_steps(self) -> dict[str, ReplyFn]:
        """The reply step of every agent that has one, for `recovery.reconcile`."""
        return {name: agent.reply for name, agent in self.agents.items() if agent.reply}


def load(settings: Settings) -> Registry:
    """This process's registry for the extra agent modules `settings` names (built once)."""
    return _load(tuple(settings.agent_modules))


def load_agents(settings: Settings) -> dict[str, Agent]:
    """The agents this service knows: its agents package plus configured extra modules."""
    return load(settings).agents


def schedules_of(settings: Settings) -> dict[str, Schedule]:
    """The schedules, without discovering the agents (`schedules list` imports no agent)."""
    modules = _extra_modules(tuple(settings.agent_modules))
    return _from_modules(catalog.SCHEDULES, modules, "SCHEDULES")


@cache
def _load(modules: tuple[str, ...]) -> Registry:
    extra = _extra_modules(modules)
    lanes = dict(catalog.LANES)
    for module in extra:  # extra agent modules (test doubles) may need longer
        for lane, timeout in getattr(module, "LANE_TIMEOUTS", {}).items():
            lanes[lane] = max(lanes.get(lane, 0), timeout)
    return Registry(
        agents=discover(AGENTS_PACKAGE, catalog.AGENTS, list(modules)),
        limits=_from_modules(catalog.LIMITS, extra, "LIMITS"),
        schedules=_from_modules(catalog.SCHEDULES, extra, "SCHEDULES"),
        lane_timeouts=lanes,
    )


@cache
def _extra_modules(names: tuple[str, ...]) -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(name) for name in names)


def _from_modules(
    answered: Mapping[str, T], modules: Sequence[ModuleType], attribute: str
) -> dict[str, T]:
    found = dict(answered)
    for module in modules:
        found.update(getattr(module, attribute, {}))
    return found
