# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/demo.sh.
#   ensure_venv   create $VENV (default $ROOT/.venv) if missing and install
#                 requirements-dev.txt into it; skipped when a stamp file says the
#                 same requirements were already installed with the same Python.
# Needs ROOT (the repo root). Honours PYTHON (default python3) and VENV.

ensure_venv() {
  : "${ROOT:?ROOT must be set to the repository root}"
  VENV="${VENV:-$ROOT/.venv}"
  local py="${PYTHON:-python3}"
  local req="$ROOT/requirements-dev.txt"
  local stamp="$VENV/.requirements-dev.stamp"

  if ! command -v "$py" >/dev/null 2>&1; then
    echo "error: $py not found (set PYTHON=/path/to/python3.11+)" >&2
    exit 1
  fi
  # A venv whose interpreter no longer runs (moved checkout, Python removed) is rebuilt.
  if [ -e "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "[venv] $VENV is broken; recreating it" >&2
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[venv] creating $VENV" >&2
    "$py" -m venv "$VENV"
  fi

  local want
  want="$( { sha256sum "$req" | cut -d' ' -f1; "$VENV/bin/python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi

  echo "[venv] installing requirements-dev.txt into $VENV (first run takes ~30s)" >&2
  local log="$VENV/pip-install.log"
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$req" >"$log" 2>&1; then
    # The machine's local find-links/index dirs print harmless 'is ignored' warnings: drop them.
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
    echo "error: pip install -r requirements-dev.txt failed (full log: $log)" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
}
