"""The bookkeeping one durable framework run shares between its model and its tools
(template-owned: copier-agent-worker).

It names each model request and each tool call so that a re-run of the job names them the
same way: requests by their order in the run, tool calls by their order in the model response
that asked for them (found by the call's id), whatever order the framework runs them in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import structlog

from .. import pricing
from ..agent import AGENT_LIMIT, AgentContext, AgentLimit
from ..steps import NAME_MAX

log = structlog.get_logger("integrations")


@dataclass
class DurableRun:
    """One run of a framework agent inside one run of a job."""

    ctx: AgentContext
    max_cost_usd: Decimal
    limit: str | Literal[AgentLimit.AGENT] | None = AGENT_LIMIT
    tokens: int = 0
    prefix: str = ""
    requests: int = 0
    tool_calls: int = 0
    # The number of each tool call the model asked for, by its call id.
    numbers: dict[str, int] = field(default_factory=dict)

    def next_request(self) -> str:
        """The name of the run's next model request: `model:1`, `model:2`, ..."""
        self.requests += 1
        return f"{self.prefix}model:{self.requests}"

    def number_tool_calls(self, call_ids: Iterable[str]) -> None:
        """Number the tool calls of a model response in the order the model gave them."""
        for call_id in call_ids:
            self.tool_calls += 1
            self.numbers[call_id] = self.tool_calls

    def tool_step(self, call_id: str, tool: str) -> str:
        """The step name of tool call `call_id`: `tool:N:NAME`, N from the model response; a
        call no response of this run asked for (one from the message history) is named by its
        id, which the history keeps the same on every run."""
        number = self.numbers.get(call_id)
        name = f"{self.prefix}tool:{number if number is not None else call_id}:{tool}"
        return name[:NAME_MAX]

    async def paid_request(
        self,
        send: Callable[[], Awaitable[dict[str, Any]]],
        *,
        price: Callable[[dict[str, Any]], Decimal],
        tokens_used: Callable[[dict[str, Any]], int],
    ) -> dict[str, Any]:
        """Send one model request through `ctx.paid_call` (or get its stored JSON back)."""
        result: dict[str, Any] = await self.ctx.paid_call(
            self.next_request(),
            send,
            max_cost_usd=self.max_cost_usd,
            cost_usd=price,
            limit=self.limit,
            tokens=self.tokens,
            tokens_used=tokens_used,
        )
        return result

    def cost_usd(
        self, model: str | None, usage: Mapping[str, Any], provider: str | None
    ) -> Decimal:
        """The priced cost of one request; the whole reservation when the model has no price
        (never zero: an unknown cost counts as the most it could have been)."""
        if model:
            try:
                return pricing.cost_usd(model, usage, provider=provider)
            except pricing.UnknownPrice:
                pass
        log.warning(
            "model_price_unknown",
            model=model,
            provider=provider,
            counted_usd=str(self.max_cost_usd),
        )
        return self.max_cost_usd
