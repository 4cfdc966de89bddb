"""Test doubles for the framework integrations (template-owned: copier-agent-worker). Needs
both extras, `pydantic-ai` and `openai-agents`.

`framework_pydantic_ai` and `framework_openai_agents` (paid) run a real Pydantic AI / Agents SDK
agent durably (`integrations.*.durable`) against the fake provider at
<PACKAGE>_FAKE_MODELS_URL (`testing.FakeModels.url`), with two tools, `lookup(q)`
and `fetch(url)`, each recording in `testing.PROVIDER`'s ledger every execution it starts, as
JOB:tool_started:NAME, and every one it completes, as JOB:tool:NAME. Enable them with
`AGENT_MODULES=["<package>.integrations.testing"]`.

    {"prompt": "Look it up", "max_cost_usd": "0.05"}
    {"prompt": "Look it up", "max_cost_usd": "0.05", "fail_in": "fetch", "limit": "llm"}
    {"prompt": "Look it up", "max_cost_usd": "0.05", "block_in": "fetch"}

"fail_in" makes that tool raise `ScriptedFailure` on attempt 1 (before it completes), so the
job is retried after the tools before it completed. "block_in" makes that tool's first
execution of the job block (for an hour: until its worker is killed) and later ones run at
once; "first" is read from the ledger, so it holds across worker processes. The result is
{"output": the agent's final text, "attempt": n}. Importing this module turns the Agents
SDK's tracing export off.
"""

from __future__ import annotations

import asyncio
import os
from decimal import Decimal
from typing import Any

import openai
from agents import Agent as SdkAgent
from agents import (
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    function_tool,
    set_tracing_disabled,
)
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from ..agent import AgentConfig, AgentContext
from ..catalog import DEFAULT_LANE
from ..testing import FAKE_MODELS_ENV, OPENAI_MODEL, PROVIDER, TIMEOUT_S, ScriptedFailure
from . import openai_agents, pydantic_ai

set_tracing_disabled(True)

AGENTS = {
    "framework_pydantic_ai": AgentConfig(
        lane=DEFAULT_LANE, timeout_s=TIMEOUT_S, max_attempts=3, paid=True
    ),
    "framework_openai_agents": AgentConfig(
        lane=DEFAULT_LANE, timeout_s=TIMEOUT_S, max_attempts=3, paid=True
    ),
}
EXAMPLE_PAYLOAD = {"prompt": "Look it up", "max_cost_usd": "0.05"}
INSTRUCTIONS = "Look the question up, fetch the page, then answer in one line."
# How long a "block_in" tool blocks on its first execution: longer than any test waits.
BLOCK_S = 3600.0


async def run(ctx: AgentContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the agent the job names against the fake provider, durably."""
    url = os.environ[FAKE_MODELS_ENV]
    prompt = str(payload["prompt"])
    max_cost_usd = Decimal(payload.get("max_cost_usd", "0.05"))
    limit = payload.get("limit")
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        if ctx.agent == "framework_pydantic_ai":
            model = OpenAIChatModel(OPENAI_MODEL, provider=OpenAIProvider(openai_client=client))
            durable_agent = pydantic_ai.durable(
                PYDANTIC_AGENT, max_cost_usd=max_cost_usd, limit=limit
            )
            result = await durable_agent.run(ctx, prompt, model=model, deps=(ctx, payload))
            output = str(result.output)
        else:
            agent = SdkAgent[tuple[AgentContext, dict[str, Any]]](
                name="researcher",
                instructions=INSTRUCTIONS,
                model=OpenAIChatCompletionsModel(model=OPENAI_MODEL, openai_client=client),
                tools=[sdk_lookup, sdk_fetch],
            )
            durable_sdk_agent = openai_agents.durable(agent, max_cost_usd=max_cost_usd, limit=limit)
            sdk_result = await durable_sdk_agent.run(ctx, prompt, context=(ctx, payload))
            output = str(sdk_result.final_output)
    return {"output": output, "attempt": ctx.attempt}


async def _tool(ctx: AgentContext, payload: dict[str, Any], name: str, value: str) -> str:
    """What both frameworks' tools do: record the start; block the first execution or fail on
    attempt 1 when asked; else record the completion and answer."""
    started = f"{ctx.job_id}:tool_started:{name}"
    PROVIDER._record(started)
    if payload.get("block_in") == name and PROVIDER.counts()[started] == 1:
        await asyncio.sleep(BLOCK_S)
    if payload.get("fail_in") == name and ctx.attempt == 1:
        raise ScriptedFailure(f"scripted failure in tool {name} on attempt 1")
    PROVIDER._record(f"{ctx.job_id}:tool:{name}")
    return f"{name}({value}) on attempt {ctx.attempt}"


PYDANTIC_AGENT = Agent(deps_type=tuple[AgentContext, dict[str, Any]], instructions=INSTRUCTIONS)


@PYDANTIC_AGENT.tool
async def lookup(rc: RunContext[tuple[AgentContext, dict[str, Any]]], q: str) -> str:
    """Look `q` up."""
    return await _tool(*rc.deps, "lookup", q)


@PYDANTIC_AGENT.tool
async def fetch(rc: RunContext[tuple[AgentContext, dict[str, Any]]], url: str) -> str:
    """Fetch the page at `url`."""
    return await _tool(*rc.deps, "fetch", url)


# failure_error_function=None: a tool's error leaves the run (by default the SDK would hand it
# to the model as text, and the job would never see it).
@function_tool(name_override="lookup", failure_error_function=None)
async def sdk_lookup(w: RunContextWrapper[tuple[AgentContext, dict[str, Any]]], q: str) -> str:
    """Look `q` up."""
    return await _tool(*w.context, "lookup", q)


@function_tool(name_override="fetch", failure_error_function=None)
async def sdk_fetch(w: RunContextWrapper[tuple[AgentContext, dict[str, Any]]], url: str) -> str:
    """Fetch the page at `url`."""
    return await _tool(*w.context, "fetch", url)
