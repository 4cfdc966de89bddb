"""A model call's cost from the provider's usage, in Decimal (template-owned:
copier-agent-worker).

Prices come from the `genai-prices` package (its bundled price table; it fetches nothing
unless asked). `cost_usd(model, usage)` takes the usage object or dict an SDK returns:

- OpenAI Chat Completions: `prompt_tokens` (cached ones included), `completion_tokens`,
  `prompt_tokens_details.cached_tokens`;
- OpenAI Responses: `input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`;
- Anthropic Messages: `input_tokens` (cache tokens NOT included), `output_tokens`,
  `cache_read_input_tokens`, `cache_creation_input_tokens`.

`ctx.paid_call` prices an SDK result by itself when `cost_usd` is left out
(`result_cost_usd`: the result's own `model` and `usage`); pass `cost_usd=lambda r:
pricing.cost_usd(MODEL, r.usage)` for anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from genai_prices import Usage, calc_price


class UnknownPrice(LookupError):
    """The price table has no price for this model (or provider)."""


def cost_usd(model: str, usage: Any, *, provider: str | None = None) -> Decimal:
    """The cost of one call of `model` with `usage`, in US dollars.

    >>> cost_usd("gpt-4o", {"prompt_tokens": 1000, "completion_tokens": 500}, provider="openai")
    Decimal('0.0075')
    """
    try:
        price = calc_price(usage_of(usage), model, provider_id=provider)
    except LookupError as exc:
        raise UnknownPrice(f"no price for model {model!r}: {exc}") from exc
    return Decimal(price.total_price)


def result_cost_usd(result: Any) -> Decimal:
    """The cost of an OpenAI (Chat Completions, Responses) or Anthropic (Messages) result,
    from its own `model` and `usage` (objects or their JSON dicts).

    Raises UnknownPrice when the result names no model or usage, or the table has no price.

    >>> r = {"object": "chat.completion", "model": "gpt-4o",
    ...      "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}
    >>> result_cost_usd(r)
    Decimal('0.0075')
    """
    get = _getter(result)
    model, usage = get("model"), get("usage")
    if not isinstance(model, str) or usage is None:
        raise UnknownPrice(
            f"a result of type {type(result).__name__} names no model and usage to price; "
            "pass cost_usd= to ctx.paid_call"
        )
    return cost_usd(model, usage, provider=provider_of(result))


def provider_of(result: Any) -> str | None:
    """Which provider's API shape a result has: "anthropic", "openai", or None.

    >>> provider_of({"type": "message", "role": "assistant"})
    'anthropic'
    >>> provider_of({"object": "response"})
    'openai'
    """
    get = _getter(result)
    if get("type") == "message":
        return "anthropic"
    if get("object") in ("chat.completion", "response"):
        return "openai"
    return None


def tokens_used(result: Any) -> int | None:
    """All tokens a result's usage counts (input, cached and cache writes included,
    output), or None when it has no usage: what a named limit's `tokens_per_minute` settles.

    >>> tokens_used({"usage": {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100}})
    100
    >>> tokens_used({"usage": {"input_tokens": 5, "cache_read_input_tokens": 20}})
    25
    """
    usage = _getter(result)("usage")
    if usage is None:
        return None
    counted = usage_of(usage)
    return int(counted.input_tokens or 0) + int(counted.output_tokens or 0)


def usage_of(usage: Any) -> Usage:
    """genai-prices' Usage from an OpenAI or Anthropic usage object or dict; Anthropic's
    cache reads and writes are added to the input tokens, where genai-prices counts them.

    >>> u = usage_of({"input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 5})
    >>> (u.input_tokens, u.cache_read_tokens, u.output_tokens)
    (1000, 900, 5)
    """
    get = _getter(usage)
    if get("prompt_tokens") is not None:  # OpenAI Chat Completions
        details = _getter(get("prompt_tokens_details") or {})
        return Usage(
            input_tokens=get("prompt_tokens"),
            cache_read_tokens=details("cached_tokens") or 0,
            output_tokens=get("completion_tokens") or 0,
        )
    cache_read = get("cache_read_input_tokens")
    cache_write = get("cache_creation_input_tokens")
    if cache_read is not None or cache_write is not None:  # Anthropic Messages
        return Usage(
            input_tokens=(get("input_tokens") or 0) + (cache_read or 0) + (cache_write or 0),
            cache_read_tokens=cache_read or 0,
            cache_write_tokens=cache_write or 0,
            output_tokens=get("output_tokens") or 0,
        )
    details = _getter(get("input_tokens_details") or {})  # OpenAI Responses (or plain)
    return Usage(
        input_tokens=get("input_tokens") or 0,
        cache_read_tokens=details("cached_tokens") or 0,
        output_tokens=get("output_tokens") or 0,
    )


def _getter(source: Any) -> Any:
    if isinstance(source, Mapping):
        return source.get
    return lambda name: getattr(source, name, None)
