#!/usr/bin/env bash
# scripts/services.sh: the local services that idemq's integration tests, examples and CI use,
# run without Docker (docker-compose.yml at the repo root starts the same set for Docker users).
#
#   service    how it runs                                                 listens on (127.0.0.1)
#   postgres   Debian package `postgresql`; our own cluster in the cache    5432
#   redis      Debian package `redis-server`                                6379
#   kafka      Kafka 4.1.1 (KRaft, one node) from Maven Central jars        9092 (controller 9093),
#              (the broker and kafka-tools: kafka-topics, kafka-consumer-   9094 SASL_SSL (SCRAM)
#              groups; see kafka_pom)
#   rocketmq   RocketMQ 5.3.3 NameServer + broker from Maven Central jars   9876, 10911
#   pgbouncer  Debian package `pgbouncer` in front of postgres:             6432
#              pool_mode = transaction, default_pool_size = 4 (the tests that run idemq
#              behind a transaction pooler; see docs/operations.md)
#
# Usage: scripts/services.sh COMMAND [SERVICE...]      (no SERVICE means all five)
#
#   up [svc...]      First asks each service on its port whether it already answers a real
#                    request (SQL query, PING, Kafka ApiVersions, NameServer cluster info
#                    listing our broker, which answers too). One that answers is used as it is
#                    and nothing is installed for it: ours ("already running"), or a server
#                    this script did not start, for example from `docker compose up -d`
#                    ("reusing"). Only for the others it installs whatever is missing
#                    (apt-get: postgresql, redis-server, a Java 17 JRE, maven; Maven Central:
#                    the broker jars), starts them in parallel and waits until each answers.
#                    A Kafka or RocketMQ that another checkout's services.sh started on this
#                    machine is reused whole: `up` finds that checkout's cache from the running
#                    process's command line, checks that the SASL_SSL listener accepts the
#                    SCRAM users with that cache's CA, and `env` prints that cache's CA and
#                    RocketMQ jars (TestRocketMQACL starts its own broker from them). A SASL_SSL
#                    listener on 9094 whose CA is nowhere to be found fails `up`, saying so.
#                    So a second `up` returns in about a second, and with docker-compose.yml's
#                    services up it needs neither apt-get nor Java (nor Linux). On a failed
#                    start it prints the last 40 lines of that service's log and exits
#                    non-zero. Ends by printing the `env` lines.
#   down [svc...]    Stop the services this script started: pg_ctl stop -m fast,
#                    redis-cli shutdown nosave, SIGTERM to the Java processes (then SIGKILL after a
#                    grace period). Data stays in the cache, so the next `up` is warm.
#   status [svc...]  One line per service: ready / starting / stopped / external / blocked,
#                    with pid and address. Exit status 0 only if every listed service is usable.
#   env              Print the export lines for the tests:  eval "$(scripts/services.sh env)"
#
# Environment:
#   IDEMQ_CACHE      download + data folder (default <repo>/.cache/services, git-ignored).
#                    Wipe it (after `down`) for a fully fresh start; the Maven downloads also
#                    stay in ~/.m2.
#   IDEMQ_JAVA       java binary to use (default: /usr/lib/jvm/java-17-openjdk-*/bin/java, else
#                    `java` on PATH if it is 17 or newer, else apt-get install
#                    openjdk-17-jre-headless).
#
# Layout of the cache: postgres/{data,run,postgres.log}  redis/{redis.pid,redis.log}
#   kafka/{pom.xml,lib,server.properties,log4j2.properties,data,kafka.log,kafka.pid,
#          tls/{ca.pem,server.pem,...},kafkasasl,sasl.log,sasl.ready}
#   rocketmq/{pom.xml,lib,home,namesrv.conf,broker.conf,store,namesrv.log,broker.log,*.pid}
# The reasons behind the broker settings are in the comments below.
#
# Every server listens on 127.0.0.1 only, with one exception that RocketMQ 5.3.3 does not let us
# configure: the broker's master-slave replication (HA) port 10912 binds all interfaces
# (DefaultHAService opens `new InetSocketAddress(port)`); with a single broker nothing uses it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${IDEMQ_CACHE:-$REPO/.cache/services}
[[ $CACHE == /* ]] || CACHE=$PWD/$CACHE
ALL_SERVICES=(postgres redis kafka rocketmq pgbouncer)
START_TS=$(date +%s)

KAFKA_VERSION=4.1.1
KAFKA_LOG4J_VERSION=2.24.3            # the log4j2 that Kafka 4.1.1 ships with
KAFKA_CLUSTER_ID=5L6g3nShT-eMCtK--X86sw
ROCKETMQ_VERSION=5.3.3
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

PG_PORT=5432 REDIS_PORT=6379 KAFKA_PORT=9092 KAFKA_CONTROLLER_PORT=9093 KAFKA_SASL_PORT=9094
NAMESRV_PORT=9876 BROKER_PORT=10911
PGBOUNCER_PORT=6432
PG_DSN="postgres://idemq:idemq@127.0.0.1:$PG_PORT/idemq?sslmode=disable"
# The SASL_SSL listener's SCRAM users (test passwords, fixed; the listener is on loopback only).
# idemq-test is a super user; idemq-reader may Read/Describe the topics and consumer groups
# named KAFKA_SASL_READER_PREFIX* and nothing else (no DescribeConfigs: the horizon check fails).
KAFKA_SASL_USER=idemq-test KAFKA_SASL_PASSWORD=idemq-test-secret
KAFKA_SASL_READER_USER=idemq-reader KAFKA_SASL_READER_PASSWORD=idemq-reader-secret
KAFKA_SASL_READER_PREFIX=idemq-sasl-

# ---------------------------------------------------------------------------------- helpers

SVC=services   # prefix of log lines; each service's subshell sets its own
log()  { printf '[%3ss %-8s] %s\n' "$(($(date +%s) - START_TS))" "$SVC" "$*"; }
die()  { log "ERROR: $*" >&2; exit 1; }

# fail LOGFILE MESSAGE: report a failed start; `up` prints the log's last 40 lines at the end.
fail() {
  log "FAILED: $2" >&2
  printf '%s\n' "$1" >"$CACHE/.failed.$SVC"
  exit 1
}

# with_timeout SECONDS CMD...: run CMD, stopped after SECONDS. coreutils `timeout` when there is
# one; macOS has none by default, and the probes that `up` runs first (is the service already
# answering?) must work there too, e.g. against docker-compose.yml's services.
if command -v timeout >/dev/null 2>&1; then
  with_timeout() { timeout "$@"; }
elif command -v gtimeout >/dev/null 2>&1; then
  with_timeout() { gtimeout "$@"; }
else
  with_timeout() {
    local secs=$1 pid watcher rc=0
    shift
    "$@" &
    pid=$!
    # (no output: an orphaned sleep must not hold a $(...) open)
    (sleep "$secs"; kill -TERM "$pid" 2>/dev/null) >/dev/null 2>&1 </dev/null &
    watcher=$!
    wait "$pid" || rc=$?
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    return "$rc"
  }
fi

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() { with_timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# pid_of PIDFILE PATTERN: print the pid in PIDFILE if that process is alive and its command
# line contains PATTERN (guards against a stale file whose pid was reused).
pid_of() {
  local pid
  [[ -s $1 ]] || return 1
  read -r pid <"$1" || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2" || return 1
  echo "$pid"
}

# stop_pid NAME PIDFILE PATTERN GRACE: SIGTERM, wait up to GRACE seconds, then SIGKILL.
stop_pid() {
  local pid i
  pid=$(pid_of "$2" "$3") || { log "$1 not running"; rm -f "$2"; return 0; }
  log "stopping $1 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < $4 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$2"; log "$1 stopped"; return 0; }
    sleep 0.1
  done
  log "$1 still running after $4 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.5
  rm -f "$2"
}

# start_daemon PIDFILE LOGFILE CMD...: run CMD in its own session, detached from this shell,
# output to LOGFILE (the previous one is kept as LOGFILE.1), and record its pid.
start_daemon() {
  local pidfile=$1 logfile=$2 i
  shift 2
  rm -f "$pidfile"
  [[ -f $logfile ]] && mv -f "$logfile" "$logfile.1"
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" >"$logfile" 2>&1 </dev/null &
  for ((i = 0; i < 50; i++)); do [[ -s $pidfile ]] && return 0; sleep 0.1; done
  return 1
}

# wait_for SECONDS PIDFILE PATTERN CHECK...: poll CHECK until it succeeds; fail early when the
# process dies. Returns 1 on timeout, 2 when the process died.
wait_for() {
  local deadline=$(($(date +%s) + $1)) pidfile=$2 pattern=$3
  shift 3
  while :; do
    "$@" && return 0
    pid_of "$pidfile" "$pattern" >/dev/null || { "$@" && return 0; return 2; }
    (($(date +%s) < deadline)) || return 1
    sleep 0.5
  done
}

as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }

# ------------------------------------------------------------------------- packages, Java

# pg_bindir: the newest /usr/lib/postgresql/<ver>/bin, else the folder of pg_ctl on PATH.
pg_bindir() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  if [[ -n $d && -x $d/postgres && -x $d/initdb && -x $d/pg_ctl ]]; then echo "$d"; return 0; fi
  d=$(command -v pg_ctl 2>/dev/null) || return 1
  d=$(dirname "$(readlink -f "$d")")
  [[ -x $d/postgres && -x $d/initdb ]] && echo "$d"
}

java_major() { "$1" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}'; }

# find_java: set JAVA (a Java 17+ binary); prefer Debian's OpenJDK 17.
find_java() {
  local j
  if [[ -n ${IDEMQ_JAVA:-} ]]; then JAVA=$IDEMQ_JAVA; return 0; fi
  for j in /usr/lib/jvm/java-17-openjdk-*/bin/java; do
    [[ -x $j ]] && { JAVA=$j; return 0; }
  done
  j=$(command -v java 2>/dev/null) || return 1
  local v
  v=$(java_major "$j")
  [[ ${v%%.*} =~ ^[0-9]+$ ]] && ((${v%%.*} >= 17)) || return 1
  JAVA=$j
}

# ensure_packages SVC...: one apt-get update + install for everything the services lack.
ensure_packages() {
  local pkgs=() s need_java=
  for s in "$@"; do
    case $s in
      postgres)
        pg_bindir >/dev/null || pkgs+=(postgresql)
        command -v psql >/dev/null || pkgs+=(postgresql-client) ;;
      redis) command -v redis-server >/dev/null && command -v redis-cli >/dev/null || pkgs+=(redis-server redis-tools) ;;
      kafka) need_java=1
        command -v openssl >/dev/null || pkgs+=(openssl) ;; # the SASL_SSL listener's test certificates
      rocketmq) need_java=1 ;;
      pgbouncer) pgbouncer_bin >/dev/null || pkgs+=(pgbouncer)
        command -v psql >/dev/null || pkgs+=(postgresql-client) ;;
    esac
  done
  if [[ -n $need_java ]]; then
    find_java || pkgs+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null || pkgs+=(maven)
  fi
  ((${#pkgs[@]})) || return 0
  # shellcheck disable=SC2207 # package names have no spaces
  pkgs=($(printf '%s\n' "${pkgs[@]}" | sort -u))
  ((EUID == 0)) || command -v sudo >/dev/null || die "missing packages (${pkgs[*]}); install them or run as root"
  command -v apt-get >/dev/null ||
    die "missing packages (${pkgs[*]}) and no apt-get: install them by hand, or run the services with Docker (docker compose up -d --wait)"
  log "installing with apt-get: ${pkgs[*]}"
  # No init system here: a policy-rc.d that answers 101 stops the packages' postinst from
  # starting the system-wide postgresql/redis services (they would take our ports).
  local made_policy=
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    as_root sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    made_policy=1
  fi
  as_root mkdir -p /usr/share/man/man1   # slim images lack it; openjdk's postinst needs it
  local rc=0
  {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${pkgs[@]}"
  } >"$CACHE/apt.log" 2>&1 || rc=$?
  [[ -n $made_policy ]] && as_root rm -f /usr/sbin/policy-rc.d
  if ((rc != 0)); then tail -n 40 "$CACHE/apt.log" >&2; die "apt-get install failed"; fi
  log "installed: ${pkgs[*]}"
}

# fetch_jars DIR POM_XML: copy the runtime dependencies of POM_XML into DIR/lib with Maven
# (downloads land in ~/.m2). Skipped when DIR/lib was filled from the same pom.
fetch_jars() {
  local dir=$1 pom=$2 stamp sum mvnlog=$1/maven.log
  mkdir -p "$dir"
  sum=$(printf '%s' "$pom" | cksum | cut -d' ' -f1)
  stamp=$dir/lib/.complete
  [[ -f $stamp && $(<"$stamp") == "$sum" ]] && return 0
  printf '%s\n' "$pom" >"$dir/pom.xml"
  log "fetching jars from Maven Central (log: $mvnlog)"
  local try
  for try in 1 2; do
    rm -rf "$dir/lib.tmp"
    if JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$JAVA")")") \
      mvn -B -q -Dstyle.color=never -f "$dir/pom.xml" -Dmaven.artifact.threads=8 "$DEPENDENCY_PLUGIN:copy-dependencies" \
      -DincludeScope=runtime -DoutputDirectory="$dir/lib.tmp" >"$mvnlog" 2>&1; then
      echo "$sum" >"$dir/lib.tmp/.complete"
      rm -rf "${dir:?}/lib"
      mv "$dir/lib.tmp" "$dir/lib"
      log "jars ready: $(find "$dir/lib" -name '*.jar' | wc -l) jars, $(du -sh "$dir/lib" | cut -f1)"
      return 0
    fi
    log "maven failed (try $try)"
    sleep 2   # a concurrent first download into ~/.m2 can trip; the second try reuses its files
  done
  fail "$mvnlog" "could not fetch the jars"
}

pom_xml() { # pom_xml ARTIFACT_ID DEPENDENCY_LINES
  cat <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.idemq.services</groupId><artifactId>$1</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
$2
  </dependencies>
</project>
EOF
}

# ------------------------------------------------------------------------------- postgres

# Our cluster lives in $CACHE/postgres unless the `postgres` OS user cannot reach the cache
# (e.g. a repo under /root, mode 700): then in /var/tmp/idemq-services/<hash>/postgres.
pg_dir() {
  if ((EUID == 0)) && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$CACHE" 2>/dev/null; then
    echo "/var/tmp/idemq-services/$(printf '%s' "$CACHE" | cksum | cut -d' ' -f1)/postgres"
  else
    echo "$CACHE/postgres"
  fi
}

# as_pg CMD...: run as the postgres OS user (root may not run the server).
as_pg() {
  if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

pg_sockdir() {
  local d; d=$(pg_dir)/run
  # a unix socket path holds at most 107 bytes
  if ((${#d} > 90)); then d=/tmp/idemq-pg-$(printf '%s' "$d" | cksum | cut -d' ' -f1); fi
  echo "$d"
}

psql_bin() {
  local b
  if b=$(pg_bindir 2>/dev/null) && [[ -x $b/psql ]]; then echo "$b/psql"; else command -v psql; fi
}

pg_dsn_ok() {
  local psql
  psql=$(psql_bin) || return 1
  [[ $(PGCONNECT_TIMEOUT=3 "$psql" "$PG_DSN" -XAtqc 'select 1' 2>/dev/null) == 1 ]]
}

# pg_protocol_ok: a PostgreSQL server answers an SSLRequest on 127.0.0.1:$PG_PORT (with S or N).
# Recognizes a server where there is no psql to try the DSN.
# shellcheck disable=SC2016 # expanded by the inner shell
pg_protocol_ok() {
  with_timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x08\x04\xd2\x16\x2f" >&3
    r=$(head -c 1 <&3)
    [[ $r == S || $r == N ]]' _ $PG_PORT 2>/dev/null
}

pg_pid() { local d; d=$(pg_dir)/data; pid_of "$d/postmaster.pid" "postgres"; }

up_postgres() {
  local dir data sock bin psql
  dir=$(pg_dir) data=$(pg_dir)/data sock=$(pg_sockdir)
  if pg_pid >/dev/null; then
    if pg_dsn_ok; then log "already running (pid $(pg_pid))"; return 0; fi
  elif port_open $PG_PORT; then
    pg_dsn_ok || fail /dev/null "127.0.0.1:$PG_PORT is taken by a server where $PG_DSN does not work"
    log "reusing the server already on 127.0.0.1:$PG_PORT (not started by this script)"
    return 0
  fi
  bin=$(pg_bindir) || fail /dev/null "no PostgreSQL server binaries"
  psql=$(psql_bin)
  mkdir -p "$dir" "$sock"
  ((EUID == 0)) && chown -R postgres:postgres "$dir" "$sock"
  if [[ ! -s $data/PG_VERSION ]]; then
    log "initdb ($bin) in $data"
    rm -rf "$data"
    as_pg "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 || fail "$dir/initdb.log" "initdb failed"
    cat >>"$data/postgresql.conf" <<EOF

# --- scripts/services.sh
listen_addresses = '127.0.0.1'
port = $PG_PORT
max_connections = 300
unix_socket_directories = '$sock'
EOF
  fi
  if ! pg_pid >/dev/null; then
    log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    as_pg "$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 start >"$dir/pg_ctl.log" 2>&1 ||
      fail "$dir/postgres.log" "pg_ctl start failed"
  fi
  # role and database (idempotent)
  "$psql" -h "$sock" -p $PG_PORT -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 >/dev/null 2>"$dir/setup.log" <<'SQL' ||
DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idemq') THEN
    CREATE ROLE idemq LOGIN SUPERUSER PASSWORD 'idemq';
  END IF;
END$$;
SELECT 'CREATE DATABASE idemq OWNER idemq' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'idemq')\gexec
SQL
    fail "$dir/setup.log" "could not create role/database idemq"
  pg_dsn_ok || fail "$dir/postgres.log" "$PG_DSN does not answer"
  log "ready (pid $(pg_pid))"
}

down_postgres() {
  local data bin
  data=$(pg_dir)/data
  if ! pg_pid >/dev/null; then
    if port_open $PG_PORT; then log "the server on 127.0.0.1:$PG_PORT is not ours: left alone"; else log "not running"; fi
    return 0
  fi
  bin=$(pg_bindir)
  log "stopping (pg_ctl stop -m fast)"
  as_pg "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
  log "stopped"
}

status_postgres() {
  local pid
  if pid=$(pg_pid); then
    if pg_dsn_ok; then echo "ready    pid $pid  127.0.0.1:$PG_PORT  data $(pg_dir)/data"; else echo "starting pid $pid  127.0.0.1:$PG_PORT"; return 1; fi
  elif port_open $PG_PORT; then
    if pg_dsn_ok; then echo "external 127.0.0.1:$PG_PORT (not started by this script; DSN works)"; else echo "blocked  127.0.0.1:$PG_PORT taken by another server"; return 1; fi
  else echo "stopped"; return 1; fi
}

# ---------------------------------------------------------------------------------- redis

REDIS_DIR=$CACHE/redis

redis_ping() {
  local r
  if command -v redis-cli >/dev/null; then
    r=$(with_timeout 3 redis-cli -h 127.0.0.1 -p $REDIS_PORT ping 2>/dev/null) || return 1
  else
    r=$(with_timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$REDIS_PORT && printf 'PING\r\n' >&3 && read -r l <&3 && echo \"\$l\"" 2>/dev/null) || return 1
  fi
  [[ ${r%$'\r'} == *PONG ]]
}

redis_pid() { pid_of "$REDIS_DIR/redis.pid" redis-server; }

up_redis() {
  if redis_ping; then
    if redis_pid >/dev/null; then log "already running (pid $(redis_pid))"
    else log "reusing the server already on 127.0.0.1:$REDIS_PORT (not started by this script)"; fi
    return 0
  fi
  port_open $REDIS_PORT && fail /dev/null "127.0.0.1:$REDIS_PORT is taken by something that does not answer PING"
  mkdir -p "$REDIS_DIR"
  [[ -f $REDIS_DIR/redis.log ]] && mv -f "$REDIS_DIR/redis.log" "$REDIS_DIR/redis.log.1"
  log "starting redis-server on 127.0.0.1:$REDIS_PORT"
  redis-server --bind 127.0.0.1 --port $REDIS_PORT --daemonize yes --save '' --appendonly no \
    --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" --dir "$REDIS_DIR" \
    >"$REDIS_DIR/start.log" 2>&1 || fail "$REDIS_DIR/start.log" "redis-server did not start"
  local i
  for ((i = 0; i < 100; i++)); do redis_ping && break; sleep 0.2; done
  redis_ping || fail "$REDIS_DIR/redis.log" "no PONG on 127.0.0.1:$REDIS_PORT"
  log "ready (pid $(redis_pid || echo '?'))"
}

down_redis() {
  local pid i
  if ! pid=$(redis_pid); then
    if redis_ping; then log "the server on 127.0.0.1:$REDIS_PORT is not ours: left alone"; else log "not running"; fi
    return 0
  fi
  log "stopping (shutdown nosave, pid $pid)"
  with_timeout 10 redis-cli -h 127.0.0.1 -p $REDIS_PORT shutdown nosave >/dev/null 2>&1 || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  stop_pid redis "$REDIS_DIR/redis.pid" redis-server 10 >/dev/null
  log "stopped"
}

status_redis() {
  local pid
  if pid=$(redis_pid); then
    if redis_ping; then echo "ready    pid $pid  127.0.0.1:$REDIS_PORT"; else echo "starting pid $pid  127.0.0.1:$REDIS_PORT"; return 1; fi
  elif redis_ping; then echo "external 127.0.0.1:$REDIS_PORT (not started by this script; PING works)"
  elif port_open $REDIS_PORT; then echo "blocked  127.0.0.1:$REDIS_PORT taken, no PONG"; return 1
  else echo "stopped"; return 1; fi
}

# ---------------------------------------------------------------------------------- kafka

KAFKA_DIR=$CACHE/kafka

# kafka_api_ok: a Kafka ApiVersions v0 round trip on 127.0.0.1:9092 (correlation id 1, error 0).
# shellcheck disable=SC2016 # expanded by the inner shell
kafka_api_ok() {
  with_timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x0f\x00\x12\x00\x00\x00\x00\x00\x01\x00\x05idemq" >&3
    r=$(head -c 10 <&3 | od -An -tx1 | tr -d " \n")
    [[ ${r:8:12} == 000000010000 ]]' _ $KAFKA_PORT 2>/dev/null
}

kafka_pid() { pid_of "$KAFKA_DIR/kafka.pid" kafka.Kafka; }
# kafka_broker_ready: both client listeners answer and the broker logged its start.
kafka_broker_ready() {
  kafka_api_ok && port_open $KAFKA_SASL_PORT && grep -q 'Kafka Server started' "$KAFKA_DIR/kafka.log" 2>/dev/null
}
# kafka_ready: kafka_broker_ready, and the SCRAM users log in on the SASL_SSL listener (sasl.ready
# is written by kafka_sasl_setup after each start and removed before each start).
kafka_ready() { kafka_broker_ready && [[ -f $KAFKA_DIR/sasl.ready ]]; }

# proc_arg_after PATTERN FLAG: for each live process whose command line contains PATTERN, print
# the argument that follows FLAG (FLAG "": the last argument), one a line. Linux (/proc) only.
proc_arg_after() {
  local f
  for f in $(grep -lasF -- "$1" /proc/[0-9]*/cmdline); do
    tr '\0' '\n' <"$f" 2>/dev/null | awk -v pat="$1" -v flag="$2" '
      index($0, pat) { hit = 1 } { a[NR] = $0 }
      END { if (!hit) exit; if (flag == "") { print a[NR]; exit }
            for (i = 1; i < NR; i++) if (a[i] == flag) { print a[i + 1]; exit } }'
  done 2>/dev/null
}

# kafka_owner_dir: print the cache folder (KAFKA_DIR) of the Kafka that serves 127.0.0.1:9092:
# ours, or another checkout's services.sh's, found from its command line (kafka.Kafka
# DIR/server.properties) and that file's listeners. Fails for any other broker (Docker's, say).
kafka_owner_dir() {
  local props
  if kafka_pid >/dev/null; then echo "$KAFKA_DIR"; return 0; fi
  while read -r props; do
    [[ $props == /*/server.properties && -r $props ]] || continue
    grep -q "^listeners=.*PLAINTEXT://127.0.0.1:$KAFKA_PORT\(,\|$\)" "$props" || continue
    dirname "$props"
    return 0
  done < <(proc_arg_after kafka.Kafka "")
  return 1
}

# kafka_sasl_dir: the cache folder whose tls/ca.pem signed the SASL_SSL listener's certificate
# (kafka_owner_dir's), else ours (nothing known: `up` has said why).
kafka_sasl_dir() {
  local d
  if d=$(kafka_owner_dir) && [[ -s $d/tls/ca.pem ]]; then echo "$d"; else echo "$KAFKA_DIR"; fi
}

# kafka_reuse_check: a reused broker must be usable whole, SASL_SSL listener included: find the
# cache of the checkout that started it and check that the SCRAM users log in with its CA
# (kafkasasl, whose steps are idempotent: it also (re)creates the users, with the same
# passwords). Without a SASL_SSL listener (docker-compose.yml has none) it warns; with one whose
# CA cannot be found, it fails.
kafka_reuse_check() {
  local owner bin=$KAFKA_DIR/kafkasasl src=$REPO/integration/cmd/kafkasasl
  if ! owner=$(kafka_owner_dir); then
    if port_open $KAFKA_SASL_PORT; then
      log "ERROR: 127.0.0.1:$KAFKA_SASL_PORT (SASL_SSL) answers, but the broker was not started by a services.sh on this machine, so its CA is unknown: the SASL tests cannot use it. Stop that broker (or free 9092/9094) and run up again" >&2
      return 1
    fi
    log "WARNING: that broker has no SASL_SSL listener on 127.0.0.1:$KAFKA_SASL_PORT (docker-compose.yml's has none): the SASL tests fail under CI=true"
    return 0
  fi
  [[ -s $owner/tls/ca.pem ]] || { log "ERROR: the broker on 127.0.0.1:$KAFKA_PORT runs from $owner, which has no tls/ca.pem: its SASL_SSL listener cannot be used" >&2; return 1; }
  mkdir -p "$KAFKA_DIR"
  if [[ ! -x $bin || -n $(find "$src" -newer "$bin" -name '*.go' 2>/dev/null) ]]; then
    command -v go >/dev/null || { log "ERROR: the Go toolchain is needed to check the SASL users (go build ./integration/cmd/kafkasasl)" >&2; return 1; }
    (cd "$REPO/integration" && go build -o "$bin" ./cmd/kafkasasl) >"$KAFKA_DIR/sasl-reuse.log" 2>&1 ||
      { tail -n 20 "$KAFKA_DIR/sasl-reuse.log" >&2; log "ERROR: could not build integration/cmd/kafkasasl" >&2; return 1; }
  fi
  "$bin" -plaintext 127.0.0.1:$KAFKA_PORT -sasl 127.0.0.1:$KAFKA_SASL_PORT -ca "$owner/tls/ca.pem" \
    -admin "$KAFKA_SASL_USER:$KAFKA_SASL_PASSWORD" -reader "$KAFKA_SASL_READER_USER:$KAFKA_SASL_READER_PASSWORD" \
    -prefix "$KAFKA_SASL_READER_PREFIX" -timeout 30s >>"$KAFKA_DIR/sasl-reuse.log" 2>&1 ||
    { tail -n 20 "$KAFKA_DIR/sasl-reuse.log" >&2
      log "ERROR: the SCRAM users do not log in on 127.0.0.1:$KAFKA_SASL_PORT with $owner/tls/ca.pem" >&2; return 1; }
  log "SASL_SSL on 127.0.0.1:$KAFKA_SASL_PORT: users $KAFKA_SASL_USER, $KAFKA_SASL_READER_USER log in with $owner/tls/ca.pem"
}

# kafka_tls_material: a test CA and a server certificate for 127.0.0.1/localhost signed by it,
# made with openssl once into $KAFKA_DIR/tls (never committed; wipe the folder to renew).
# server.pem holds the unencrypted PKCS#8 key and the certificate, as Kafka's PEM keystore wants.
kafka_tls_material() {
  local d=$KAFKA_DIR/tls
  [[ -s $d/ca.pem && -s $d/server.pem ]] && return 0
  command -v openssl >/dev/null || fail /dev/null "openssl is needed to make the SASL_SSL listener's test certificates"
  log "making a test CA and server certificate in $d"
  rm -rf "$d.tmp"
  mkdir -p "$d.tmp"
  (
    cd "$d.tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=idemq test CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout ca.key -out ca.pem
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 -extfile server.ext -out server.crt
    openssl pkcs8 -topk8 -nocrypt -in server.key -out server.pk8
    cat server.pk8 server.crt >server.pem
  ) >"$KAFKA_DIR/tls.log" 2>&1 || fail "$KAFKA_DIR/tls.log" "openssl could not make the test certificates"
  rm -rf "$d"
  mv "$d.tmp" "$d"
}

# kafka_sasl_setup: after each start, over PLAINTEXT (User:ANONYMOUS is a super user), create the
# SCRAM users and the read-only user's ACLs, then log in with both over SASL_SSL
# (integration/cmd/kafkasasl, built once into the cache with the Go toolchain).
kafka_sasl_setup() {
  local bin=$KAFKA_DIR/kafkasasl src=$REPO/integration/cmd/kafkasasl
  if [[ ! -x $bin || -n $(find "$src" -newer "$bin" -name '*.go' 2>/dev/null) ]]; then
    command -v go >/dev/null || fail /dev/null "the Go toolchain is needed to create the SASL users (go build ./integration/cmd/kafkasasl)"
    (cd "$REPO/integration" && go build -o "$bin" ./cmd/kafkasasl) >"$KAFKA_DIR/sasl.log" 2>&1 ||
      fail "$KAFKA_DIR/sasl.log" "could not build integration/cmd/kafkasasl"
  fi
  "$bin" -plaintext 127.0.0.1:$KAFKA_PORT -sasl 127.0.0.1:$KAFKA_SASL_PORT -ca "$KAFKA_DIR/tls/ca.pem" \
    -admin "$KAFKA_SASL_USER:$KAFKA_SASL_PASSWORD" -reader "$KAFKA_SASL_READER_USER:$KAFKA_SASL_READER_PASSWORD" \
    -prefix "$KAFKA_SASL_READER_PREFIX" >>"$KAFKA_DIR/sasl.log" 2>&1 ||
    fail "$KAFKA_DIR/sasl.log" "the SCRAM users could not be created or cannot log in on 127.0.0.1:$KAFKA_SASL_PORT"
  touch "$KAFKA_DIR/sasl.ready"
  log "SASL_SSL on 127.0.0.1:$KAFKA_SASL_PORT: users $KAFKA_SASL_USER, $KAFKA_SASL_READER_USER log in"
}

# The SASL_SSL listener (9094): TLS with the test certificate and SCRAM-SHA-256/512 logins. The
# controller and inter-broker traffic stay PLAINTEXT. ACLs are on (StandardAuthorizer, the KRaft
# one); User:ANONYMOUS, the principal of every PLAINTEXT connection, is a super user, so the
# PLAINTEXT listener and everything using it behave as without ACLs. So is the admin SCRAM user.
kafka_write_config() {
  cat >"$KAFKA_DIR/server.properties" <<EOF
# generated by scripts/services.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$KAFKA_DIR/tls/server.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:$KAFKA_SASL_USER
log.dirs=$KAFKA_DIR/data
num.partitions=3
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
EOF
  cat >"$KAFKA_DIR/log4j2.properties" <<'EOF'
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
EOF
}

# kafka_pom: the broker (kafka_2.13), Kafka's command-line tools (kafka-tools: TopicCommand,
# ConsumerGroupCommand, ... the classes behind kafka-topics.sh and kafka-consumer-groups.sh,
# the tools operators run) and the log4j2 that Kafka ships with.
# scripts/topology/kafka.sh fetches the same set into its own folder.
kafka_pom() {
  pom_xml kafka-runtime "\
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$KAFKA_LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$KAFKA_LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$KAFKA_LOG4J_VERSION</version></dependency>"
}

up_kafka() {
  local pid rc=0
  mkdir -p "$KAFKA_DIR"
  if pid=$(kafka_pid); then
    if kafka_ready; then log "already running (pid $pid)"; return 0; fi
  elif port_open $KAFKA_PORT; then
    kafka_api_ok || fail /dev/null "127.0.0.1:$KAFKA_PORT is taken by something that is not Kafka"
    log "reusing the broker already on 127.0.0.1:$KAFKA_PORT (not started by this script)"
    kafka_reuse_check || fail /dev/null "the broker on 127.0.0.1:$KAFKA_PORT cannot be reused whole"
    return 0
  else
    fetch_jars "$KAFKA_DIR" "$(kafka_pom)"
    kafka_tls_material
    kafka_write_config
    rm -f "$KAFKA_DIR/sasl.ready"
    local jopts=(-Xms512m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true
      "-Dlog4j2.configurationFile=$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_DIR/lib/*")
    # Format once; the data (topics, offsets) then survives down/up.
    if ! grep -qx "cluster.id=$KAFKA_CLUSTER_ID" "$KAFKA_DIR/data/meta.properties" 2>/dev/null; then
      log "formatting KRaft storage in $KAFKA_DIR/data"
      rm -rf "$KAFKA_DIR/data"
      "$JAVA" "${jopts[@]}" kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" \
        -c "$KAFKA_DIR/server.properties" >"$KAFKA_DIR/format.log" 2>&1 ||
        fail "$KAFKA_DIR/format.log" "kafka storage format failed"
    fi
    log "starting Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT"
    start_daemon "$KAFKA_DIR/kafka.pid" "$KAFKA_DIR/kafka.log" \
      "$JAVA" "${jopts[@]}" kafka.Kafka "$KAFKA_DIR/server.properties" ||
      fail "$KAFKA_DIR/kafka.log" "kafka did not start"
  fi
  wait_for 90 "$KAFKA_DIR/kafka.pid" kafka.Kafka kafka_broker_ready || rc=$?
  ((rc == 0)) || fail "$KAFKA_DIR/kafka.log" "$( ((rc == 2)) && echo "kafka exited" || echo "kafka not ready after 90 s")
  (if its data is to blame: scripts/services.sh down kafka; rm -rf $KAFKA_DIR/data)"
  [[ -f $KAFKA_DIR/sasl.ready ]] || kafka_sasl_setup
  log "ready (pid $(kafka_pid))"
}

down_kafka() {
  if ! kafka_pid >/dev/null && port_open $KAFKA_PORT; then log "the broker on 127.0.0.1:$KAFKA_PORT is not ours: left alone"; return 0; fi
  stop_pid kafka "$KAFKA_DIR/kafka.pid" kafka.Kafka 60
}

status_kafka() {
  local pid
  if pid=$(kafka_pid); then
    if kafka_ready; then echo "ready    pid $pid  127.0.0.1:$KAFKA_PORT  Kafka $KAFKA_VERSION (KRaft)"; else echo "starting pid $pid  127.0.0.1:$KAFKA_PORT"; return 1; fi
  elif kafka_api_ok; then
    local owner
    if owner=$(kafka_owner_dir); then echo "external 127.0.0.1:$KAFKA_PORT (started from $owner; ApiVersions works)"
    else echo "external 127.0.0.1:$KAFKA_PORT (not started by this script; ApiVersions works)"; fi
  elif port_open $KAFKA_PORT; then echo "blocked  127.0.0.1:$KAFKA_PORT taken, not Kafka"; return 1
  else echo "stopped"; return 1; fi
}

# ------------------------------------------------------------------------------- rocketmq

RMQ_DIR=$CACHE/rocketmq
RMQ_HOME=$RMQ_DIR/home

# rmq_request PORT CODE [BODY]: one RocketMQ Remoting request (JSON header) to 127.0.0.1:PORT;
# prints the reply's JSON header and body.
# shellcheck disable=SC2016 # expanded by the inner shell
rmq_request() {
  with_timeout 5 bash -c '
    port=$1 code=$2 body=${3:-}
    h="{\"code\":$code,\"flag\":0,\"language\":\"JAVA\",\"opaque\":1,\"serializeTypeCurrentRPC\":\"JSON\",\"version\":0}"
    be32() { printf "\\\\x%02x\\\\x%02x\\\\x%02x\\\\x%02x" $(($1>>24&255)) $(($1>>16&255)) $(($1>>8&255)) $(($1&255)); }
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    { printf "$(be32 $((4 + ${#h} + ${#body})))$(be32 ${#h})"; printf "%s%s" "$h" "$body"; } >&3
    len=$((16#$(head -c 4 <&3 | od -An -tx1 | tr -d " \n")))
    ((len > 4)) || exit 1
    head -c "$len" <&3 | tail -c +5 | tr -d "\000"' _ "$@" 2>/dev/null
}
# rmq_broker_registered: the NameServer answers GET_BROKER_CLUSTER_INFO (106) and lists our
# broker at 127.0.0.1:10911.
rmq_broker_registered() { rmq_request $NAMESRV_PORT 106 | grep -q "\"127.0.0.1:$BROKER_PORT\""; }
# rmq_broker_version: the broker on 127.0.0.1:10911 answers GET_BROKER_RUNTIME_INFO (28); prints
# its brokerVersionDesc (V5_3_3 for 5.3.3).
rmq_broker_version() { rmq_request $BROKER_PORT 28 | grep -o '"brokerVersionDesc":"[^"]*"' | cut -d'"' -f4; }

# rmq_owner_dir: print the cache folder (RMQ_DIR) of the broker that serves 127.0.0.1:10911: ours,
# or another checkout's services.sh's, found from its command line (BrokerStartup -c
# DIR/broker.conf) and that file's listenPort. Fails for any other broker.
rmq_owner_dir() {
  local conf
  if broker_pid >/dev/null; then echo "$RMQ_DIR"; return 0; fi
  while read -r conf; do
    [[ $conf == /*/broker.conf && -r $conf ]] || continue
    grep -qx "listenPort=$BROKER_PORT" "$conf" || continue
    dirname "$conf"
    return 0
  done < <(proc_arg_after org.apache.rocketmq.broker.BrokerStartup -c)
  return 1
}

# rmq_jars_ok DIR: DIR/lib holds the complete set of jars fetch_jars made.
rmq_jars_ok() { [[ -f $1/lib/.complete ]] && compgen -G "$1/lib/rocketmq-broker-*.jar" >/dev/null; }

# rmq_lib_dir: the RocketMQ jars for the tests (TestRocketMQACL starts a broker of its own from
# them): the running broker's cache's (rmq_owner_dir) when complete, else ours.
rmq_lib_dir() {
  local d
  if d=$(rmq_owner_dir) && rmq_jars_ok "$d"; then echo "$d/lib"; else echo "$RMQ_DIR/lib"; fi
}

rmq_pom() {
  pom_xml rocketmq-runtime "\
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-namesrv</artifactId><version>$ROCKETMQ_VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-broker</artifactId><version>$ROCKETMQ_VERSION</version></dependency>"
}

namesrv_pid() { pid_of "$RMQ_DIR/namesrv.pid" NamesrvStartup; }
broker_pid() { pid_of "$RMQ_DIR/broker.pid" BrokerStartup; }
namesrv_ready() { port_open $NAMESRV_PORT && grep -q 'The Name Server boot success' "$RMQ_DIR/namesrv.log" 2>/dev/null; }
broker_ready() {
  port_open $BROKER_PORT && grep -q 'boot success' "$RMQ_DIR/broker.log" 2>/dev/null && rmq_broker_registered
}

# The broker registers with the NameServer once at start, then every 10 s. The first one races
# the broker's own check that the NameServer is reachable and is often skipped, which would cost
# 10 s. When the broker has booted but is not listed a second later, UPDATE_BROKER_CONFIG (25)
# with the default brokerPermission=6 (read+write) makes it register in full at once. (The broker
# then saves its whole effective config over broker.conf; rmq_write_config rewrites it anyway.)
RMQ_KICKED=
broker_ready_or_kick() {
  broker_ready && return 0
  [[ -z $RMQ_KICKED ]] && port_open $BROKER_PORT && grep -q 'boot success' "$RMQ_DIR/broker.log" 2>/dev/null || return 1
  sleep 1
  broker_ready && return 0
  RMQ_KICKED=1
  log "broker booted but not yet registered: asking it to register now"
  rmq_request $BROKER_PORT 25 'brokerPermission=6' >/dev/null || true
  return 1
}

# waitTimeMillsInSendQueue: a send that waited longer than this in the broker's queue is refused
# with "[TIMEOUT_CLEAN_QUEUE]broker busy" (default 200 ms). On a 2-core machine kept busy by a
# test run beside the demo, 200 ms of queueing happens: the demo's producer was refused once in 21
# runs. 3 s keeps the broker's fast failure for a broker really stuck, not for a busy one.
rmq_write_config() {
  mkdir -p "$RMQ_HOME/conf" "$RMQ_DIR/store"
  cat >"$RMQ_DIR/namesrv.conf" <<EOF
listenPort=$NAMESRV_PORT
bindAddress=127.0.0.1
scanAvailableNameSrv=false
EOF
  cat >"$RMQ_DIR/broker.conf" <<EOF
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
brokerRole=ASYNC_MASTER
flushDiskType=ASYNC_FLUSH
namesrvAddr=127.0.0.1:$NAMESRV_PORT
brokerIP1=127.0.0.1
brokerIP2=127.0.0.1
listenPort=$BROKER_PORT
bindAddress=127.0.0.1
autoCreateTopicEnable=true
autoCreateSubscriptionGroup=true
defaultTopicQueueNums=4
storePathRootDir=$RMQ_DIR/store
mappedFileSizeCommitLog=67108864
mappedFileSizeConsumeQueue=600000
diskMaxUsedSpaceRatio=95
messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s
registerNameServerPeriod=10000
waitTimeMillsInSendQueue=3000
EOF
}

up_rocketmq() {
  local rc=0
  mkdir -p "$RMQ_DIR"
  if namesrv_pid >/dev/null && broker_pid >/dev/null && namesrv_ready && broker_ready; then
    log "already running (namesrv pid $(namesrv_pid), broker pid $(broker_pid))"
    return 0
  fi
  if ! namesrv_pid >/dev/null && port_open $NAMESRV_PORT; then
    rmq_broker_registered || fail /dev/null "127.0.0.1:$NAMESRV_PORT is taken by something that does not list a broker at 127.0.0.1:$BROKER_PORT"
    log "reusing the NameServer and broker already running (not started by this script)"
    rmq_jars_for_reuse
    return 0
  fi
  fetch_jars "$RMQ_DIR" "$(rmq_pom)"
  rmq_write_config
  local jdk17=(--add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.nio=ALL-UNNAMED
    --add-opens java.base/java.util=ALL-UNNAMED --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
    --add-exports java.base/sun.nio.ch=ALL-UNNAMED)
  export ROCKETMQ_HOME=$RMQ_HOME
  if ! namesrv_pid >/dev/null; then
    log "starting NameServer $ROCKETMQ_VERSION on 127.0.0.1:$NAMESRV_PORT"
    start_daemon "$RMQ_DIR/namesrv.pid" "$RMQ_DIR/namesrv.log" \
      "$JAVA" -Xms256m -Xmx256m -Xmn128m -XX:+UseG1GC "${jdk17[@]}" "-Duser.home=$RMQ_HOME" \
      -Drmq.logback.configurationFile=rmq.namesrv.logback.xml -cp "$RMQ_DIR/lib/*" \
      org.apache.rocketmq.namesrv.NamesrvStartup -c "$RMQ_DIR/namesrv.conf" ||
      fail "$RMQ_DIR/namesrv.log" "NameServer did not start"
  fi
  wait_for 60 "$RMQ_DIR/namesrv.pid" NamesrvStartup namesrv_ready || rc=$?
  ((rc == 0)) || fail "$RMQ_DIR/namesrv.log" "$( ((rc == 2)) && echo "NameServer exited" || echo "NameServer not ready after 60 s")"
  if ! broker_pid >/dev/null; then
    log "starting broker on 127.0.0.1:$BROKER_PORT"
    start_daemon "$RMQ_DIR/broker.pid" "$RMQ_DIR/broker.log" \
      "$JAVA" -Xms512m -Xmx512m -Xmn256m -XX:+UseG1GC -XX:MaxDirectMemorySize=512m "${jdk17[@]}" \
      "-Duser.home=$RMQ_HOME" -Drmq.logback.configurationFile=rmq.broker.logback.xml -cp "$RMQ_DIR/lib/*" \
      org.apache.rocketmq.broker.BrokerStartup -c "$RMQ_DIR/broker.conf" ||
      fail "$RMQ_DIR/broker.log" "broker did not start"
  fi
  wait_for 120 "$RMQ_DIR/broker.pid" BrokerStartup broker_ready_or_kick || rc=$?
  ((rc == 0)) || fail "$RMQ_DIR/broker.log" "$( ((rc == 2)) && echo "broker exited" || echo "broker not ready (or not registered) after 120 s")
  (if its data is to blame: scripts/services.sh down rocketmq; rm -rf $RMQ_DIR/store)"
  log "ready (namesrv pid $(namesrv_pid), broker pid $(broker_pid))"
}

# rmq_jars_for_reuse: in up_rocketmq's reuse branch (a subshell: Java is found), fetch the jars
# into our cache when the reused broker's cache has none.
rmq_jars_for_reuse() {
  local owner
  if owner=$(rmq_owner_dir) && rmq_jars_ok "$owner"; then return 0; fi
  rmq_jars_ok "$RMQ_DIR" && return 0
  log "fetching the RocketMQ jars into $RMQ_DIR/lib (TestRocketMQACL starts a broker of its own from them)"
  fetch_jars "$RMQ_DIR" "$(rmq_pom)"
}

down_rocketmq() {
  if ! namesrv_pid >/dev/null && ! broker_pid >/dev/null && port_open $NAMESRV_PORT; then
    log "the NameServer on 127.0.0.1:$NAMESRV_PORT is not ours: left alone"; return 0
  fi
  stop_pid broker "$RMQ_DIR/broker.pid" BrokerStartup 60    # broker first: it unregisters
  stop_pid namesrv "$RMQ_DIR/namesrv.pid" NamesrvStartup 30
}

status_rocketmq() {
  local np bp
  np=$(namesrv_pid) || np=
  bp=$(broker_pid) || bp=
  if [[ -n $np || -n $bp ]]; then
    if [[ -n $np && -n $bp ]] && namesrv_ready && broker_ready; then
      echo "ready    pid $np,$bp  127.0.0.1:$NAMESRV_PORT (namesrv) 127.0.0.1:$BROKER_PORT (broker-a)  RocketMQ $ROCKETMQ_VERSION"
    else echo "starting namesrv pid ${np:--}, broker pid ${bp:--}"; return 1; fi
  elif rmq_broker_registered; then
    local owner
    local whose="not started by this script"
    owner=$(rmq_owner_dir) && whose="started from $owner"
    echo "external 127.0.0.1:$NAMESRV_PORT ($whose; lists broker 127.0.0.1:$BROKER_PORT)"
  elif port_open $NAMESRV_PORT || port_open $BROKER_PORT; then echo "blocked  127.0.0.1:$NAMESRV_PORT or :$BROKER_PORT taken"; return 1
  else echo "stopped"; return 1; fi
}

# --------------------------------------------------------------------- already answering?

# answers_SVC: the service already answers a real request on its port; logs whose it is: ours
# ("already running") or a server this script did not start ("reusing"), e.g. one of
# docker-compose.yml. `up` asks this first, before installing or starting anything, so these
# probes need nothing beyond bash, head, od, tr, grep and cut (psql and redis-cli when they are
# installed), and run on macOS too.
answers_postgres() {
  local pid
  if pid=$(pg_pid); then
    pg_dsn_ok || return 1
    log "already running (pid $pid)"
  elif pg_dsn_ok; then
    log "reusing the server already on 127.0.0.1:$PG_PORT (not started by this script; $PG_DSN works)"
  elif ! psql_bin >/dev/null 2>&1 && pg_protocol_ok; then
    log "reusing the server already on 127.0.0.1:$PG_PORT (not started by this script; it speaks the PostgreSQL protocol, no psql here to try the DSN)"
  else
    return 1
  fi
}

answers_redis() {
  local pid
  redis_ping || return 1
  if pid=$(redis_pid); then log "already running (pid $pid)"
  else log "reusing the server already on 127.0.0.1:$REDIS_PORT (not started by this script; PING works)"; fi
}

answers_kafka() {
  local pid
  if pid=$(kafka_pid); then
    kafka_ready || return 1
    log "already running (pid $pid)"
  elif kafka_api_ok; then
    local owner
    if owner=$(kafka_owner_dir); then
      log "reusing the broker already on 127.0.0.1:$KAFKA_PORT, started from $owner (ApiVersions works)"
    else
      log "reusing the broker already on 127.0.0.1:$KAFKA_PORT (not started by this script; ApiVersions works)"
    fi
    kafka_reuse_check || die "the broker on 127.0.0.1:$KAFKA_PORT cannot be reused whole (see above)"
  else
    return 1
  fi
}

answers_rocketmq() {
  local v
  if namesrv_pid >/dev/null || broker_pid >/dev/null; then
    namesrv_pid >/dev/null && broker_pid >/dev/null && namesrv_ready && broker_ready || return 1
    log "already running (namesrv pid $(namesrv_pid), broker pid $(broker_pid))"
  elif rmq_broker_registered && v=$(rmq_broker_version) && [[ -n $v ]]; then
    local owner= whose="not started by this script"
    owner=$(rmq_owner_dir) && whose="started from $owner" || owner=
    log "reusing the NameServer on 127.0.0.1:$NAMESRV_PORT and broker-a ($v) on 127.0.0.1:$BROKER_PORT ($whose)"
    [[ $v == "V${ROCKETMQ_VERSION//./_}" ]] || log "WARNING: that broker is $v, the tests expect RocketMQ $ROCKETMQ_VERSION"
    if [[ -n $owner ]] && rmq_jars_ok "$owner"; then
      log "its jars (for TestRocketMQACL's own broker): $owner/lib"
    elif ! rmq_jars_ok "$RMQ_DIR"; then
      log "no RocketMQ jars to reuse (TestRocketMQACL starts a broker of its own from them): fetching them into $RMQ_DIR/lib"
      RMQ_FETCH_JARS=1
    fi
  else
    return 1
  fi
}

# ------------------------------------------------------------------------------ pgbouncer

# PgBouncer in transaction mode in front of our Postgres: the kind of pooler teams put before
# Postgres (like RDS Proxy or Supavisor), for the tests that run idemq through one. Settings
# (pgbouncer.ini below): 127.0.0.1:$PGBOUNCER_PORT only (no unix socket), one database `idemq`
# to 127.0.0.1:$PG_PORT, SCRAM to clients and to the server with the idemq role's password,
# pool_mode = transaction, default_pool_size = 4 server connections, max_client_conn = 500.
# It needs postgres up (`up` with no service starts both); `up pgbouncer` alone does not
# start postgres. docker-compose.yml has no pgbouncer service: next to Docker's postgres,
# `up` installs and runs this one on the host (apt-get).
PGB_DSN="postgres://idemq:idemq@127.0.0.1:$PGBOUNCER_PORT/idemq?sslmode=disable"

# pgb_dir: next to pg_dir, so the `postgres` OS user can read it (root runs pgbouncer as it).
pgb_dir() { echo "$(dirname "$(pg_dir)")/pgbouncer"; }

pgbouncer_bin() {
  local b
  for b in /usr/sbin/pgbouncer "$(command -v pgbouncer 2>/dev/null)"; do
    [[ -n $b && -x $b ]] && { echo "$b"; return 0; }
  done
  return 1
}

pgb_pid() { pid_of "$(pgb_dir)/pgbouncer.pid" pgbouncer; }

# pgb_dsn_ok: a query through the pooler reaches Postgres.
pgb_dsn_ok() {
  local psql
  psql=$(psql_bin) || return 1
  [[ $(PGCONNECT_TIMEOUT=3 "$psql" "$PGB_DSN" -XAtqc 'select 1' 2>/dev/null) == 1 ]]
}

pgb_write_config() {
  local dir=$1
  cat >"$dir/pgbouncer.ini" <<EOF
; written by scripts/services.sh on each start
[databases]
idemq = host=127.0.0.1 port=$PG_PORT dbname=idemq

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
; psql sends extra_float_digits; pgx sends only user, database and application_name
ignore_startup_parameters = extra_float_digits
EOF
  printf '"idemq" "idemq"\n' >"$dir/userlist.txt"
  chmod 600 "$dir/userlist.txt"
}

up_pgbouncer() {
  local dir bin user=() rc=0
  dir=$(pgb_dir)
  if pgb_pid >/dev/null; then
    if pgb_dsn_ok; then log "already running (pid $(pgb_pid))"; return 0; fi
  elif port_open $PGBOUNCER_PORT; then
    pgb_dsn_ok || fail /dev/null "127.0.0.1:$PGBOUNCER_PORT is taken by a server where $PGB_DSN does not work"
    log "reusing the pooler already on 127.0.0.1:$PGBOUNCER_PORT (not started by this script)"
    return 0
  fi
  bin=$(pgbouncer_bin) || fail /dev/null "no pgbouncer binary"
  mkdir -p "$dir"
  pgb_write_config "$dir"
  # PgBouncer refuses to run as root: then it runs as the postgres OS user.
  if ((EUID == 0)) && id postgres >/dev/null 2>&1; then
    chown -R postgres:postgres "$dir"
    user=(-u postgres)
  fi
  log "starting PgBouncer on 127.0.0.1:$PGBOUNCER_PORT (transaction mode, 4 server connections) before 127.0.0.1:$PG_PORT"
  start_daemon "$dir/pgbouncer.pid" "$dir/pgbouncer.log" "$bin" "${user[@]}" "$dir/pgbouncer.ini" ||
    fail "$dir/pgbouncer.log" "pgbouncer did not start"
  wait_for 120 "$dir/pgbouncer.pid" pgbouncer pgb_dsn_ok || rc=$?
  ((rc == 0)) || fail "$dir/pgbouncer.log" "$PGB_DSN does not answer (is postgres up?)"
  log "ready (pid $(pgb_pid))"
}

down_pgbouncer() {
  if ! pgb_pid >/dev/null; then
    if port_open $PGBOUNCER_PORT; then log "the pooler on 127.0.0.1:$PGBOUNCER_PORT is not ours: left alone"; else log "not running"; fi
    return 0
  fi
  stop_pid pgbouncer "$(pgb_dir)/pgbouncer.pid" pgbouncer 10 >/dev/null
  log "stopped"
}

status_pgbouncer() {
  local pid
  if pid=$(pgb_pid); then
    if pgb_dsn_ok; then echo "ready    pid $pid  127.0.0.1:$PGBOUNCER_PORT  (transaction mode)"; else echo "starting pid $pid  127.0.0.1:$PGBOUNCER_PORT"; return 1; fi
  elif port_open $PGBOUNCER_PORT; then
    if pgb_dsn_ok; then echo "external 127.0.0.1:$PGBOUNCER_PORT (not started by this script; DSN works)"; else echo "blocked  127.0.0.1:$PGBOUNCER_PORT taken, $PGB_DSN does not work"; return 1; fi
  else echo "stopped"; return 1; fi
}

# answers_pgbouncer: see answers_postgres below.
answers_pgbouncer() {
  if pgb_pid >/dev/null; then
    pgb_dsn_ok || return 1
    log "already running (pid $(pgb_pid))"
  elif pgb_dsn_ok; then
    log "reusing the pooler already on 127.0.0.1:$PGBOUNCER_PORT (not started by this script; $PGB_DSN works)"
  else
    return 1
  fi
}

# ------------------------------------------------------------------------------- commands

print_env() {
  local sasl_dir rmq_lib
  sasl_dir=$(kafka_sasl_dir) rmq_lib=$(rmq_lib_dir)
  cat <<EOF
export TEST_POSTGRES_DSN='$PG_DSN'
export TEST_REDIS_ADDR=127.0.0.1:$REDIS_PORT
export TEST_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
export TEST_KAFKA_SASL_BROKERS=127.0.0.1:$KAFKA_SASL_PORT
export TEST_KAFKA_SASL_CA='$sasl_dir/tls/ca.pem'
export TEST_KAFKA_SASL_USER=$KAFKA_SASL_USER
export TEST_KAFKA_SASL_PASSWORD=$KAFKA_SASL_PASSWORD
export TEST_KAFKA_SASL_READER_USER=$KAFKA_SASL_READER_USER
export TEST_KAFKA_SASL_READER_PASSWORD=$KAFKA_SASL_READER_PASSWORD
export TEST_KAFKA_SASL_READER_PREFIX=$KAFKA_SASL_READER_PREFIX
export TEST_ROCKETMQ_NAMESRV=127.0.0.1:$NAMESRV_PORT
export TEST_ROCKETMQ_BROKER=127.0.0.1:$BROKER_PORT
export TEST_ROCKETMQ_LIB='$rmq_lib'
export TEST_PGBOUNCER_DSN='$PGB_DSN'
export TEST_PGBOUNCER_BACKEND_DSN='$PG_DSN'
EOF
}

# run_parallel ACTION SVC...: run ACTION_<svc> for each service in its own subshell.
run_parallel() {
  local action=$1 s failed=()
  shift
  local -A pids=()
  for s in "$@"; do
    rm -f "$CACHE/.failed.$s"
    # fd 9 holds the lock: close it so that the servers started below do not inherit it
    (exec 9>&-; SVC=$s; "${action}_$s") &
    pids[$s]=$!
  done
  for s in "$@"; do wait "${pids[$s]}" || failed+=("$s"); done
  ((${#failed[@]} == 0)) && return 0
  for s in "${failed[@]}"; do
    local f
    f=$(cat "$CACHE/.failed.$s" 2>/dev/null || true)
    if [[ -n $f && -s $f ]]; then
      printf '\n----- %s: last 40 lines of %s -----\n' "$s" "$f" >&2
      tail -n 40 "$f" >&2
    fi
    rm -f "$CACHE/.failed.$s"
  done
  SVC=services die "failed: ${failed[*]}"
}

# lock: one `up`/`down` at a time (flock(1) is util-linux: where there is none, e.g. macOS, no lock).
lock() {
  exec 9>"$CACHE/.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
}

# Sourced (scripts/topology/kafka.sh does, for kafka_pom, fetch_jars, find_java and the process
# helpers): define everything above, run nothing.
(return 0 2>/dev/null) && return 0

cmd=${1:-}
[[ $# -gt 0 ]] && shift
services=("$@")
((${#services[@]})) || services=("${ALL_SERVICES[@]}")
for s in "${services[@]}"; do
  [[ " ${ALL_SERVICES[*]} " == *" $s "* ]] || { echo "unknown service: $s (one of: ${ALL_SERVICES[*]})" >&2; exit 2; }
done

case $cmd in
  up)
    mkdir -p "$CACHE"
    lock
    # First, per service: does it already answer on its port? Then it is used as it is, and
    # nothing is installed or started for it.
    need=() RMQ_FETCH_JARS=
    for s in "${services[@]}"; do
      SVC=$s
      "answers_$s" || need+=("$s")
    done
    SVC=services
    if ((${#need[@]})); then
      # RocketMQ refuses writes once its disk is over 90 % full, and Kafka/Postgres fail late.
      read -r disk_pct disk_avail < <(df -Pk "$CACHE" | awk 'NR == 2 {sub("%", "", $5); print $5, int($4 / 1024)}')
      if ((disk_pct >= 85 || disk_avail < 2048)); then
        log "WARNING: the disk holding $CACHE is ${disk_pct}% full (${disk_avail} MiB free); brokers may refuse writes"
      fi
      ensure_packages "${need[@]}"
      JAVA=
      if [[ " ${need[*]} " == *" kafka "* || " ${need[*]} " == *" rocketmq "* ]]; then
        find_java || die "no Java 17+ found"
      fi
      run_parallel up "${need[@]}"
    fi
    if [[ -n $RMQ_FETCH_JARS ]]; then
      ensure_packages rocketmq
      find_java || die "no Java 17+ found (needed to fetch the RocketMQ jars with Maven)"
      (SVC=rocketmq; fetch_jars "$RMQ_DIR" "$(rmq_pom)") || die "could not fetch the RocketMQ jars into $RMQ_DIR/lib"
    fi
    log "all up: ${services[*]}"
    print_env
    ;;
  down)
    [[ -d $CACHE ]] || { echo "nothing to stop ($CACHE does not exist)"; exit 0; }
    lock
    run_parallel down "${services[@]}"
    ;;
  status)
    rc=0
    for s in "${services[@]}"; do
      printf '%-9s' "$s"
      "status_$s" || rc=1
    done
    exit $rc
    ;;
  env) print_env ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    [[ -z $cmd || $cmd == -h || $cmd == --help || $cmd == help ]] || exit 2
    ;;
esac
