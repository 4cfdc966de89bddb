#!/usr/bin/env bash
# The one test command (`make test`). Usage: bash scripts/test.sh [pytest args...]
#
# 1. creates .venv and installs requirements-dev.txt (skipped when unchanged),
# 2. makes sure redis-server, prometheus and promtool are on PATH (tests start their own),
#    that Debian's chromium is installed (the rendered console's browser tests) and tmux (the
#    prompts in an 80-column terminal) and pgbouncer (one answer set's suite runs through it),
# 3. starts a throwaway PostgreSQL on a free 127.0.0.1 port (stopped and deleted on exit),
# 4. runs the suite from the repo root: with arguments, `pytest tests --durations=25 "$@"`;
#    without, the quick tests in two processes (`-m "not slow" -n 2`) and then the slow ones
#    two at a time (`-m slow -n 2 --dist loadgroup`), printing each pass's time (the 25
#    slowest tests of each are listed, to keep CI inside its time); exits non-zero when
#    either pass failed.
#
# Exported for the tests: TEST_DATABASE_URL (superuser URL that can CREATE DATABASE),
# TEST_REDIS_SERVER (path of redis-server), TEST_PROMETHEUS, TEST_PROMTOOL, TEST_TMUX, TEST_PG_HOST, TEST_PG_PORT, TEST_PG_BINDIR,
# TEST_PGBOUNCER (path of pgbouncer; the generated suites start their own).
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
ensure_tmux
export TEST_TMUX
TEST_TMUX="$(command -v tmux)"
export TEST_REDIS_SERVER
TEST_REDIS_SERVER="$(command -v redis-server)"
ensure_prometheus
ensure_pgbouncer
export TEST_PGBOUNCER=/usr/sbin/pgbouncer
export TEST_PROMETHEUS TEST_PROMTOOL
TEST_PROMETHEUS="$(command -v prometheus)"
TEST_PROMTOOL="$(command -v promtool)"
start_postgres

rc=0
if [ "$#" -gt 0 ]; then
  "$VENV/bin/python" -m pytest tests --durations=25 "$@" || rc=$?
  exit "$rc"
fi
# With no arguments, two passes: the quick tests (renders, lint, type checks, questions,
# updates), which compute more than they wait, in two processes; then the slow ones two at a
# time (`-n 2 --dist loadgroup`: each runs a generated suite in its own three processes, and
# the renders of one answer set are one xdist group, so two installs of one package never
# race). Two at a time was held back by one leaked Redis connection (a ResourceWarning under
# load); `connections.open_pool` closes it. Both passes always run.
started=$SECONDS
"$VENV/bin/python" -m pytest tests -m "not slow" -n 2 --durations=25 || rc=$?
quick=$((SECONDS - started))
"$VENV/bin/python" -m pytest tests -m slow -n 2 --dist loadgroup --durations=25 || rc=$?
echo "[test] quick tests ${quick}s, slow tests $((SECONDS - started - quick))s, in all $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s" >&2
exit "$rc"
