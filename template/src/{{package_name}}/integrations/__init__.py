"""Agent frameworks run durably, with the service's guarantees (template-owned:
copier-agent-worker).

Each integration is an optional extra and is imported only by the agents that use it:

- `integrations.pydantic_ai` (`pip install -e '.[pydantic-ai]'`): `durable(agent).run(ctx, prompt)`
  runs a Pydantic AI `Agent`;
- `integrations.openai_agents` (`pip install -e '.[openai-agents]'`): the same for an OpenAI
  Agents SDK `Agent` through its `Runner`.

In both, every model request is a `ctx.paid_call` named in order (`model:1`, `model:2`, ...),
reserved, priced from its usage and counted against a named limit, and every tool call is a
`ctx.step` (`tool:1:NAME`, ...). A job that runs again (a retry, a crash, a resume after
waiting) replays what completed from the record and sends only what did not; a request that
was in flight when a worker died parks the job `in_doubt`. The shared bookkeeping is in
`_run.py`, which imports no framework.
"""
