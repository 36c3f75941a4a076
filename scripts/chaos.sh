#!/usr/bin/env bash
# The chaos suite: breaks processes and servers on purpose while the load test
# offers fans at a steady rate, then judges each scenario by the load test's
# verdict (the invariants, read from PostgreSQL and the payment provider) and
# by what fans saw (no 5xx outside the fault window).
#
#   scripts/chaos.sh                 every scenario, release build; rewrites the
#                                    table in docs/reliability.md
#   scripts/chaos.sh --quick         the short CI set, debug build, small numbers
#   scripts/chaos.sh --self-check    a deliberately broken ticket worker (dedup on
#                                    the wrong key): the verdict must say FAIL
#   scripts/chaos.sh kill-worker ... only the scenarios named (`baseline`: no
#                                    fault, the control)
#
# Everything runs on this machine: its own Redis (AOF) on 16379, its own tansu
# broker on 19192, a fresh PostgreSQL database, and the services on 18080-18086.
# Each fault is a real signal to a real process or a real server restart.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ALL=(baseline kill-gateway kill-admission kill-order-service kill-worker
  term-gateway term-admission term-order-service term-worker
  restart-broker restart-redis restart-postgres terminate-backends
  payment-outage payment-flaky poison-duplicates two-relays-two-workers)
QUICK_SET=(kill-order-service kill-worker restart-redis payment-outage)

MODE=full
PROFILE=release
SCENARIOS=()
for arg in "$@"; do
  case $arg in
    --quick) MODE=quick; PROFILE=debug ;;
    --self-check) MODE=self-check; PROFILE=debug ;;
    --debug) PROFILE=debug ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "unknown option $arg" >&2; exit 2 ;;
    *) SCENARIOS+=("$arg") ;;
  esac
done
if [ ${#SCENARIOS[@]} -eq 0 ]; then
  case $MODE in
    full) SCENARIOS=("${ALL[@]}") ;;
    quick) SCENARIOS=("${QUICK_SET[@]}") ;;
    self-check) SCENARIOS=(kill-worker) ;;
  esac
fi

# Load per scenario: fans per second, for how long, seats, admission rate.
if [ "$MODE" = full ]; then
  RATE=10 DURATION=60 CAPACITY=1000 ADMIT=15 FAULT_AT=15 OUTAGE=20 FLAKY=60
else
  RATE=6 DURATION=30 CAPACITY=300 ADMIT=10 FAULT_AT=8 OUTAGE=10 FLAKY=15
fi
SETTLE=120s
# The broken build never settles: do not wait long for it.
[ "$MODE" = self-check ] && SETTLE=20s
# Seconds after recovery still counted as the fault. Answers are counted by
# when they came in, so one sent during the fault that times out (15 s) later
# counts as outside it: strict, it can fail a scenario, never pass one.
GRACE=5

RUN=.run/chaos
GW=18080 ADM=18081 ORD=18082 WRK=18083 PAY=18084 ORD2=18085 WRK2=18086
REDIS_PORT=16379
export KAFKA_PORT=19192
DB=boxoffice_chaos_$$
rm -rf "$RUN"
mkdir -p "$RUN/logs" "$RUN/pids" "$RUN/reports" "$RUN/redis" "$RUN/kafka" "$RUN/keys"
RESULTS=$RUN/results.jsonl
: >"$RESULTS"

say "building the services and the load test ($PROFILE)"
if [ "$PROFILE" = release ]; then
  cargo build --release --locked --bin gateway --bin admission --bin order-service --bin loadtest
else
  cargo build --locked --bin gateway --bin admission --bin order-service --bin loadtest
fi
BIN=target/$PROFILE
WORKER_BIN=$BIN/order-service
if [ "$MODE" = self-check ]; then
  say "building the deliberately broken ticket worker (dedup on the sale's id)"
  mkdir -p "$RUN/broken"
  cargo build --locked --bin order-service --features order-service/selfcheck-wrong-dedup-key
  cp "$BIN/order-service" "$RUN/broken/order-service"
  cargo build --locked --bin order-service # put the honest binary back
  WORKER_BIN=$RUN/broken/order-service
