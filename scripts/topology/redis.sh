#!/usr/bin/env bash
# scripts/topology/redis.sh: a Redis master, one replica and three Sentinels on loopback, for
# `make drill-redis-failover` (integration/cmd/drill). Debian's redis-server and redis-sentinel
# packages; nothing of it is shared with scripts/services.sh's Redis (127.0.0.1:6379).
#
#   server      listens on          data
#   master      127.0.0.1:6391      $DIR/6391  (no persistence: a failover is what keeps data)
#   replica     127.0.0.1:6392      $DIR/6392  (replicaof the master, asynchronous)
#   sentinels   127.0.0.1:26391-26393  $DIR/s263xx  monitor "idemq": quorum 2,
#               down-after-milliseconds 1000, failover-timeout 3000
#
# Usage: scripts/topology/redis.sh COMMAND
#
#   up                start the master, the replica and the sentinels from scratch (an earlier
#                     set is removed) and wait until the replica is in sync and every sentinel
#                     knows the replica and the two other sentinels.
#   pause-replication SIGSTOP the replica, then write 1 MB values "topology:ballast:<i>" to the
#                     master until the loopback socket buffers are full and the master keeps 8 MB
#                     of the replication stream in its own output buffer: what it writes from now on
#                     reaches the replica only if the master lives until the replica resumes.
#                     Keep the pause under down-after-milliseconds (1s), or the sentinels mark the
#                     replica down and will not promote it.
#   kill-master       SIGKILL the current master (the one the sentinels name), then SIGCONT the
#                     replica if paused: its replication link to the dead master is broken, so
#                     what the master had not sent it is gone (the window a failover loses).
#   wait-failover     wait until the sentinels name another master and it answers as a master.
#   restart-old       start the killed server again on its port, empty, and wait until the
#                     sentinels have made it a replica of the new master.
#   status            one line per server: port and role (master / replica / down), and the
#                     master the sentinels name.
#   down              stop every server and sentinel (SIGKILL) and remove their data.
#   env               the export lines: TOPOLOGY_REDIS_SENTINELS (comma-separated addresses),
#                     TOPOLOGY_REDIS_MASTER_NAME (idemq), TOPOLOGY_REDIS_ADDRS (both servers).
#
# Environment: TOPOLOGY_REDIS_PORTS ("6391 6392"), TOPOLOGY_REDIS_SENTINEL_PORTS
# ("26391 26392 26393").
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
read -r -a PORTS <<<"${TOPOLOGY_REDIS_PORTS:-6391 6392}"
read -r -a SPORTS <<<"${TOPOLOGY_REDIS_SENTINEL_PORTS:-26391 26392 26393}"
NAME=idemq
DIR=/var/tmp/idemq-topology/$(printf '%s' "$REPO" | cksum | cut -d' ' -f1)/redis

log() { printf '[redis-topology] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ensure_redis() {
  command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null && command -v redis-cli >/dev/null && return 0
  log "installing redis-server, redis-sentinel, redis-tools (apt-get)"
  # policy-rc.d or no systemd keeps the packages' own services from starting; stop them if they did
  local pkgs="redis-server redis-sentinel redis-tools"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null; } ||
    die "could not install $pkgs"
}

cli() { # PORT ARGS...
  local p=$1
  shift
  timeout 3 redis-cli -h 127.0.0.1 -p "$p" --no-raw "$@" 2>/dev/null
}
raw() { # PORT ARGS...
  local p=$1
  shift
  timeout 3 redis-cli -h 127.0.0.1 -p "$p" --raw "$@" 2>/dev/null
}

pid_of() { # NAME (a port, or s<port>)
  local f=$DIR/$1.pid
  [[ -s $f ]] || return 1
  local pid
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

role() { # PORT
  local r
  r=$(raw "$1" role | head -n 1) || { echo down; return; }
  case $r in master) echo master ;; slave) echo replica ;; "") echo down ;; *) echo "$r" ;; esac
}

# the master the sentinels name: "port" of the first sentinel that answers
named_master() {
  local sp a
  for sp in "${SPORTS[@]}"; do
    a=$(raw "$sp" sentinel get-master-addr-by-name "$NAME" | sed -n 2p) || continue
    [[ -n $a ]] && { echo "$a"; return 0; }
  done
  return 1
}

