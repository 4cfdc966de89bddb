# shellcheck shell=bash
# Test services for scripts/test.sh. Source this file, then call:
#
#   ensure_redis_server   make `redis-server` available on PATH (apt-get installs it when
#                         missing and we are root). Starts nothing: the tests start their
#                         own redis-server processes on free ports.
#   ensure_prometheus     make `prometheus` and `promtool` available on PATH (apt-get installs
#                         Debian's prometheus package when missing and we are root). Starts
#                         nothing: the tests start their own Prometheus on a free port.
#   ensure_chromium       make /usr/bin/chromium available for the console's browser tests
#                         (apt-get installs Debian's `chromium` when missing and we are root;
#                         Playwright drives it and never downloads a browser of its own).
#   ensure_tmux           make `tmux` available on PATH for the prompt tests (tests/test_prompts.py
#                         drives `copier copy` in an 80-column terminal; apt-get installs it when
#                         missing and we are root).
#   start_postgres        throwaway PostgreSQL cluster in a temp dir, run as an unprivileged
#                         user, on a free 127.0.0.1 port; exports TEST_DATABASE_URL (superuser,
#                         can CREATE DATABASE) plus TEST_PG_HOST/TEST_PG_PORT/TEST_PG_BINDIR.
#                         Registers stop_postgres on EXIT (and INT/TERM/HUP).
#   stop_postgres         stop that cluster and delete its temp dir (idempotent).
#
# Knobs: PG_OS_USER (user PostgreSQL runs as when we are root; default postgres),
#        PG_BINDIR (dir with initdb/pg_ctl/postgres), PG_TEST_TMPDIR (parent of the temp dir;
#        default /tmp, which any user can traverse).

_svc_log() { echo "[services] $*" >&2; }
_svc_die() { echo "error: $*" >&2; exit 1; }

# ---- cleanup registry: everything registered runs once, in reverse order, on exit ----------
_SVC_CLEANUPS=()
_svc_on_exit() {
  local i
  for ((i = ${#_SVC_CLEANUPS[@]} - 1; i >= 0; i--)); do
    "${_SVC_CLEANUPS[$i]}" || true
  done
  _SVC_CLEANUPS=()
}
_svc_register_cleanup() {
  local f
  for f in "${_SVC_CLEANUPS[@]}"; do [ "$f" = "$1" ] && return 0; done
  _SVC_CLEANUPS+=("$1")
  if [ -z "${_SVC_TRAPS_SET:-}" ]; then
    trap _svc_on_exit EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    _SVC_TRAPS_SET=1
  fi
}

_svc_is_root() { [ "$(id -u)" = 0 ]; }

_svc_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# ---- apt-get install that starts no service -------------------------------------------------
# Debian's maintainer scripts start services through invoke-rc.d / deb-systemd-invoke, both of
# which obey /usr/sbin/policy-rc.d: exit code 101 means "do not start". We add one for the
# duration of the install (only if none exists) and remove it again.
_SVC_POLICY_CREATED=""
_svc_remove_policy() {
  if [ -n "$_SVC_POLICY_CREATED" ]; then
    rm -f /usr/sbin/policy-rc.d
    _SVC_POLICY_CREATED=""
  fi
}
_svc_apt_install() {
  _svc_is_root || _svc_die "installing $* needs root (apt-get)"
  command -v apt-get >/dev/null 2>&1 || _svc_die "apt-get not found; install $* by hand"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    _svc_register_cleanup _svc_remove_policy
    printf '#!/bin/sh\n# temporary, from scripts/services.sh: start no service during apt-get install\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    _SVC_POLICY_CREATED=1
  fi
  local log rc=0
  log="$(mktemp)"
  _svc_log "apt-get install -y $*"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >"$log" 2>&1; then
    _svc_log "install failed; running apt-get update and retrying"
    { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; } >>"$log" 2>&1 || rc=$?
  fi
  _svc_remove_policy
  if [ "$rc" != 0 ]; then
    tail -n 30 "$log" >&2
    rm -f "$log"
    _svc_die "apt-get install $* failed"
  fi
  rm -f "$log"
}

# apt-get install PACKAGE, then stop the PROCESS processes that appeared: belt and braces, in
# case the package started its service anyway (policy-rc.d already present and permissive,
# systemd ignoring it, ...). Tests start their own servers.
_svc_install_stopping() {
  local package="$1" process="$2" before after pid
  before=" $(pgrep -x "$process" | tr "\n" " " || true) "
  _svc_apt_install "$package"
  after="$(pgrep -x "$process" || true)"
  for pid in $after; do
    case "$before" in *" $pid "*) continue ;; esac
    _svc_log "stopping $process pid $pid started by the package install"
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl stop "$process.service" >/dev/null 2>&1 || true
    fi
    kill "$pid" 2>/dev/null || true
  done
}

# ---- redis-server ---------------------------------------------------------------------------
ensure_redis_server() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  if ! _svc_is_root; then
    echo "error: redis-server not found on PATH; install it (e.g. sudo apt-get install -y redis-server) and re-run" >&2
    exit 1
  fi
  _svc_install_stopping redis-server redis-server
  command -v redis-server >/dev/null 2>&1 || _svc_die "redis-server still not on PATH after apt-get install"
}

# ---- prometheus and promtool ----------------------------------------------------------------
ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    return 0
  fi
  if ! _svc_is_root; then
    echo "error: prometheus/promtool not found on PATH; install them (e.g. sudo apt-get install -y prometheus) and re-run" >&2
    exit 1
  fi
  _svc_install_stopping prometheus prometheus
  command -v promtool >/dev/null 2>&1 || _svc_die "promtool still not on PATH after apt-get install"
}

