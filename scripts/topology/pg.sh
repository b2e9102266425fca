#!/usr/bin/env bash
# scripts/topology/pg.sh: a Postgres primary with a streaming standby on loopback, for
# `make drill-pg-failover` (integration/cmd/drill). Debian's postgresql package, physical
# replication from pg_basebackup; nothing of it is shared with scripts/services.sh's Postgres.
#
#   server    listens on          data
#   primary   127.0.0.1:5441      $DIR/primary
#   standby   127.0.0.1:5442      $DIR/standby  (application_name standby1)
#
# Usage: scripts/topology/pg.sh COMMAND
#
#   up sync|async     initdb the primary (wal_level replica), create role and database idemq
#                     (password idemq), pg_basebackup the standby, start both, wait until the
#                     standby streams. sync: synchronous_standby_names = 'standby1' and
#                     synchronous_commit = on, so a COMMIT returns only once the standby has
#                     flushed it; async: neither. Always from scratch (an earlier pair is removed).
#   pause-replication stop (SIGSTOP) the standby's walreceiver: WAL stops reaching it. Under
#                     sync commits then wait; under async they go on, and what they write exists
#                     only on the primary (the window a failover loses).
#   kill-primary      SIGKILL the primary's postmaster and every backend of it (a crashed host).
#   promote           resume the walreceiver if paused, then pg_ctl promote the standby and wait
#                     until it accepts writes.
#   status            one line per server: role (primary / standby / down) and port.
#   down              stop both (immediate) and remove their data.
#   env               the export lines: TOPOLOGY_PG_DSN (multi-host, target_session_attrs=
#                     read-write), TOPOLOGY_PG_PRIMARY_DSN, TOPOLOGY_PG_STANDBY_DSN.
#
# Environment: TOPOLOGY_PG_PRIMARY_PORT (5441), TOPOLOGY_PG_STANDBY_PORT (5442).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
P1=${TOPOLOGY_PG_PRIMARY_PORT:-5441}
P2=${TOPOLOGY_PG_STANDBY_PORT:-5442}
# Outside the checkout: the postgres OS user must reach it whatever the checkout's parents'
# modes (a mode-0700 mktemp -d, a private home).
DIR=/var/tmp/idemq-topology/$(printf '%s' "$REPO" | cksum | cut -d' ' -f1)/pg
SOCK=$DIR/run
PSQL_DSN="user=idemq password=idemq dbname=idemq sslmode=disable connect_timeout=3"

log() { printf '[pg-topology] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

bindir() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [[ -n $d && -x $d/postgres && -x $d/pg_basebackup ]] || return 1
  echo "$d"
}

ensure_postgres() {
  bindir >/dev/null && return 0
  log "installing postgresql (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } ||
    die "could not install postgresql"
}