start_server() { # PORT [replicaof-PORT]
  local p=$1 of=${2:-}
  mkdir -p "$DIR/$p"
  cat >"$DIR/$p.conf" <<EOF
# scripts/topology/redis.sh
bind 127.0.0.1
port $p
daemonize yes
pidfile $DIR/$p.pid
logfile $DIR/$p.log
dir $DIR/$p
save ""
appendonly no
maxmemory-policy noeviction
repl-diskless-sync yes
repl-diskless-sync-delay 0
EOF
  [[ -n $of ]] && echo "replicaof 127.0.0.1 $of" >>"$DIR/$p.conf"
  redis-server "$DIR/$p.conf" || die "redis-server on $p did not start (see $DIR/$p.log)"
}

start_sentinel() { # PORT MASTER-PORT
  local sp=$1 mp=$2
  mkdir -p "$DIR/s$sp"
  cat >"$DIR/s$sp.conf" <<EOF
# scripts/topology/redis.sh (the sentinel rewrites this file)
bind 127.0.0.1
port $sp
daemonize yes
pidfile $DIR/s$sp.pid
logfile $DIR/s$sp.log
dir $DIR/s$sp
sentinel announce-ip 127.0.0.1
sentinel monitor $NAME 127.0.0.1 $mp 2
sentinel down-after-milliseconds $NAME 1000
sentinel failover-timeout $NAME 3000
sentinel parallel-syncs $NAME 1
EOF
  redis-sentinel "$DIR/s$sp.conf" || die "redis-sentinel on $sp did not start (see $DIR/s$sp.log)"
}

cmd_down() {
  [[ -d $DIR ]] || return 0
  local n pid
  for n in "${PORTS[@]}" "${SPORTS[@]/#/s}"; do
    if pid=$(pid_of "$n"); then
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$DIR"
  log "down"
}