# ---- chromium (the rendered console's browser tests) -----------------------------------------
ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then
    return 0
  fi
  if ! _svc_is_root; then
    echo "error: /usr/bin/chromium not found; install it (e.g. sudo apt-get install -y chromium) and re-run" >&2
    exit 1
  fi
  _svc_apt_install chromium
  [ -x /usr/bin/chromium ] || _svc_die "/usr/bin/chromium still missing after apt-get install"
}

# ---- pgbouncer (the integration tier of one answer set runs through it) ----------------------
ensure_pgbouncer() {
  if [ -x /usr/sbin/pgbouncer ]; then
    return 0
  fi
  if ! _svc_is_root; then
    echo "error: /usr/sbin/pgbouncer not found; install it (e.g. sudo apt-get install -y pgbouncer) and re-run" >&2
    exit 1
  fi
  _svc_install_stopping pgbouncer pgbouncer
  [ -x /usr/sbin/pgbouncer ] || _svc_die "/usr/sbin/pgbouncer still missing after apt-get install"
}

# ---- tmux (the real Copier prompts in an 80-column terminal) -------------------------------------
ensure_tmux() {
  if command -v tmux >/dev/null 2>&1; then
    return 0
  fi
  if ! _svc_is_root; then
    echo "error: tmux not found on PATH; install it (e.g. sudo apt-get install -y tmux) and re-run" >&2
    exit 1
  fi
  _svc_apt_install tmux
  command -v tmux >/dev/null 2>&1 || _svc_die "tmux still not on PATH after apt-get install"
}

# ---- PostgreSQL -----------------------------------------------------------------------------
_svc_pg_bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then
    echo "$PG_BINDIR"
    return 0
  fi
  local d
  # Resolve symlinks (e.g. /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl).
  if command -v pg_ctl >/dev/null 2>&1; then
    d="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then
      echo "$d"
      return 0
    fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# Run a command as the PostgreSQL OS user, from inside the cluster's temp dir (the caller's cwd
# may not be readable by that user).
_svc_as_pg() {
  if _svc_is_root; then
    (cd "$_SVC_PG_TMP" && runuser -u "$_SVC_PG_USER" -- "$@")
  else
    (cd "$_SVC_PG_TMP" && "$@")
  fi
}

