"""OpenAI Agents SDK agents, run durably with the service's guarantees (template-owned:
copier-agent-worker). Needs the `openai-agents` extra.

Inside an agent's `run(ctx, payload)`:

    result = await durable(agent, max_cost_usd=Decimal("0.05"), limit="llm").run(ctx, prompt)
    return {"answer": result.final_output}

runs the Agents SDK `agent` through `Runner.run` (its keyword arguments pass through; a
`run_config` given is kept, with its model provider wrapped) so that:

- every model request is a `ctx.paid_call` named `model:1`, `model:2`, ... in the order the run
  makes them: `max_cost_usd` is reserved before each request, the cost is priced from the
  response's usage and the model's name (the wrapped model's `model`, else the name the agent
  gave) through `pricing.cost_usd` (a model without a price counts the whole reservation), and
  with `limit` the request waits for its place under that named limit and settles the response's
  total tokens there;
- every function tool call is a `ctx.step` named `tool:N:TOOL`, where N numbers the run's tool
  calls in the order the model's responses listed them (found by the call's `call_id`), so the
  names are the same on every run whatever order the SDK runs them in; the result is stored as
  its JSON form (`pydantic_core.to_jsonable_python`), which a replay hands back;
- a re-run of the job replays each completed request (its stored `ModelResponse`, dumped and
  rebuilt with a pydantic `TypeAdapter`) and each completed tool call, and sends only what did
  not complete; a request in flight when a worker died parks the job `in_doubt`.

It uses the SDK's public interfaces: a `Model` whose `get_response` goes through
`ctx.paid_call`, handed out by a `ModelProvider` wrapping the run's provider (`RunConfig.
model_provider`) or set on a clone of the agent when the agent holds a `Model` object, and new
`FunctionTool` objects (`dataclasses.replace`) whose `on_invoke_tool` goes through `ctx.step`.

Errors pass through unchanged: an `openai` error from the request (with its `status_code`) is
left to `ctx.paid_call`, which decides charged or not; the service's control exceptions
(`RateLimited`, `PaidCallInDoubt`, waiting for an approval) leave the run as they are. An error
a tool call raises leaves the run as itself too, not as the SDK's `UserError`. A function tool
whose body uses the job itself (`ctx.paid_call`, `ctx.limit`) should be built with
`function_tool(failure_error_function=None)`: by default the SDK hands a tool's error to the model
as text, which would turn a `RateLimited` into a message instead of a deferral. Turn the
client's own retries off (`AsyncOpenAI(max_retries=0)`), and the SDK's tracing export when no
one reads it (`agents.set_tracing_disabled(True)`).

Limits: streaming (`Runner.run_streamed`) is not supported. Tools of handoff agents are not
steps (their model requests are paid calls when the handoff agent names its model by a string,
which the wrapped provider resolves); hosted tools (web search, ...) run inside the model request
and are paid with it. Call `durable(...).run` once per job, or give each run its own `name=`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from agents import (
    Agent,
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    RunResult,
    Tool,
    TResponseInputItem,
)
from agents.items import ModelResponse, TResponseStreamEvent
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ..agent import AGENT_LIMIT, AgentContext, AgentLimit
from ._run import DurableRun

__all__ = ["DurableAgent", "durable"]

_RESPONSE = TypeAdapter(ModelResponse)


def durable(
    agent: Agent[Any],
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
    """An Agents SDK agent and the paid-call settings of its durable runs."""

    agent: Agent[Any]
    max_cost_usd: Decimal
    limit: str | Literal[AgentLimit.AGENT] | None = AGENT_LIMIT
    tokens: int = 0
    prefix: str = ""

    async def run(
        self,
        ctx: AgentContext,
        prompt: str | list[TResponseInputItem],
        *,
        run_config: RunConfig | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """Run the agent once for this job, replaying what an earlier run of it completed."""
        run = DurableRun(ctx, self.max_cost_usd, self.limit, self.tokens, self.prefix)
        config = run_config or RunConfig()
        chosen = config.model
        config = dataclasses.replace(
            config,
            model=DurableModel(chosen, run) if isinstance(chosen, Model) else chosen,
            model_provider=DurableProvider(config.model_provider, run),
        )
        model = self.agent.model
        agent = self.agent.clone(
            model=DurableModel(model, run) if isinstance(model, Model) else model,
            tools=[durable_tool(tool, run) for tool in self.agent.tools],
        )
        try:
            return await Runner.run(agent, prompt, run_config=config, **kwargs)
        except _Escaped as escaped:
            raise escaped.error from None


class _Escaped(BaseException):
    """Carries an error out of a tool call past the SDK, which turns any `Exception` a tool
    raises into its own `UserError`: the run re-raises the original (a `RateLimited` must reach
    the runner as itself)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class DurableProvider(ModelProvider):
    """The run's model provider, handing out models whose requests are paid calls."""

    def __init__(self, wrapped: ModelProvider, run: DurableRun) -> None:
        self.wrapped = wrapped
        self.run = run

    def get_model(self, model_name: str | None) -> Model:
        return DurableModel(self.wrapped.get_model(model_name), self.run, model_name)

    async def aclose(self) -> None:
        await self.wrapped.aclose()


class DurableModel(Model):
    """A model whose every request is a paid call of the job."""

    def __init__(self, wrapped: Model, run: DurableRun, model_name: str | None = None) -> None:
        self.wrapped = wrapped
        self.run = run
        named = getattr(wrapped, "model", None)  # OpenAIResponsesModel, OpenAIChatCompletionsModel
        self.model_name = named if isinstance(named, str) else model_name

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        async def send() -> dict[str, Any]:
            response = await self.wrapped.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            return dump_response(response)

        stored = await self.run.paid_request(send, price=self._price, tokens_used=tokens_of)
        response = load_response(stored)
        self.run.number_tool_calls(
            item.call_id for item in response.output if isinstance(item, ResponseFunctionToolCall)
        )
        return response

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("a durable run makes plain requests: use Runner.run")

    async def close(self) -> None:
        await self.wrapped.close()

    def _price(self, stored: dict[str, Any]) -> Decimal:
        usage = load_response(stored).usage
        return self.run.cost_usd(
            self.model_name,
            {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "input_tokens_details": {"cached_tokens": usage.input_tokens_details.cached_tokens},
            },
            "openai",
        )


def durable_tool(tool: Tool, run: DurableRun) -> Tool:
    """`tool` with its every call a step of the job (function tools; others as they are)."""
    if not isinstance(tool, FunctionTool):
        return tool
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
        async def call() -> Any:
            return to_jsonable_python(await invoke(context, arguments))

        try:
            return await run.ctx.step(run.tool_step(context.tool_call_id, tool.name), call)
        except Exception as error:
            raise _Escaped(error) from error

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON (only the fields the SDK set, so a replay sends the same)."""
    dumped: dict[str, Any] = _RESPONSE.dump_python(response, mode="json", exclude_unset=True)
    return dumped


def load_response(stored: dict[str, Any]) -> ModelResponse:
    """The model response `dump_response` stored."""
    return _RESPONSE.validate_python(stored)


def tokens_of(stored: dict[str, Any]) -> int:
    """The tokens a stored response used, settled under the limit."""
    return int(load_response(stored).usage.total_tokens)