cmd_up() {
  ensure_redis
  cmd_down
  local p
  for p in "${PORTS[@]}" "${SPORTS[@]}"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && die "127.0.0.1:$p is taken by another server"
  done
  mkdir -p "$DIR"
  start_server "${PORTS[0]}"
  start_server "${PORTS[1]}" "${PORTS[0]}"
  local i ok=""
  for i in $(seq 1 100); do
    [[ $(raw "${PORTS[1]}" info replication | tr -d '\r' | sed -n 's/^master_link_status://p') == up ]] && { ok=1; break; }
    sleep 0.1
  done
  [[ -n $ok ]] || die "the replica does not sync (see $DIR/${PORTS[1]}.log)"
  for p in "${SPORTS[@]}"; do start_sentinel "$p" "${PORTS[0]}"; done
  # every sentinel must know the replica and the other sentinels before a failover can work
  local sp want=$((${#SPORTS[@]} - 1))
  for i in $(seq 1 150); do
    ok=1
    for sp in "${SPORTS[@]}"; do
      local info
      info=$(raw "$sp" sentinel master "$NAME" | tr -d '\r' | paste - - | awk -F'\t' '{print $1"="$2}') || { ok=""; break; }
      [[ $(sed -n 's/^num-slaves=//p' <<<"$info") == 1 && $(sed -n 's/^num-other-sentinels=//p' <<<"$info") == "$want" ]] || { ok=""; break; }
    done
    [[ -n $ok ]] && break
    sleep 0.2
  done
  [[ -n $ok ]] || die "the sentinels do not see the replica and each other after 30s (see $DIR/s*.log)"
  log "up: master 127.0.0.1:${PORTS[0]}, replica 127.0.0.1:${PORTS[1]} in sync, sentinels ${SPORTS[*]} (quorum 2)"
}

other_port() { # PORT -> the other server's port
  [[ $1 == "${PORTS[0]}" ]] && echo "${PORTS[1]}" || echo "${PORTS[0]}"
}

ballast() { # PORT FIRST COUNT: COUNT SETs of 1 MB values, keys topology:ballast:<FIRST+i>, one round trip
  local mp=$1 first=$2 n=$3 i
  {
    for ((i = first; i < first + n; i++)); do
      local k="topology:ballast:$i"
      printf '*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1048576\r\n' "${#k}" "$k"
      head -c 1048576 /dev/zero
      printf '\r\n'
    done
  } | timeout 10 redis-cli -h 127.0.0.1 -p "$mp" --pipe >/dev/null 2>&1
}

cmd_pause() {
  local m mp r pid i omem=0
  m=$(named_master) || die "no sentinel names a master"
  mp=${m##*:}
  r=$(other_port "$mp")
  pid=$(pid_of "$r") || die "the replica $r is not running"
  kill -STOP "$pid"
  echo "$r" >"$DIR/paused"
  # A stopped replica still gets what fits in the loopback socket buffers (megabytes: the kernel
  # delivers them even after the master dies). Ballast fills them, 1 MB at a time, until the
  # master holds 8 MB of replication data in its own output buffer (CLIENT LIST omem; more than
  # the kernel's send buffer may still grow by): from then on
  # every write waits in the master's memory and dies with it.
  local i b=0
  for i in 8 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1; do
    ballast "$mp" "$b" "$i" || die "could not write ballast to the master"
    b=$((b + i))
    omem=$(raw "$mp" client list type replica | tr ' ' '\n' | sed -n 's/^omem=//p' | head -n 1)
    ((${omem:-0} >= 8388608)) && break
  done
  ((${omem:-0} >= 8388608)) || die "the master keeps under 8 MB for the stopped replica after $b MB of ballast"
  log "replica 127.0.0.1:$r (pid $pid) stopped, $b MB ballast written: the master's writes no longer reach it (omem $omem)"
}

cmd_kill_master() {
  local m p pid
  m=$(named_master) || die "no sentinel names a master"
  p=${m##*:}
  pid=$(pid_of "$p") || die "the master $p is not running"
  kill -KILL "$pid"
  echo "$p" >"$DIR/killed"
  log "master 127.0.0.1:$p (pid $pid) SIGKILLed"
  if [[ -s $DIR/paused ]]; then
    local r
    r=$(cat "$DIR/paused")
    rm -f "$DIR/paused"
    pid=$(pid_of "$r") && kill -CONT "$pid" && log "replica 127.0.0.1:$r resumed"
  fi
}

cmd_wait_failover() {
  local old i m
  old=$(cat "$DIR/killed" 2>/dev/null || echo "")
  for i in $(seq 1 300); do
    if m=$(named_master) && [[ ${m##*:} != "$old" && $(role "${m##*:}") == master ]]; then
      log "failover done: the sentinels name 127.0.0.1:${m##*:}"
      return 0
    fi
    sleep 0.1
  done
  die "no failover 30s after the kill (see $DIR/s*.log)"
}

cmd_restart_old() {
  local p
  p=$(cat "$DIR/killed" 2>/dev/null) || die "no killed master to restart"
  pid_of "$p" >/dev/null && die "127.0.0.1:$p runs already"
  rm -rf "${DIR:?}/$p"
  mkdir -p "$DIR/$p"
  # as the killed master's own config: the sentinels turn it into a replica of the new master
  redis-server "$DIR/$p.conf" || die "redis-server on $p did not restart"
  rm -f "$DIR/killed"
  local i
  for i in $(seq 1 300); do
    [[ $(role "$p") == replica ]] && { log "old master 127.0.0.1:$p restarted (empty) and made a replica by the sentinels"; return 0; }
    sleep 0.1
  done
  die "the restarted 127.0.0.1:$p is not a replica after 30s"
}

cmd_status() {
  local p
  for p in "${PORTS[@]}"; do echo "server $p $(role "$p")"; done
  echo "sentinels-name $(named_master || echo none)"
}

cmd_env() {
  local s="" sp
  for sp in "${SPORTS[@]}"; do s+="${s:+,}127.0.0.1:$sp"; done
  echo "export TOPOLOGY_REDIS_SENTINELS='$s'"
  echo "export TOPOLOGY_REDIS_MASTER_NAME='$NAME'"
  echo "export TOPOLOGY_REDIS_ADDRS='127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]}'"
}

case ${1:-} in
  up) cmd_up ;;
  pause-replication) cmd_pause ;;
  kill-master) cmd_kill_master ;;
  wait-failover) cmd_wait_failover ;;
  restart-old) cmd_restart_old ;;
  status) cmd_status ;;
  down) cmd_down ;;
  env) cmd_env ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
