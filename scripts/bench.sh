#!/usr/bin/env bash
# Runs every BoxOffice benchmark, each beside the baseline it measures in the
# same run, and a short load-test `sale` against the whole stack, then writes
# target/bench/BENCHMARKS.md with the figures, the machine and the commands.
# It leaves the repository's BENCHMARKS.md alone: that file quotes such
# reports with what each run says written beside it, by hand.
#
#   scripts/bench.sh              # everything (about 10-15 minutes on 2 cores)
#   scripts/bench.sh edge tokens  # only these: edge cost tokens purchase pipeline workers idle sale
#
# Starts what it needs like scripts/test.sh (Redis, PostgreSQL, the broker);
# the `idle` and `sale` steps bring the stack up with scripts/up.sh on ports
# 8080-8084.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_redis
ensure_postgres
command -v wrk >/dev/null || { say "installing wrk (Debian package) for the edge benchmark"; apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
command -v pgbench >/dev/null || { say "installing pgbench (Debian package postgresql-contrib)"; apt-get update -qq && apt-get install -y -qq postgresql-contrib >/dev/null; }
# The broker starts only for the steps that use it: idle, it still takes a
# share of a core that the edge and token figures would otherwise compete with.
KAFKA_PID=
kafka() { [ -n "$KAFKA_PID" ] || port_open "$KAFKA_PORT" || start_kafka .run/bench-kafka; }
UP_PID=
cleanup() {
  [ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
  stop_pid "${KAFKA_PID:-}"
}
trap cleanup EXIT

export REDIS_URL=redis://127.0.0.1:6379
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
# The services' request logs would cost the benchmarks CPU and fill the report.
export RUST_LOG=${RUST_LOG:-warn}

STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(edge cost limiters tokens purchase pipeline workers idle sale)
OUT=target/bench
mkdir -p "$OUT"

# step NAME COMMAND...: runs a benchmark, keeps its output, its command and
# when it ran (date and commit) for the report, so a section kept from an
# earlier run of a single step still says where it comes from.
step() {
  local name=$1; shift
  say "$name: $*"
  printf '%s\n' "$*" >"$OUT/$name.cmd"
  printf '%s at commit `%s`\n' "$(date -u +%Y-%m-%d)" "$(git rev-parse --short HEAD)" >"$OUT/$name.when"
  "$@" 2>"$OUT/$name.err" | tee "$OUT/$name.out"
}

for s in "${STEPS[@]}"; do
  case $s in
    edge) step edge cargo bench --locked -p gateway --bench edge ;;
    cost) step cost scripts/edge_cost.sh ;;
    limiters) step limiters cargo bench --locked -p gateway --bench limiter_growth ;;
    tokens) step tokens cargo bench --locked -p boxoffice-contract --bench tokens ;;
    purchase) kafka; step purchase cargo bench --locked -p gateway --bench purchase ;;
    pipeline) kafka; step pipeline cargo bench --locked -p order-service --bench pipeline ;;
    workers) kafka; step workers cargo bench --locked -p order-service --bench workers ;;
    idle)
      # The whole stack with one demo event and no fans: what it costs the
      # machine (and every benchmark beside it) doing nothing.
      kafka
      say "idle: bringing the stack up (scripts/up.sh)"
      scripts/up.sh >"$OUT/up-idle.log" 2>&1 &
      UP_PID=$!
      wait_port 8080 600 gateway
      for _ in $(seq 1 100); do curl -fs http://127.0.0.1:8081/readyz >/dev/null && break; sleep 0.2; done
      sleep "${IDLE_SETTLE_S:-20}" # let start-up work (migrations, topic creation, the first samples) pass
      step idle python3 scripts/idle_cpu.py --seconds "${IDLE_SECONDS:-10}" || true
      kill "$UP_PID" 2>/dev/null; wait "$UP_PID" 2>/dev/null || true; UP_PID=
      ;;
    sale)
      kafka
      cargo build --release --locked --bin loadtest
      say "sale: bringing the stack up (scripts/up.sh)"
      scripts/up.sh >"$OUT/up.log" 2>&1 &
      UP_PID=$!
      wait_port 8080 600 gateway
      for _ in $(seq 1 100); do curl -fs http://127.0.0.1:8081/readyz >/dev/null && break; sleep 0.2; done
      BOXOFFICE_ADMIN_TOKEN=$(cat .run/keys/admin.token) PAYMENT_API_KEY=$(cat .run/keys/payment.key) \
        DATABASE_URL=postgres://postgres@127.0.0.1:5432/boxoffice \
        step sale target/release/loadtest --profile sale --report-dir "$OUT/sale" --progress-s 0 \
          --no-print-metrics || true
      kill "$UP_PID" 2>/dev/null; wait "$UP_PID" 2>/dev/null || true; UP_PID=
      ;;
    *) echo "unknown step $s (edge cost limiters tokens purchase pipeline workers idle sale)" >&2; exit 2 ;;
  esac
