#!/usr/bin/env bash
# Redis's own instructions for the join script (gateway/src/join.lua), a call
# and a fan, for calls of 1, 6 and 16 new fans (6 is about what the edge
# benchmark's fixed rate puts in a call), against a bare ZADD of one new
# member (the edge benchmark's baseline for the join): a Redis of its own
# under valgrind's callgrind, fed by redis-benchmark over one connection.
# Instructions, unlike Redis's CPU time, come out nearly the same on a busy machine:
# the script's figures within 0.3 % run to run here, the bare ZADD's within
# about 5 % (its random members' lengths and skip-list levels).
#
#   scripts/join_script_cost.sh [CALLS]     # default 2000 calls a figure
#
# Each figure counts every instruction of the Redis process from the first
# call to the last (callgrind zeroed after 500 calls of warm-up, dumped at
# the end), network handling included, over a line of 100,000 fans. It
# leaves out the kernel and what the cache misses of a larger line cost:
# the edge benchmark measures those.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

N=${1:-2000}
command -v valgrind >/dev/null || { say "installing valgrind (Debian)"; apt-get install -y -qq valgrind >/dev/null; }
command -v redis-benchmark >/dev/null || { say "installing redis-tools (Debian)"; apt-get install -y -qq redis-tools >/dev/null; }
out=$(mktemp -d)
valgrind_pid=
trap '[ -n "$valgrind_pid" ] && kill "$valgrind_pid" 2>/dev/null; rm -rf "$out"' EXIT

# instructions COMMAND...: Redis's instructions for N of the command (its
# arguments as redis-benchmark takes them: __rand_int__ a new number each),
# into $count. Called as a command, not in $(...), so that a step that fails
# stops the script and the trap stops this Redis.
instructions() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  rm -f "$out"/cg*
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$out/log" 2>&1 &
  valgrind_pid=$!
  wait_port "$port" 60 "redis-server under valgrind" >/dev/null
  redis-cli -p "$port" eval "for i = 1, 100000, 1000 do local a = {}
    for j = i, i + 999 do a[#a + 1] = j; a[#a + 1] = 'filler-' .. j end
    redis.call('ZADD', KEYS[1], unpack(a)) end" 1 q >/dev/null
  redis-cli -p "$port" -x script load <gateway/src/join.lua >/dev/null
  redis-benchmark -p "$port" -n 500 -c 1 -r 100000000 -q "$@" >/dev/null
  callgrind_control -z "$valgrind_pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$N" -c 1 -r 100000000 -q "$@" >/dev/null
  callgrind_control -d "$valgrind_pid" >/dev/null 2>&1
  # redis-benchmark goes on past an error answer: none may have come.
  if redis-cli -p "$port" info errorstats | grep -q '^errorstat_'; then
    redis-cli -p "$port" info errorstats >&2
    exit 1
  fi
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$valgrind_pid" 2>/dev/null || true
  valgrind_pid=
  # The part dumped on demand: from after the warm-up to the last call.
  count=$(callgrind_annotate "$out/cg.1" | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
  [ -n "$count" ] || { echo "no instruction count in callgrind's dump" >&2; exit 1; }
}

sha=$(python3 -c 'import hashlib,sys; print(hashlib.sha1(open(sys.argv[1],"rb").read()).hexdigest())' gateway/src/join.lua)
printf 'Redis %s, %s calls a figure, callgrind\n' "$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')" "$N"
printf '%-44s %12s %12s %10s\n' call instructions "a fan" "vs ZADD"
instructions ZADD q 1700000000000 'f:__rand_int__'
zadd=$count
printf '%-44s %12d %12d %9.2fx\n' "bare ZADD of a new member" $((zadd / N)) $((zadd / N)) 1
for fans in 1 6 16; do
  args=()
  for i in $(seq "$fans"); do args+=("f$i:__rand_int__"); done
  # As the gateway calls it once the line is open (see join.lua's ARGV).
  instructions EVALSHA "$sha" 4 q seq active joins 1700000000000 100000000 0 0 "${args[@]}"
  total=$count
  printf '%-44s %12d %12d %9.2fx\n' "join.lua, $fans new fan(s) a call" $((total / N)) $((total / N / fans)) \
    "$(python3 -c "print($total / $fans / $zadd)")"
done
