"""The agent contract and agent discovery (template-owned: copier-agent-worker).

An agent is a module with `async def run(ctx: AgentContext, payload: dict) -> dict`.
Modules in `agents/` are found by listing the package, never imported by a fixed name; their
settings (lane, timeout, attempts, spend) come from `catalog.AGENTS` or from a module-level
`CONFIG = AgentConfig(...)`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import ModuleType
from typing import Any

import structlog


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


@dataclass(frozen=True)
class AgentContext:
    """What an agent gets besides its payload."""

    job_id: str
    agent: str
    attempt: int
    max_attempts: int
    log: Any  # a structlog logger bound to job_id, agent and attempt


AgentFn = Callable[[AgentContext, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Agent:
    """A discovered agent: its name, settings and entry point."""

    name: str
    config: AgentConfig
    run: AgentFn
    permanent_errors: tuple[type[BaseException], ...] = ()
    example_payload: Mapping[str, Any] | None = None


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
        agent = _agent_from_module(module, catalog)
        agents[agent.name] = agent
    return agents


def _agent_from_module(module: ModuleType, catalog: Mapping[str, AgentConfig]) -> Agent:
    name = getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1])
    config = getattr(module, "CONFIG", None) or catalog.get(name)
    if config is None:
        raise AgentError(
            f"agent module {module.__name__} has no settings: add it to the template answers "
            f"(copier update -d agents=...) or define CONFIG = AgentConfig(...) in the module"
        )
    run = getattr(module, "run", None)
    if run is None or not callable(run):
        raise AgentError(f"agent module {module.__name__} must define async def run(ctx, payload)")
    return Agent(
        name=name,
        config=config,
        run=run,
        permanent_errors=tuple(getattr(module, "PERMANENT_ERRORS", ())),
        example_payload=getattr(module, "EXAMPLE_PAYLOAD", None),
    )


def bind_logger(job_id: str, agent: str, attempt: int) -> Any:
    """A logger whose every event carries the job id, agent and attempt."""
    return structlog.get_logger("agent").bind(job_id=job_id, agent=agent, attempt=attempt)