done

say "writing $OUT/BENCHMARKS.md"
{
  echo "# BoxOffice benchmarks"
  echo
  echo "Written by \`scripts/bench.sh\` on $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD)\`; each section says when it ran."
  echo "Every figure is printed by the benchmark beside a baseline measured in the same run on the"
  echo "same machine, so ratios are comparable across machines while absolute figures are not."
  echo "The load generator runs on the same machine as the system under test. The Kafka-protocol"
  echo "broker runs only during the steps that use it (purchase, pipeline, workers, idle, sale)."
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB memory,"\
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -sr)."
  echo
  cat <<'TABLE'
| benchmark | measures | against |
| --- | --- | --- |
| `cargo bench -p gateway --bench edge` | join and status with every protective layer at their default limits, load spread over many addresses and fans: at saturation (wrk, three rounds, medians), at a fixed rate (open model, p99: each round's and over all rounds' requests pooled; and the CPU a request of the server and Redis, read slice by slice as the servers take turns), and without the layers (A/B); Redis memory for 1,000,000 queued fans | a bare axum handler doing one ZRANK (status) or one ZADD of a new member (join), and for the join also one doing the join script (its own one round trip); a bare sorted set of the same ids |
| `scripts/edge_cost.sh` | the gateway's own instructions per join and status (callgrind), with and without the layers: the same on a busy machine, so a change of 1 % shows | the same baselines |
| `cargo bench -p gateway --bench limiter_growth` | the longest wait of a rate-limit check while a spike's new keys grow the limiter's map, and the sweep of its idle keys; one check's cost; how late tasks on the runtime wake while the sweep runs | the same map with `dashmap`'s default shards; the per-fan limit's fixed table; the sweep in a task on a worker |
| `cargo bench -p boxoffice-contract --bench tokens` | queue, access and order tokens signed and verified | raw Ed25519 |
| `cargo bench -p gateway --bench purchase` | the token work's share of a purchase's CPU | the whole purchase (gateway, order service, Redis, PostgreSQL) |
| `cargo bench -p order-service --bench pipeline` | confirmed orders/s through the saga; relay events/s | `pgbench` running the same SQL; a raw rdkafka producer with the same settings |
| `cargo bench -p order-service --bench workers` | worker pool throughput and burst drain time | c/S and N/(c/S) (Little's law) |
| `scripts/idle_cpu.py` | CPU per process of the whole stack (scripts/up.sh, one demo event, no fans) over 10 s | under 5 % of one core in total |
| `loadtest --profile sale` | the whole sale under the default thresholds ([docs/load-testing.md](docs/load-testing.md)) | the verdict |

`scripts/bench.sh` runs them all; `scripts/bench.sh edge tokens` only those
steps (`edge cost limiters tokens purchase pipeline workers idle sale`), keeping the other
sections from their last run (in `target/bench/`).

TABLE
  for s in edge cost limiters tokens purchase pipeline workers idle sale; do
    [ -f "$OUT/$s.out" ] || continue
    case $s in
      edge) echo "## Edge: join and status vs axum + one ZADD / ZRANK" ;;
      cost) echo "## Edge cost: instructions per request (callgrind)" ;;
      limiters) echo "## Limiters: a request's wait while a spike's new keys come in" ;;
      tokens) echo "## Tokens: sign and verify vs raw Ed25519" ;;
      purchase) echo "## The token share of a purchase" ;;
      pipeline) echo "## Purchase pipeline vs pgbench; outbox relay vs a raw producer" ;;
      workers) echo "## Ticket worker pool vs c/S" ;;
      idle) echo "## Idle: CPU of the whole stack with nothing to do" ;;
      sale) echo "## Load test: a short \`sale\` against the whole stack (scripts/up.sh)" ;;
    esac
    echo
    when=
    [ -f "$OUT/$s.when" ] && when=" (run on $(cat "$OUT/$s.when"))"
    echo "Command: \`$(cat "$OUT/$s.cmd")\`$when"
    echo
    if [ "$s" = sale ] && [ -f "$OUT/sale/summary.md" ]; then
      sed 's/^# /### /; s/^## /#### /' "$OUT/sale/summary.md"
    else
      echo '```'
      grep -v $'\e\\[' "$OUT/$s.out" || true # any log line that slipped through
      echo '```'
    fi
    echo
  done
} >"$OUT/BENCHMARKS.md"
say "$OUT/BENCHMARKS.md written"
