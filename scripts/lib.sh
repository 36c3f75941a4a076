# Helpers shared by scripts/up.sh and scripts/test.sh. Source it; do not run it.
# Each helper checks before it acts, so running it twice is harmless.

export PATH="$HOME/.cargo/bin:$PATH"
TANSU_VERSION=0.6.0
# 0.14.1 is the last s3s-fs that builds with Rust 1.95 (0.15 wants 1.96).
S3S_FS_VERSION=0.14.1
KAFKA_PORT=${KAFKA_PORT:-9092}

say() { printf '==> %s\n' "$*"; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port seconds name
  local i
  for ((i = 0; i < $2 * 10; i++)); do port_open "$1" && return 0; sleep 0.1; done
  echo "$3 did not come up on port $1 within $2 s" >&2
  return 1
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
  say "starting Redis"
  command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
  mkdir -p /var/lib/redis /var/log/redis
  # AOF, fsynced every second: a restart keeps the line and the admissions
  # (at most the last second of writes is lost; see docs/reliability.md).
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" \
    --appendonly yes --appendfsync everysec \
    --dir /var/lib/redis --logfile /var/log/redis/boxoffice.log
  wait_port 6379 10 Redis
}

# ensure_redis_aof: turns on AOF (fsync every second) on a Redis that was
# already running without it, so a restart does not empty the waiting room.
ensure_redis_aof() {
  [ "$(redis-cli -h 127.0.0.1 -p 6379 config get appendonly | tail -1)" = yes ] && return
  say "turning on Redis AOF persistence (appendfsync everysec)"
  redis-cli -h 127.0.0.1 -p 6379 config set appendfsync everysec >/dev/null
  redis-cli -h 127.0.0.1 -p 6379 config set appendonly yes >/dev/null \
    || say "warning: could not turn on AOF; a Redis restart will empty the waiting room"
}

ensure_postgres() {
  if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return; fi
  say "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  wait_port 5432 20 PostgreSQL
}

ensure_tansu() {
  command -v tansu >/dev/null && return
  say "installing the Kafka-protocol broker tansu $TANSU_VERSION (once per machine; the first build takes about 10 minutes)"
  cargo install tansu --version "$TANSU_VERSION" --locked --features libsql
}

# sqlx-cli, the same version as the sqlx in Cargo.lock, for checking (and
# regenerating) the order service's compile-time query data in .sqlx/.
sqlx_cli_version() { sed -n '/^name = "sqlx"$/{n;s/^version = "\(.*\)"$/\1/p;q}' Cargo.lock; }

ensure_sqlx_cli() {
  local version
  version=$(sqlx_cli_version)
  [ "$(sqlx --version 2>/dev/null)" = "sqlx-cli $version" ] && return
  say "installing sqlx-cli $version (once per machine; the first build takes about 6 minutes)"
  cargo install sqlx-cli --version "$version" --locked --no-default-features --features postgres,native-tls
}

