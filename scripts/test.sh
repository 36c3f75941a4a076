#!/usr/bin/env bash
# Runs the whole BoxOffice test suite against real Redis, PostgreSQL and a
# Kafka-protocol broker, starting whichever of them is not running. Run
# without arguments (as CI does) it first checks formatting and lints, and
# ends with the short chaos suite and its self-check.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_redis
ensure_postgres
ensure_chromium
ensure_promtool
ensure_s3s_fs
start_kafka .run/test-kafka
trap 'stop_pid "$KAFKA_PID"' EXIT

export REDIS_URL=redis://127.0.0.1:6379
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
if [ $# -eq 0 ]; then
  say "checking formatting and lints (cargo fmt, clippy -D warnings, pyflakes), the scripts' unit tests"
  ensure_rust_components
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
  ensure_pyflakes
  pyflakes3 scripts/*.py
  python3 -m unittest discover -s scripts -p 'test_*.py'
  say "checking the Kubernetes manifests"
  ensure_kubernetes_validate
  cargo build --locked --bin gateway --bin admission --bin order-service
  python3 scripts/check_manifests.py
  say "checking compose.yaml (statically, then its services run natively)"
  ensure_docker_compose_v1
  python3 scripts/check_compose.py --run
  say "checking that the SQL's offline data in .sqlx/ is current"
  sqlx_offline_data --check
fi
say "running the tests"
cargo test --workspace --locked "$@"
if [ $# -eq 0 ]; then
  say "running the short chaos suite"
  scripts/chaos.sh --quick
  say "checking that the chaos suite can fail"
  scripts/chaos.sh --self-check
fi
