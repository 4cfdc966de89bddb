# copier-agent-worker: developer entry points.
SHELL := /bin/bash
.PHONY: test demo lint clean

# Run the template's test suite (creates .venv, starts throwaway PostgreSQL; needs redis-server,
# which scripts/services.sh installs with apt-get when run as root). Extra pytest args: ARGS="-k foo".
test:
	bash scripts/test.sh $(ARGS)

# Render examples/minimal.yml into .demo/minimal-worker and run it end to end (no services needed).
demo:
	bash scripts/demo.sh

lint:
	@ROOT="$(CURDIR)"; export ROOT; . scripts/venv.sh; ensure_venv
	.venv/bin/ruff check tests hooks
	.venv/bin/mypy

clean:
	rm -rf .venv .demo .pytest_cache .ruff_cache .mypy_cache
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
