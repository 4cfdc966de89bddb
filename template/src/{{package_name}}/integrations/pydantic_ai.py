"""Pydantic AI agents, run durably with the service's guarantees (template-owned:
copier-agent-worker). Needs the `pydantic-ai` extra.

Inside an agent's `run(ctx, payload)`:

    result = await durable(agent, max_cost_usd=Decimal("0.05"), limit="llm").run(ctx, prompt)
    return {"answer": result.output}

runs the Pydantic AI `agent` (any of `Agent.run`'s keyword arguments pass through) so that:

- every model request is a `ctx.paid_call` named `model:1`, `model:2`, ... in the order the run
  makes them: `max_cost_usd` is reserved before each request, the cost is priced from the
  response's own model, provider and usage through `pricing.cost_usd` (a model without a price
  counts the whole reservation), and with `limit` the request waits for its place under that
  named limit and settles the response's tokens there;
- every tool call is a `ctx.step` named `tool:N:TOOL`, where N numbers the tool calls of the run
  in the order the model's responses listed them (the call is found by its `tool_call_id`), so
  the names are the same on every run although Pydantic AI runs a response's tool calls
  concurrently; the tool's result is stored as its JSON form (`pydantic_core.to_jsonable_python`),
  which is what a replay hands back to the agent;
- a re-run of the job replays each completed request (its stored response, rebuilt with Pydantic
  AI's `ModelMessagesTypeAdapter`) and each completed tool call, and sends only what did not
  complete; a request that was in flight when a worker died parks the job `in_doubt`.

It uses Pydantic AI's public wrapper interfaces, as its own Temporal and DBOS integrations do: a
`WrapperModel` whose `request` goes through `ctx.paid_call`, a `WrapperToolset` whose
`call_tool` goes through `ctx.step`, installed for the run with `Agent.override` (per task, so
jobs sharing one module-level agent do not see each other's wrappers).

Errors pass through unchanged: a provider's `ModelHTTPError` (with its `status_code`) leaves the
request to `ctx.paid_call`, which decides charged or not; the service's own control exceptions
(`RateLimited`, `PaidCallInDoubt`, waiting for an approval) leave the agent run as they are.
Turn the provider client's own retries off (`AsyncOpenAI(max_retries=0)`): retries happen at the
job level, where they are recorded.

Limits: streaming (`run_stream`, an `event_stream_handler`) is not supported, a durable run
makes plain requests. Tools contributed by MCP servers are wrapped too (each call a step), but
their connections are opened on every run. Call `durable(...).run` once per job, or give each
run its own `name=` (its requests become `NAME:model:1`, ...): names are unique within a job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic_ai import Agent, RunContext
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, ToolCallPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from ..agent import AGENT_LIMIT, AgentContext, AgentLimit
from ._run import DurableRun

__all__ = ["DurableAgent", "durable"]


def durable(
    agent: Agent[Any, Any],
    *,
    max_cost_usd: Decimal | str | int,
    limit: str | Literal[AgentLimit.AGENT] | None = AGENT_LIMIT,
    tokens: int = 0,
    name: str | None = None,
) -> DurableAgent:
    """`agent`, ready to run durably inside a job: `await durable(agent, ...).run(ctx, prompt)`.

    `max_cost_usd` is reserved for each model request; `limit` names the limit each request
    waits under (by default the agent's own, the answer `limit`; None for none), reserving
    `tokens` (an estimate) and settling the response's real tokens.
    """
    return DurableAgent(agent, Decimal(max_cost_usd), limit, tokens, f"{name}:" if name else "")


@dataclass(frozen=True)
class DurableAgent:
    """A Pydantic AI agent and the paid-call settings of its durable runs."""

    agent: Agent[Any, Any]
    max_cost_usd: Decimal
    limit: str | Literal[AgentLimit.AGENT] | None = AGENT_LIMIT
    tokens: int = 0
    prefix: str = ""

    async def run(
        self, ctx: AgentContext, prompt: Any = None, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """Run the agent once for this job, replaying what an earlier run of it completed."""
        run = DurableRun(ctx, self.max_cost_usd, self.limit, self.tokens, self.prefix)
        model = kwargs.pop("model", None) or self.agent.model
        if model is None:
            raise ValueError("the agent has no model: give it one, or pass model=... to run")
        toolsets: Sequence[AbstractToolset[Any]] = [
            *self.agent.toolsets,
            *(kwargs.pop("toolsets", None) or ()),
        ]
        with self.agent.override(
            model=DurableModel(model, run),
            toolsets=[DurableToolset(toolset, run) for toolset in toolsets],
            tools=[],  # the agent's own tools are in its function toolset, wrapped above
        ):
            return await self.agent.run(prompt, **kwargs)


class DurableModel(WrapperModel):
    """A model whose every request is a paid call of the job."""

    def __init__(self, wrapped: Model | str, run: DurableRun) -> None:
        super().__init__(wrapped)
        self.run = run

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        async def send() -> dict[str, Any]:
            response = await self.wrapped.request(
                messages, model_settings, model_request_parameters
            )
            return dump_response(response)

        stored = await self.run.paid_request(send, price=self._price, tokens_used=tokens_of)
        response = load_response(stored)
        self.run.number_tool_calls(
            part.tool_call_id for part in response.parts if isinstance(part, ToolCallPart)
        )
        return response

    def _price(self, stored: dict[str, Any]) -> Decimal:
        response = load_response(stored)
        usage = response.usage
        return self.run.cost_usd(
            response.model_name,
            {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            },
            response.provider_name,
        )


@dataclass
class DurableToolset(WrapperToolset[Any]):
    """A toolset whose every tool call is a step of the job."""

    run: DurableRun

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        async def call() -> Any:
            result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            return to_jsonable_python(result)

        step = self.run.tool_step(ctx.tool_call_id or f"{name}:{ctx.run_step}", name)
        return await self.run.ctx.step(step, call)


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON, the way Pydantic AI stores message histories."""
    dumped: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    return dumped


def load_response(stored: dict[str, Any]) -> ModelResponse:
    """The model response `dump_response` stored."""
    message = ModelMessagesTypeAdapter.validate_python([stored])[0]
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a stored model request is not a model response: {message.kind}")
    return message


def tokens_of(stored: dict[str, Any]) -> int:
    """The tokens a stored response used (input and output), settled under the limit."""
    usage = load_response(stored).usage
    return int(usage.input_tokens + usage.output_tokens)
