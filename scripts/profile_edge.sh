#!/usr/bin/env bash
# Profiles the gateway under the edge benchmark's load and writes flame graphs.
#
#   scripts/profile_edge.sh [PHASE...]   # default: status-gateway join-gateway, in the benchmark's order
#
# Runs `cargo bench -p gateway --bench edge` with longer phases and, when the
# benchmark announces a phase on stderr, records the whole machine for 8 s
# (`perf record -a --call-graph dwarf`: attaching to the one process records
# nothing on some VMs, and frame pointers would need every crate rebuilt).
# Writes docs/perf/PHASE.svg (the benchmark process's threads only: the
# gateway) and prints its top frames by self time; the recordings, folded
# stacks and target/perf/PHASE-machine.svg (every process: wrk, Redis, the
# kernel) stay in target/perf/.
# Needs Debian's linux-perf and inferno's tools (`cargo install inferno`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(status-gateway join-gateway)
command -v perf >/dev/null || { say "installing linux-perf (Debian)"; apt-get install -y -qq linux-perf >/dev/null; }
command -v inferno-flamegraph >/dev/null || { say "installing inferno (crates.io)"; cargo install --locked inferno >/dev/null; }
ensure_redis
OUT=docs/perf
WORK=target/perf # the recordings and folded stacks, kept for a closer look
trap 'kill "${BENCH_PID:-}" 2>/dev/null || true' EXIT
mkdir -p "$WORK"
mkdir -p "$OUT"

cargo bench --locked -p gateway --bench edge --no-run 2>/dev/null
BENCH_ROUNDS=1 BENCH_SECONDS=20 BENCH_FANS=10000 cargo bench --locked -p gateway --bench edge \
  >"$WORK/bench.out" 2>"$WORK/bench.err" &
BENCH_PID=$!
for phase in "${PHASES[@]}"; do
  until grep -q "^phase $phase\$" "$WORK/bench.err"; do
    kill -0 "$BENCH_PID" 2>/dev/null || { cat "$WORK/bench.err" >&2; echo "no phase $phase" >&2; exit 1; }
    sleep 0.2
  done
  # A phase already over would be recorded during a later one.
  current=$(grep '^phase ' "$WORK/bench.err" | tail -n1)
  [ "$current" = "phase $phase" ] || { echo "phase $phase is over ($current): give phases in the benchmark's order" >&2; exit 1; }
  sleep 3 # past wrk's connection set-up
  # The benchmark process (not the open-model client, which is the same
  # binary but runs only in the fixed-rate phases).
  pid=$(pgrep -f '/deps/edge-[0-9a-f]+( |$)' | head -1)
  say "recording $phase (benchmark process $pid)"
  perf record -a -F 499 --call-graph dwarf,16384 -o "$WORK/$phase.data" -- sleep 8 2>/dev/null
  echo "$pid" >"$WORK/$phase.pid"
done
# Folded only once every phase is recorded: perf script takes minutes.
for phase in "${PHASES[@]}"; do
  pid=$(cat "$WORK/$phase.pid")
  perf script -i "$WORK/$phase.data" 2>/dev/null | inferno-collapse-perf >"$WORK/$phase.folded"
  inferno-flamegraph --title "$phase: whole machine" <"$WORK/$phase.folded" >"$WORK/$phase-machine.svg"
  # The gateway: the benchmark process's threads.
  perf script -i "$WORK/$phase.data" --pid "$pid" 2>/dev/null | inferno-collapse-perf >"$WORK/$phase.gateway"
  inferno-flamegraph --title "$phase: the gateway's threads" <"$WORK/$phase.gateway" >"$OUT/$phase.svg"
  total=$(awk '{s += $NF} END {print s}' "$WORK/$phase.folded")
  ours=$(awk '{s += $NF} END {print s}' "$WORK/$phase.gateway")
  echo "$phase: the gateway's threads took $((100 * ours / total)) % of the machine's samples; top frames by self time:"
  awk '{n = $NF; sub(/ [0-9]+$/, ""); k = split($0, f, ";"); self[f[k]] += n; s += n}
       END {for (x in self) printf "%6.2f%%  %s\n", 100 * self[x] / s, x}' "$WORK/$phase.gateway" |
    sort -rn | head -25 || true
done
wait "$BENCH_PID" || true
say "flame graphs in $OUT/"