start_postgres() {
  if [ -n "${_SVC_PG_TMP:-}" ]; then
    return 0 # already running (idempotent)
  fi
  local bindir
  if ! bindir="$(_svc_pg_bindir)"; then
    if _svc_is_root; then
      _svc_apt_install postgresql
      bindir="$(_svc_pg_bindir)" || _svc_die "PostgreSQL binaries not found after apt-get install"
    else
      _svc_die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; set PG_BINDIR or install postgresql"
    fi
  fi

  if _svc_is_root; then
    _SVC_PG_USER="${PG_OS_USER:-postgres}"
    if ! id -u "$_SVC_PG_USER" >/dev/null 2>&1; then
      _svc_log "creating system user $_SVC_PG_USER (PostgreSQL refuses to run as root)"
      useradd --system --no-create-home --shell /usr/sbin/nologin "$_SVC_PG_USER"
    fi
  else
    _SVC_PG_USER="$(id -un)"
  fi

  _SVC_PG_TMP="$(mktemp -d "${PG_TEST_TMPDIR:-/tmp}/agentworker-pg.XXXXXX")"
  _svc_register_cleanup stop_postgres
  mkdir -p "$_SVC_PG_TMP/sock"
  if _svc_is_root; then
    chown -R "$_SVC_PG_USER" "$_SVC_PG_TMP"
  fi
  chmod 700 "$_SVC_PG_TMP"

  local data="$_SVC_PG_TMP/data" log="$_SVC_PG_TMP/postgres.log"
  if ! _svc_as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync \
    >"$_SVC_PG_TMP/initdb.log" 2>&1; then
    cat "$_SVC_PG_TMP/initdb.log" >&2
    _svc_die "initdb failed"
  fi
  cat >>"$data/postgresql.conf" <<CONF

# --- scripts/services.sh: throwaway test cluster ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$_SVC_PG_TMP/sock'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  # The costs benchmark counts statements with pg_stat_statements (a smoke run in the suites).
  if [ -f "$bindir/../lib/pg_stat_statements.so" ]; then
    echo "shared_preload_libraries = 'pg_stat_statements'" >>"$data/postgresql.conf"
  fi
  cat >"$data/pg_hba.conf" <<'HBA'
local all all              trust
host  all all 127.0.0.1/32 trust
host  all all ::1/128      trust
HBA

  local port attempt started=""
  for attempt in 1 2 3 4 5; do
    port="$(_svc_free_port)"
    if _svc_as_pg "$bindir/pg_ctl" -D "$data" -l "$log" -o "-p $port" -w -t 60 start >/dev/null 2>&1; then
      started=1
      break
    fi
    if grep -q "could not bind\|Address already in use" "$log" 2>/dev/null; then
      _svc_log "port $port taken; retrying (attempt $attempt)"
      continue
    fi
    break
  done
  if [ -z "$started" ]; then
    tail -n 30 "$log" >&2 || true
    _svc_die "PostgreSQL did not start"
  fi
  # pg_ctl -w already waited for "ready"; double-check over TCP as the tests will connect.
  local i
  for i in $(seq 1 50); do
    if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres; then
      break
    fi
    [ "$i" = 50 ] && _svc_die "PostgreSQL on 127.0.0.1:$port not ready"
    sleep 0.2
  done

  export TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres"
  export TEST_PG_HOST=127.0.0.1 TEST_PG_PORT="$port" TEST_PG_BINDIR="$bindir"
  _svc_log "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') ready at $TEST_DATABASE_URL (data in $_SVC_PG_TMP)"
}

# True while pid runs (a zombie waiting for its parent to reap it does not count).
_svc_pid_alive() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

stop_postgres() {
  [ -n "${_SVC_PG_TMP:-}" ] || return 0
  local bindir data="$_SVC_PG_TMP/data" pid=""
  bindir="$(_svc_pg_bindir)" || bindir=""
  if [ -f "$data/postmaster.pid" ]; then
    pid="$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)"
    if [ -n "$bindir" ]; then
      _svc_as_pg "$bindir/pg_ctl" -D "$data" -m fast -w -t 20 stop >/dev/null 2>&1 ||
        _svc_as_pg "$bindir/pg_ctl" -D "$data" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
    fi
    if [ -n "$pid" ] && _svc_pid_alive "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    # pg_ctl returns once postmaster.pid is gone; wait for the process itself to end too.
    local i
    for i in $(seq 1 50); do
      [ -n "$pid" ] && _svc_pid_alive "$pid" || break
      sleep 0.1
    done
  fi
  rm -rf "$_SVC_PG_TMP"
  _SVC_PG_TMP=""
  unset TEST_DATABASE_URL TEST_PG_HOST TEST_PG_PORT TEST_PG_BINDIR
}
