"""Your agents: one module per agent, each with `async def run(ctx, payload) -> dict`.

User-owned: `copier update` never overwrites these modules.
"""
