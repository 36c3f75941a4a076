#!/usr/bin/env bash
# Brings the whole BoxOffice stack up on this machine: Redis, PostgreSQL, the
# Kafka-protocol broker, the fake payment provider, the order service, a ticket worker, the admission
# service and the gateway, with a demo event. Ctrl-C stops it all.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

RUN=.run
mkdir -p "$RUN/keys" "$RUN/logs"
PIDS=()
cleanup() {
  trap - INT TERM EXIT
  say "stopping"
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  stop_pid "${KAFKA_PID:-}"
}
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

ensure_redis
ensure_redis_aof
ensure_postgres
start_kafka "$RUN/kafka"

psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'boxoffice'" | grep -q 1 \
  || { say "creating database boxoffice"; psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE boxoffice"; }

# Dev secrets, made once and kept in .run/keys (never committed).
[ -f "$RUN/keys/signing.pem" ] || openssl genpkey -algorithm ed25519 -out "$RUN/keys/signing.pem"
[ -f "$RUN/keys/queue.secret" ] || openssl rand -hex 32 >"$RUN/keys/queue.secret"
[ -f "$RUN/keys/admin.token" ] || openssl rand -hex 16 >"$RUN/keys/admin.token"
for secret in service.token payment.key ticket.secret; do
  [ -f "$RUN/keys/$secret" ] || openssl rand -hex 32 >"$RUN/keys/$secret"
done
export BOXOFFICE_ADMIN_TOKEN=${BOXOFFICE_ADMIN_TOKEN:-$(cat "$RUN/keys/admin.token")}
export BOXOFFICE_SIGNING_KEY=$RUN/keys/signing.pem
export BOXOFFICE_QUEUE_SECRET=$(cat "$RUN/keys/queue.secret")
export BOXOFFICE_SERVICE_TOKEN=$(cat "$RUN/keys/service.token")
export PAYMENT_API_KEY=$(cat "$RUN/keys/payment.key")
export BOXOFFICE_TICKET_SECRET=$(cat "$RUN/keys/ticket.secret")
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/boxoffice
export REDIS_URL=redis://127.0.0.1:6379
export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
export_tansu_client_options
export_single_broker_topics
export RUST_LOG=${RUST_LOG:-info}

say "building the services (release)"
cargo build --release --locked --bin gateway --bin admission --bin order-service
BIN=target/release

start() { # name command...
  local name=$1; shift
  "$@" >"$RUN/logs/$name.log" 2>&1 &
  PIDS+=($!)
}
start payment-provider "$BIN/order-service" payment-provider
wait_port 8084 30 payment-provider
start order-service "$BIN/order-service" serve
wait_port 8082 60 order-service
start worker "$BIN/order-service" worker
start admission "$BIN/admission" serve
start gateway "$BIN/gateway"
wait_port 8081 30 admission
wait_port 8080 30 gateway

say "creating the demo event 'demo' (100 seats, 5 fans/s admitted)"
opens_at=$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)
curl -fsS -X PUT "http://127.0.0.1:8081/admin/v1/events/demo" \
  -H "Authorization: Bearer $BOXOFFICE_ADMIN_TOKEN" -H 'Content-Type: application/json' \
  -d "{\"name\":\"BoxOffice demo\",\"capacity\":100,\"opens_at\":\"$opens_at\",\"admission_rate_per_s\":5,\"max_active\":50,\"access_ttl_s\":300,\"per_fan_limit\":4,\"price_cents\":4500}" \
  >/dev/null

cat <<MSG

BoxOffice is up.
  Fan page:              http://127.0.0.1:8080/?event=demo
  Fan API (gateway):     http://127.0.0.1:8080/v1/events/demo
  JWKS:                  http://127.0.0.1:8080/.well-known/jwks.json
  Ops dashboard:         http://127.0.0.1:8081/admin/?event=demo  (enter the admin token)
  Admin API:             http://127.0.0.1:8081/admin/v1/events/demo
  Admin token:           $BOXOFFICE_ADMIN_TOKEN
  OpenAPI:               http://127.0.0.1:8080/openapi.json  and  http://127.0.0.1:8081/openapi.json
  Metrics:               http://127.0.0.1:{8080,8081,8082,8083}/metrics
  Payment provider:      http://127.0.0.1:8084/v1/knobs  (fake; PUT knobs with Authorization: Bearer \$(cat $RUN/keys/payment.key))
  Logs:                  $RUN/logs/
Try: curl -s -X POST http://127.0.0.1:8080/v1/events/demo/queue -H 'Content-Type: application/json' -d '{}'
Ctrl-C stops everything.
MSG
wait -n "${PIDS[@]}" || true
say "a service exited; see $RUN/logs/"
