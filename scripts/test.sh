#!/usr/bin/env bash
# The one test command (`make test`). Usage: bash scripts/test.sh [pytest args...]
#
# 1. creates .venv and installs requirements-dev.txt (skipped when unchanged),
# 2. makes sure redis-server, prometheus and promtool are on PATH (tests start their own),
#    and that Debian's chromium is installed (the rendered console's browser tests),
# 3. starts a throwaway PostgreSQL on a free 127.0.0.1 port (stopped and deleted on exit),
# 4. runs `.venv/bin/python -m pytest tests --durations=25 "$@"` from the repo root (the 25
#    slowest tests are listed, to keep CI inside its time); exits with pytest's code.
#
# Exported for the tests: TEST_DATABASE_URL (superuser URL that can CREATE DATABASE),
# TEST_REDIS_SERVER (path of redis-server), TEST_PROMETHEUS, TEST_PROMTOOL, TEST_PG_HOST, TEST_PG_PORT, TEST_PG_BINDIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
export ROOT
cd "$ROOT"

# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"
# shellcheck source=scripts/services.sh
. "$ROOT/scripts/services.sh"

ensure_venv
ensure_redis_server
ensure_chromium
export TEST_REDIS_SERVER
TEST_REDIS_SERVER="$(command -v redis-server)"
ensure_prometheus
export TEST_PROMETHEUS TEST_PROMTOOL
TEST_PROMETHEUS="$(command -v prometheus)"
TEST_PROMTOOL="$(command -v promtool)"
start_postgres

rc=0
"$VENV/bin/python" -m pytest tests --durations=25 "$@" || rc=$?
exit "$rc"
