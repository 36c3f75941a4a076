#!/usr/bin/env python3
"""A callgrind dump's instructions by source file, inlined code under its own.

With full LTO the gateway's layers, hyper's and tower's code are inlined into
a few large functions, so callgrind's per-function counts say little. Built
with line tables, each instruction still names the source line it came
from, inlined or not; this sums each line's own instructions (not what it
calls) by that line's file, so an inlined `HeaderMap::insert` counts under
`http/src/header/map.rs` wherever it was inlined. With `--minus`, what one
dump has over another: the gateway's layers, as the gateway's dump over the
dump of its routes without them.

    CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=target/lines \\
      cargo bench --locked -p gateway --bench edge_cost --no-run
    BENCH_KIND=status BENCH_SERVE=gateway BENCH_REQUESTS=4000 valgrind \\
      --tool=callgrind --zero-before='*measuring_starts*' \\
      --dump-before='*measuring_ends*' --callgrind-out-file=gw target/lines/release/deps/edge_cost-HASH
    (the same with BENCH_SERVE=bare, into bare)
    scripts/callgrind_files.py gw.1 --minus bare.1 --per 4000

Reads callgrind's format 1 (https://valgrind.org/docs/manual/cl-format.html):
compressed names, `fi=`/`fe=` for inlined code, and the cost line after
`calls=`, which is the call's inclusive cost and is not the caller's own.
"""

import argparse
import re
import sys
from collections import Counter

# Which namespace of compressed names each specification uses.
FILE_SPECS = ("fl", "fi", "fe", "cfi", "cfl", "jfi")
FUNCTION_SPECS = ("fn", "cfn", "jfn")
OBJECT_SPECS = ("ob", "cob")
NAME = re.compile(r"\((\d+)\)(?: (.*))?$")


def by_file(lines):
    """{source file: its lines' own first event (instructions)} of one dump."""
    names = {"file": {}, "function": {}, "object": {}}
    positions = 1
    function_file = current = "???"
    after_call = False
    costs = Counter()

    def name(space, value):
        m = NAME.match(value)
        if not m:
            return value
        if m.group(2) is not None:
            names[space][m.group(1)] = m.group(2)
        return names[space].get(m.group(1), "???")

    for line in lines:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        first = line[0]
        if first.isdigit() or first in "+-*":
            if after_call:
                after_call = False
                continue
            fields = line.split()
            if len(fields) > positions:
                costs[current] += int(fields[positions])
            continue
        spec, _, value = line.partition("=")
        if spec == "calls":
            after_call = True
        elif spec == "fl":
            function_file = current = name("file", value)
        elif spec in ("fi", "fe"):
            current = name("file", value)
        elif spec == "fn":
            name("function", value)
            current = function_file
        elif spec in FILE_SPECS:
            name("file", value)
        elif spec in FUNCTION_SPECS:
            name("function", value)
        elif spec in OBJECT_SPECS:
            name("object", value)
        elif line.startswith("positions:"):
            positions = len(line.split(":", 1)[1].split())
    return costs


def short(path):
    """A file's path without the registry's or the toolchain's prefix."""
    path = re.sub(r".*/registry/src/[^/]+/", "", path)
    return re.sub(r"^/rustc/[0-9a-f]+/library/", "std: ", path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump")
    parser.add_argument("--minus", help="a second dump, to show what the first has over it")
    parser.add_argument("--per", type=int, default=1, help="divide by this (the requests)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.per < 1:
        parser.error("--per must be at least 1")
    with open(args.dump, errors="replace") as f:
        costs = by_file(f)
    base = Counter()
    if args.minus:
        with open(args.minus, errors="replace") as f:
            base = by_file(f)
    files = set(costs) | set(base)
    rows = sorted(files, key=lambda k: (-(costs[k] - base[k]), k))
    total = sum(costs.values()) - sum(base.values())
    what = "over the second dump" if args.minus else "in all"
    per = f", over {args.per:,}" if args.per > 1 else ""
    print(f"instructions {what}{per}: {total / args.per:,.0f}")
    header = ("difference", "first", "second") if args.minus else ("instructions",)
    print(" ".join(f"{h:>12}" for h in header) + "  file")
    for k in rows[: args.top]:
        figures = [costs[k] - base[k], costs[k], base[k]] if args.minus else [costs[k]]
        print(" ".join(f"{v / args.per:12,.0f}" for v in figures) + f"  {short(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