fi

ensure_postgres
ensure_tansu
openssl genpkey -algorithm ed25519 -out "$RUN/keys/signing.pem" 2>/dev/null
export BOXOFFICE_SIGNING_KEY=$RUN/keys/signing.pem
export BOXOFFICE_QUEUE_SECRET=$(openssl rand -hex 32)
export BOXOFFICE_ADMIN_TOKEN=$(openssl rand -hex 16)
export BOXOFFICE_TICKET_SECRET=$(openssl rand -hex 32)
export BOXOFFICE_SERVICE_TOKEN=$(openssl rand -hex 32)
export PAYMENT_API_KEY=$(openssl rand -hex 32)
export BOXOFFICE_TICKET_STORE=$RUN/tickets
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/$DB
export REDIS_URL=redis://127.0.0.1:$REDIS_PORT
export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
export_tansu_client_options
export_single_broker_topics
export ORDER_SERVICE_URL=http://127.0.0.1:$ORD
export PAYMENT_URL=http://127.0.0.1:$PAY
export RUST_LOG=${RUST_LOG:-info,librdkafka=warn,rdkafka=warn}

psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $DB"

# Processes, by name; each restartable with the command it was started with.
declare -A CMD
start() { # name command...
  local name=$1; shift
  CMD[$name]=$(printf '%q ' "$@")
  "$@" >>"$RUN/logs/$name.log" 2>&1 &
  echo $! >"$RUN/pids/$name"
}
pid_of() { cat "$RUN/pids/$1"; }
restart() { # name: the same command again
  eval "start $1 ${CMD[$1]}"
}
stop() { # name signal: signals the process and waits for it to be gone
  local pid; pid=$(pid_of "$1")
  kill "-$2" "$pid"
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  for f in "$RUN"/pids/*; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  sleep 1
  for f in "$RUN"/pids/*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>/dev/null || true
}
trap stop_all EXIT

start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" \
  --appendonly yes --appendfsync everysec --dir "$PWD/$RUN/redis"
start kafka env -C "$RUN/kafka" tansu broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" --storage-engine sqlite://tansu.db
wait_port "$REDIS_PORT" 20 Redis
wait_port "$KAFKA_PORT" 30 tansu

start payment-provider env PROVIDER_LISTEN=127.0.0.1:$PAY "$BIN/order-service" payment-provider
wait_port "$PAY" 30 payment-provider
start order-service env ORDER_SERVICE_LISTEN=127.0.0.1:$ORD "$BIN/order-service" serve
wait_port "$ORD" 60 order-service
# Static group membership, as k8s/ sets it: a restarted worker takes its old place.
start worker env WORKER_LISTEN=127.0.0.1:$WRK BOXOFFICE_WORKER_INSTANCE=worker-1 "$WORKER_BIN" worker
start admission env ADMISSION_LISTEN=127.0.0.1:$ADM "$BIN/admission" serve
start gateway env GATEWAY_LISTEN=127.0.0.1:$GW "$BIN/gateway"

ready() { # every service answers /readyz 200
  local port
  for port in "$@"; do
    curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" 2>/dev/null || return 1
  done
}
SERVICES=($GW $ADM $ORD $WRK)
wait_ready() { # seconds
  local i
  for ((i = 0; i < $1 * 10; i++)); do ready "${SERVICES[@]}" && return 0; sleep 0.1; done
  echo "the stack was not ready within $1 s" >&2
  return 1
}
wait_ready 90
say "the stack is up (logs in $RUN/logs)"

now() { date +%s.%N; }
knobs() { curl -fsS -o /dev/null -X PUT "http://127.0.0.1:$PAY/v1/knobs" -H "Authorization: Bearer $PAYMENT_API_KEY" -H 'Content-Type: application/json' -d "$1"; }
kill_and_restart() { # name signal
  local pid; pid=$(pid_of "$1")
  kill "-$2" "$pid"
  local code=0
  wait "$pid" 2>/dev/null || code=$?
  echo "$code" >"$RUN/exit-$1"
  [ "$2" = KILL ] && sleep 2
  restart "$1"
}

# fault SCENARIO: injects the fault, then writes "start end" (Unix seconds)
# to $RUN/window: from the first signal to the moment the fault was undone.
fault() {
  local start end
  start=$(now)
  case $1 in
    baseline) ;; # no fault: the control
    kill-*) kill_and_restart "${1#kill-}" KILL ;;
    term-*) kill_and_restart "${1#term-}" TERM ;;
    restart-broker)
      stop kafka TERM; sleep 3; restart kafka; wait_port "$KAFKA_PORT" 30 tansu ;;
    restart-redis)
      stop redis KILL; sleep 2; restart redis; wait_port "$REDIS_PORT" 20 Redis ;;
    restart-postgres)
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart -m fast ;;
    terminate-backends)
      for _ in 1 2 3; do
        psql -h 127.0.0.1 -U postgres -qAtc "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '$DB' AND pid <> pg_backend_pid()" >/dev/null
        sleep 1
      done ;;
    payment-outage) knobs '{"error_rate": 1.0}'; sleep "$OUTAGE"; knobs '{}' ;;
    payment-flaky) knobs '{"error_rate": 0.3, "lost_rate": 0.1, "hang_ms": 2000}'; sleep "$FLAKY"; knobs '{}' ;;
    poison-duplicates)
      # A poison message, and every confirmation so far published again.
      psql -h 127.0.0.1 -U postgres -d "$DB" -qc "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'poison', 'OrderConfirmed', '{\"not\": \"a CloudEvent\"}')"
      for _ in 1 2 3; do
        psql -h 127.0.0.1 -U postgres -d "$DB" -qc "UPDATE outbox SET published_at = NULL"
        sleep 2
      done ;;
    two-relays-two-workers)
      # The second order service (runners and relay) and worker die mid-batch.
      stop order-service-2 KILL; stop worker-2 KILL ;;
    *) echo "unknown scenario $1" >&2; exit 2 ;;
  esac
  end=$(now)
  echo "$start $end" >"$RUN/window"
}

# diagnose SCENARIO: what a failed scenario leaves for whoever reads CI's
# output alone: where the orders stopped (still in the outbox, or published
# and not ticketed), the pipeline's gauges, and each process's last warnings.
diagnose() {
  say "diagnostics for $1 (whole logs in $RUN/logs)"
  psql -h 127.0.0.1 -U postgres -d "$DB" -qAtc "SELECT 'outbox: ' || count(*) || ' rows, ' || count(*) FILTER (WHERE published_at IS NULL) || ' unpublished' FROM outbox" || true
  local port
  for port in $ORD $WRK; do
    curl -fsS --max-time 2 "http://127.0.0.1:$port/metrics" 2>/dev/null |
      grep -E '^boxoffice_(outbox|consumer|worker_(events|resubscribes|in_flight|assigned|partitions)|relay|dlq)' | sed "s/^/  :$port /" || true
  done
  local log
  for log in worker order-service kafka; do
    echo "  last warnings of $log:"
    # tansu's log carries colour codes and is large: keep its warnings, and
    # its group coordinator's evictions (logged at INFO).
    sed 's/\x1b\[[0-9;]*m//g' "$RUN/logs/$log.log" | grep -aE ' (WARN|ERROR) |missed heartbeat' | tail -n 15 | cut -c1-400 | sed 's/^/    /' || true
  done
  return 0
}

LOADTEST_ARGS=(--profile steady --rate "$RATE" --duration "${DURATION}s" --capacity "$CAPACITY"
  --admission-rate "$ADMIT" --access-ttl-s 60 --users 300 --settle "$SETTLE" --rule verdict
  --host "http://127.0.0.1:$GW" --admin-url "http://127.0.0.1:$ADM" --database-url "$DATABASE_URL"
  --payment-url "http://127.0.0.1:$PAY" --progress-s 10)

for scenario in "${SCENARIOS[@]}"; do
  say "scenario $scenario"
  if [ "$scenario" = two-relays-two-workers ]; then
    start order-service-2 env ORDER_SERVICE_LISTEN=127.0.0.1:$ORD2 "$BIN/order-service" serve
    # Without static membership: on tansu a static member joining can wedge the group.
    start worker-2 env WORKER_LISTEN=127.0.0.1:$WRK2 "$WORKER_BIN" worker
    wait_port "$ORD2" 60 order-service-2
  fi
  rm -f "$RUN/window" "$RUN"/exit-*
  report=$RUN/reports/$scenario
  # The log exists before the load test starts: the wait below reads it at once.
  : >"$RUN/logs/loadtest-$scenario.log"
  "$BIN/loadtest" "${LOADTEST_ARGS[@]}" --report-dir "$report" >>"$RUN/logs/loadtest-$scenario.log" 2>&1 &
  load=$!
  # The fault comes FAULT_AT seconds into the sale: once the run's event exists.
  for ((i = 0; i < 600; i++)); do
    event=$(sed -n 's/.*, event \([^ ]*\) .*/\1/p' "$RUN/logs/loadtest-$scenario.log" | head -n1)
    [ -n "$event" ] && curl -fsS -o /dev/null -H "Authorization: Bearer $BOXOFFICE_ADMIN_TOKEN" \
      "http://127.0.0.1:$ADM/admin/v1/events/$event" 2>/dev/null && break
    sleep 0.1
  done
  sleep "$FAULT_AT"
  fault "$scenario"
  recovered=
  for ((i = 0; i < 1200; i++)); do
    if ready "${SERVICES[@]}"; then recovered=$(now); break; fi
    sleep 0.1
  done
  code=0
  wait "$load" || code=$?
  exited=
  [ -f "$RUN/exit-${scenario#term-}" ] && exited=$(cat "$RUN/exit-${scenario#term-}")
  read -r fault_start fault_end <"$RUN/window"
  python3 scripts/chaos_judge.py row --scenario "$scenario" --summary "$report/summary.json" \
    --loadtest-exit "$code" --fault-start "$fault_start" --fault-end "$fault_end" \
    --recovered "${recovered:-}" --grace "$GRACE" --process-exit "${exited:-}" >>"$RESULTS"
  python3 scripts/chaos_judge.py line "$RESULTS"
  python3 scripts/chaos_judge.py last-passed "$RESULTS" || diagnose "$scenario"
  if [ "$scenario" = two-relays-two-workers ]; then rm -f "$RUN/pids/order-service-2" "$RUN/pids/worker-2"; fi
  wait_ready 60 || { say "the stack did not come back after $scenario"; break; }
done

say "results"
python3 scripts/chaos_judge.py table "$RESULTS" --mode "$MODE" | tee "$RUN/table.md"
if [ "$MODE" = full ] && [ ${#SCENARIOS[@]} -eq ${#ALL[@]} ]; then
  python3 scripts/chaos_judge.py table "$RESULTS" --mode "$MODE" --into docs/reliability.md
  say "docs/reliability.md updated"
fi
if [ "$MODE" = self-check ]; then
  # It must fail for the reason it was broken: orders without their tickets.
  if python3 scripts/chaos_judge.py failed-check "$RESULTS" "one ticket set per confirmed order"; then
    say "self-check: the broken worker failed the suite on its ticket sets, as it must"; exit 0
  fi
  say "SELF-CHECK FAILED: the broken worker did not fail the ticket-set check"; exit 1
fi
python3 scripts/chaos_judge.py passed "$RESULTS"