as_pg() {
  if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

psql_at() { # PORT SQL
  "$(bindir)/psql" "host=127.0.0.1 port=$1 $PSQL_DSN" -XAtq -v ON_ERROR_STOP=1 -c "$2"
}

postmaster_pid() { # DATADIR
  [[ -s $1/postmaster.pid ]] || return 1
  local pid
  pid=$(head -n 1 "$1/postmaster.pid")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

walreceiver_pid() {
  local pid
  pid=$(postmaster_pid "$DIR/standby") || return 1
  pgrep -P "$pid" -f 'walreceiver' | head -n 1
}

stop_one() { # DATADIR
  local pid
  if pid=$(postmaster_pid "$1"); then
    as_pg "$(bindir)/pg_ctl" -D "$1" -m immediate -w -t 30 stop >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
  fi
}

cmd_down() {
  [[ -d $DIR ]] || return 0
  local wr
  if wr=$(walreceiver_pid 2>/dev/null); then kill -CONT "$wr" 2>/dev/null || true; fi
  stop_one "$DIR/standby"
  stop_one "$DIR/primary"
  rm -rf "$DIR"
  log "down"
}

cmd_up() {
  local mode=${1:-}
  [[ $mode == sync || $mode == async ]] || die "up takes sync or async"
  ensure_postgres
  local bin
  bin=$(bindir)
  cmd_down
  for p in "$P1" "$P2"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && die "127.0.0.1:$p is taken by another server"
  done
  mkdir -p "$DIR" "$SOCK"
  ((EUID == 0)) && chown -R postgres:postgres "$DIR"
  local pwfile=$DIR/pw
  echo idemq >"$pwfile"
  ((EUID == 0)) && chown postgres "$pwfile"
  log "initdb the primary ($bin)"
  as_pg "$bin/initdb" -D "$DIR/primary" -U idemq --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 || { tail -n 20 "$DIR/initdb.log" >&2; die "initdb failed"; }
  cat >>"$DIR/primary/postgresql.conf" <<EOF

# --- scripts/topology/pg.sh ($mode)
listen_addresses = '127.0.0.1'
port = $P1
unix_socket_directories = '$SOCK'
max_connections = 200
wal_level = replica
max_wal_senders = 5
wal_keep_size = 512MB
hot_standby = on
synchronous_commit = on
EOF
  as_pg "$bin/pg_ctl" -D "$DIR/primary" -l "$DIR/primary.log" -w -t 60 start >/dev/null ||
    { tail -n 20 "$DIR/primary.log" >&2; die "the primary did not start"; }
  psql_at "$P1" "select 1" >/dev/null 2>&1 ||
    "$bin/psql" "host=127.0.0.1 port=$P1 user=idemq password=idemq dbname=postgres sslmode=disable" -XAtq \
      -c "create database idemq owner idemq" >/dev/null || die "could not create database idemq"
  log "pg_basebackup the standby"
  as_pg env PGPASSWORD=idemq "$bin/pg_basebackup" -h 127.0.0.1 -p "$P1" -U idemq -D "$DIR/standby" \
    -X stream -c fast >"$DIR/basebackup.log" 2>&1 || { tail -n 20 "$DIR/basebackup.log" >&2; die "pg_basebackup failed"; }
  as_pg bash -c "cat >>'$DIR/standby/postgresql.conf' <<EOF

# --- standby
port = $P2
primary_conninfo = 'host=127.0.0.1 port=$P1 user=idemq password=idemq application_name=standby1'
EOF
touch '$DIR/standby/standby.signal'"
  as_pg "$bin/pg_ctl" -D "$DIR/standby" -l "$DIR/standby.log" -w -t 60 start >/dev/null ||
    { tail -n 20 "$DIR/standby.log" >&2; die "the standby did not start"; }
  local i state=""
  for i in $(seq 1 60); do
    state=$(psql_at "$P1" "select sync_state from pg_stat_replication where application_name = 'standby1' and state = 'streaming'" 2>/dev/null || true)
    [[ -n $state ]] && break
    sleep 0.5
  done
  [[ -n $state ]] || die "the standby does not stream (see $DIR/standby.log)"
  if [[ $mode == sync ]]; then
    # only now: before the standby streams, every commit (CREATE DATABASE included) would wait
    psql_at "$P1" "alter system set synchronous_standby_names = 'standby1'" >/dev/null
    psql_at "$P1" "select pg_reload_conf()" >/dev/null
    for i in $(seq 1 20); do
      state=$(psql_at "$P1" "select sync_state from pg_stat_replication where application_name = 'standby1'")
      [[ $state == sync ]] && break
      sleep 0.25
    done
    [[ $state == sync ]] || die "the standby streams but is not synchronous ($state)"
  fi
  log "up: primary 127.0.0.1:$P1, standby 127.0.0.1:$P2 streaming ($state)"
}

cmd_pause() {
  local wr
  wr=$(walreceiver_pid) || die "no walreceiver on the standby"
  kill -STOP "$wr"
  log "walreceiver $wr stopped: WAL no longer reaches the standby"
}

cmd_kill_primary() {
  local pid
  pid=$(postmaster_pid "$DIR/primary") || die "the primary is not running"
  # the postmaster first, then its children: nothing of it may answer again
  kill -KILL "$pid"
  pkill -KILL -P "$pid" 2>/dev/null || true
  log "primary (postmaster $pid) SIGKILLed"
}

cmd_promote() {
  local wr
  if wr=$(walreceiver_pid 2>/dev/null); then kill -CONT "$wr" 2>/dev/null || true; fi
  as_pg "$(bindir)/pg_ctl" -D "$DIR/standby" -w -t 60 promote >/dev/null || die "pg_ctl promote failed"
  local i
  for i in $(seq 1 60); do
    [[ $(psql_at "$P2" "select pg_is_in_recovery()" 2>/dev/null) == f ]] && { log "standby promoted: 127.0.0.1:$P2 accepts writes"; return 0; }
    sleep 0.5
  done
  die "the promoted standby still refuses writes"
}

role() { # PORT
  local r
  r=$(psql_at "$1" "select pg_is_in_recovery()" 2>/dev/null) || { echo down; return; }
  [[ $r == t ]] && echo standby || echo primary
}

cmd_status() {
  echo "primary-port $P1 $(role "$P1")"
  echo "standby-port $P2 $(role "$P2")"
}

cmd_env() {
  echo "export TOPOLOGY_PG_DSN='postgres://idemq:idemq@127.0.0.1:$P1,127.0.0.1:$P2/idemq?sslmode=disable&target_session_attrs=read-write&connect_timeout=3'"
  echo "export TOPOLOGY_PG_PRIMARY_DSN='postgres://idemq:idemq@127.0.0.1:$P1/idemq?sslmode=disable&connect_timeout=3'"
  echo "export TOPOLOGY_PG_STANDBY_DSN='postgres://idemq:idemq@127.0.0.1:$P2/idemq?sslmode=disable&connect_timeout=3'"
}

case ${1:-} in
  up) cmd_up "${2:-}" ;;
  pause-replication) cmd_pause ;;
  kill-primary) cmd_kill_primary ;;
  promote) cmd_promote ;;
  status) cmd_status ;;
  down) cmd_down ;;
  env) cmd_env ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