# sqlx_offline_data [--check]: applies the order service's migrations to a
# scratch database made afresh (boxoffice_sqlx_check, next to DATABASE_URL's)
# and prepares the query data in .sqlx/ against it; with --check, fails if
# the committed .sqlx/ is not what the statements and migrations give (a
# statement without its file, a file that differs, or a file no statement
# uses, which sqlx-cli itself only warns about).
sqlx_offline_data() {
  ensure_sqlx_cli
  local base=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
  local url=${base%/*}/boxoffice_sqlx_check out status=0
  DATABASE_URL=$url sqlx database drop -y -f >/dev/null
  DATABASE_URL=$url sqlx database create
  DATABASE_URL=$url sqlx migrate run --source order-service/migrations >/dev/null
  out=$(env -u SQLX_OFFLINE DATABASE_URL="$url" cargo sqlx prepare --workspace "$@" -- --locked) || status=$?
  [ -z "$out" ] || printf '%s\n' "$out"
  if [ "$status" -eq 0 ] && [[ $out == *"unused queries"* ]]; then
    echo "error: .sqlx/ holds query data no statement uses; regenerate it (docs/sql.md)" >&2
    status=1
  fi
  return "$status"
}

# Headless Chromium and its WebDriver, for the browser tests.
ensure_chromium() {
  command -v chromedriver >/dev/null && [ -x /usr/bin/chromium ] && return
  say "installing Chromium and chromedriver (Debian packages) for the browser tests"
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
}

# rustfmt and clippy, which a minimal Rust install lacks.
ensure_rust_components() {
  cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 && return
  say "installing the rustfmt and clippy components (rustup)"
  rustup component add rustfmt clippy
}

# pyflakes checks the Python scripts (the chaos judge) in CI.
ensure_pyflakes() {
  command -v pyflakes3 >/dev/null && return
  say "installing pyflakes (Debian package pyflakes3) for the script lint"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pyflakes3 >/dev/null
}

# promtool checks and unit-tests the Prometheus alert rules in k8s/monitoring.
ensure_promtool() {
  command -v promtool >/dev/null && return
  say "installing promtool (Debian package prometheus) for the alert-rule tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

# s3s-fs, a small S3-compatible server over a local folder (each bucket a
# folder, each object a file): order-service/tests/ticket_store.rs starts one
# to test the ticket store against real S3 requests, not a mock.
ensure_s3s_fs() {
  command -v s3s-fs >/dev/null && return
  say "installing the S3-compatible test server s3s-fs $S3S_FS_VERSION (once per machine; the first build takes a few minutes)"
  cargo install s3s-fs --version "$S3S_FS_VERSION" --locked --features binary
}

# start_kafka DATA_DIR: starts tansu with SQLite storage in DATA_DIR unless a
# broker already answers on KAFKA_PORT. Sets KAFKA_PID when it started one.
start_kafka() {
  KAFKA_PID=
  export_single_broker_topics
  if port_open "$KAFKA_PORT"; then
    say "a Kafka broker already listens on 127.0.0.1:$KAFKA_PORT; using it"
    return
  fi
  ensure_tansu
  mkdir -p "$1"
  say "starting tansu on 127.0.0.1:$KAFKA_PORT (data in $1)"
  (cd "$1" && exec tansu broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --storage-engine sqlite://tansu.db >tansu.log 2>&1) &
  KAFKA_PID=$!
  wait_port "$KAFKA_PORT" 30 tansu
}

# tansu 0.6.0's storage task dies (a panic) on an idempotent producer's epoch
# it did not hand out itself, and the broker then answers every request with
# an error until it is restarted. librdkafka bumps the epoch on its own after
# timed-out sends, as across a broker restart. So, against tansu, the services
# produce without idempotence, one request in flight per connection (the
# order per partition is kept; a retried send may be duplicated, which the
# consumers drop by event id). Apache Kafka needs none of this.
export_tansu_client_options() {
  export RDKAFKA_ENABLE_IDEMPOTENCE=${RDKAFKA_ENABLE_IDEMPOTENCE:-false}
  export RDKAFKA_MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION=${RDKAFKA_MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION:-1}
}

# The order service and the workers create their topics with replication
# factor 3 and min.insync.replicas 2 unless told otherwise (production: a
# confirmed order's message survives a broker). The local stack and the
# tests have one broker, so 1 and 1 (a value already set wins). start_kafka
# calls it, so up.sh, test.sh and bench.sh get it; chaos.sh calls it itself.
export_single_broker_topics() {
  export BOXOFFICE_KAFKA_REPLICATION_FACTOR=${BOXOFFICE_KAFKA_REPLICATION_FACTOR:-1}
  export BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS=${BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS:-1}
}

stop_pid() { [ -n "${1:-}" ] && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null; return 0; }

# kubernetes-validate (PyPI) checks k8s/ against the Kubernetes OpenAPI
# schemas, which it bundles (it works offline once installed); it brings
# jsonschema and PyYAML, which scripts/check_manifests.py also uses.
ensure_kubernetes_validate() {
  python3 -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null && return
  say "installing kubernetes-validate (pip) for the Kubernetes manifest checks"
  python3 -m pip install -q --disable-pip-version-check 'kubernetes-validate==1.37.0'
}

# docker-compose v1 (Debian's Python package) checks compose.yaml's schema
# and interpolation (`docker-compose config -q`) where Docker cannot run;
# scripts/check_compose.py uses it when it is there.
ensure_docker_compose_v1() {
  command -v docker-compose >/dev/null && return
  say "installing docker-compose v1 (Debian package) for the compose.yaml check"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
}
