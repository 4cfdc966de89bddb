"""Test doubles shipped with the service (template-owned: copier-agent-worker).

`scripted` is an agent whose behaviour per attempt is written in its payload, so a test
(or a chaos run in another process) can say "fail twice, then succeed" and run it through
the real runner, queue and database. Enable it with
`{{ package_name | upper }}_AGENT_MODULES='["{{ package_name }}.testing"]'`.

    {"script": ["error", "error", "ok"]}   fail twice, then succeed
    {"script": ["giveup"]}                 permanent failure
    {"script": ["retry_later:0.2", "ok"]}  ask to be retried after 0.2 s
    {"script": ["sleep:30", "ok"]}         block for 30 s (to be killed), then succeed

The step for attempt n is `script[n - 1]`; the last step repeats.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .agent import AgentConfig, AgentContext, GiveUp, RetryLater
from .catalog import DEFAULT_LANE, LANES, MAX_ATTEMPTS

NAME = "scripted"
# At least three attempts whatever the answers, so "fail, fail, succeed" scripts can pass.
CONFIG = AgentConfig(
    lane=DEFAULT_LANE, timeout_s=LANES[DEFAULT_LANE], max_attempts=max(3, MAX_ATTEMPTS)
)
EXAMPLE_PAYLOAD = {"script": ["error", "ok"]}


class ScriptedFailure(RuntimeError):
    """A retryable failure requested by the script."""


async def run(ctx: AgentContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Do what the script says for this attempt."""
    script = payload.get("script") or ["ok"]
    if not isinstance(script, list) or not all(isinstance(step, str) for step in script):
        raise GiveUp("script must be a list of step strings")
    step = script[min(ctx.attempt, len(script)) - 1]
    verb, _, arg = step.partition(":")
    ctx.log.info("scripted_step", step=step)
    if verb == "ok":
        return {"ok": True, "attempt": ctx.attempt}
    if verb == "error":
        raise ScriptedFailure(f"scripted failure on attempt {ctx.attempt}")
    if verb == "giveup":
        raise GiveUp(f"scripted give-up on attempt {ctx.attempt}")
    if verb == "retry_later":
        raise RetryLater(after_s=float(arg or 0))
    if verb == "sleep":
        await asyncio.sleep(float(arg or 0))
        return {"ok": True, "attempt": ctx.attempt, "slept_s": float(arg or 0)}
    raise GiveUp(f"unknown script step {step!r}")
