#!/usr/bin/env bash
# The gateway's own instructions per request, with and without its protective
# layers, and a bare axum handler's doing the one Redis command each needs
# (the edge benchmark's baselines), for the status poll and the join
# (gateway/benches/edge_cost.rs under valgrind's callgrind: nearly the same
# figure on a busy machine as on a quiet one: about 0.3 % apart run to run).
#
#   scripts/edge_cost.sh [REQUESTS]     # default 2000
#
# BENCH_LOG=warn (say) measures with no `info` lines; BENCH_LOG_JSON=true
# with the JSON log lines of k8s/ (default: the plain text of compose).
#
# Each figure is (instructions for 2×REQUESTS − for REQUESTS) / REQUESTS,
# counted from the first request to the last, so start-up, set-up and
# clean-up are left out. Leaves out the kernel, hyper's connection
# handling and Redis's own CPU: the edge benchmark measures those.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

N=${1:-2000}
command -v valgrind >/dev/null || { say "installing valgrind (Debian)"; apt-get install -y -qq valgrind >/dev/null; }
ensure_redis
bench=$(cargo bench --locked -p gateway --bench edge_cost --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "edge_cost" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# instructions KIND SERVE REQUESTS: the run's total instruction count.
instructions() {
  rm -f "$out"/cg*
  BENCH_KIND=$1 BENCH_SERVE=$2 BENCH_REQUESTS=$3 valgrind --tool=callgrind \
    --zero-before='*measuring_starts*' --dump-before='*measuring_ends*' \
    --callgrind-out-file="$out/cg" "$bench" >/dev/null 2>"$out/err" ||
    { cat "$out/err" >&2; exit 1; }
  # The part dumped at measuring_ends: from the first request to the last;
  # and of it, SHA-256's (the tokens' HMAC).
  local total sha
  total=$(sed -n 's/^summary: //p' "$out/cg.1")
  sha=$(callgrind_annotate --threshold=100 "$out/cg.1" | sed -n 's/^ *\([0-9,]*\) .*sha256::compress256.*/\1/p' | tr -d , | head -n1)
  echo "$total ${sha:-0}"
}

printf '%-8s %10s %10s %10s %10s %16s %12s\n' request gateway "(SHA-256)" "no layers" baseline \
  "baseline share" "(no layers)"
for kind in status join; do
  declare -A per sha
  for serve in gateway bare baseline; do
    read -r one one_sha <<<"$(instructions "$kind" "$serve" "$N")"
    read -r two two_sha <<<"$(instructions "$kind" "$serve" "$((2 * N))")"
    per[$serve]=$(( (two - one) / N ))
    sha[$serve]=$(( (two_sha - one_sha) / N ))
  done
  printf '%-8s %10s %10s %10s %10s %15.0f%% %11.0f%%\n' "$kind" "${per[gateway]}" \
    "${sha[gateway]}" "${per[bare]}" "${per[baseline]}" \
    "$(python3 -c "print(100 * ${per[baseline]} / ${per[gateway]})")" \
    "$(python3 -c "print(100 * ${per[baseline]} / ${per[bare]})")"
done
cat <<END
Instructions per request ($N and $((2 * N)) requests per run, callgrind), from
the first request to the last. (SHA-256): the part spent hashing the tokens'
HMAC, in software under valgrind; natively it runs on the CPU's SHA
instructions where it has them, for a fraction of that. Baseline share: the
baseline's instructions over the gateway's, what the req/s ratio would be if
user-space CPU were all that counted (the kernel's socket work is the same
for both, so the measured ratio is higher).
END
