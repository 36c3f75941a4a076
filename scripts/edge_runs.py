#!/usr/bin/env python3
"""The edge benchmark's goals over several whole runs, not one.

On a small shared machine one run of `cargo bench -p gateway --bench edge`
is a draw: the same build has given the join's pooled fixed-rate p99 2.85x
the ZADD's in one run and 1.29x in the next, as stalls of the machine land
on one server's turns or another's. This runs the benchmark N times (or
reads runs already kept) and prints, for each goal, every run's figure, the
median over the runs, their spread and how many runs met it:

    scripts/edge_runs.py run --runs 8 --keep target/edge-runs
    scripts/edge_runs.py run --runs 8 -- target/release/deps/edge-HASH --bench
    scripts/edge_runs.py summarize target/edge-runs/run-*.out

The benchmark's knobs (BENCH_ROUNDS, BENCH_FIXED_ROUNDS, BENCH_SECONDS,
BENCH_KINDS, BENCH_FANS, ...) pass through the environment. The figures are
the bench's own: the saturated rate's ratio (the median of the run's
rounds) and the fixed rate's p99 ratio over all the run's requests pooled.
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_COMMAND = ["cargo", "bench", "--locked", "-p", "gateway", "--bench", "edge"]

STATUS = "GET  /v1/events/{id}/queue/status"
JOIN = "POST /v1/events/{id}/queue (new fan)"
SCRIPT = "baseline: axum + the join script (EVALSHA)"
JOIN_VS_SCRIPT = "POST /v1/events/{id}/queue, vs the script"
BARE = "  the same without the protective layers"

SATURATION = "edge at saturation"
POOLED = "the fixed rate's tail over every request"

# (what, table, row, goal): a goal is (">=", x) or ("<=", x), or None for a
# figure shown beside the goals without one of its own.
FIGURES = [
    ("status, % of the ZRANK's rate", SATURATION, STATUS, (">=", 80)),
    ("  without the layers", SATURATION, STATUS + " without the layers", None),
    ("join, % of the ZADD's rate", SATURATION, JOIN, (">=", 80)),
    ("  without the layers", SATURATION, JOIN + " without the layers", None),
    ("status, p99 / the ZRANK's (pooled)", POOLED, STATUS, ("<=", 1.5)),
    ("  without the layers", POOLED, STATUS + " without the layers", None),
    ("join, p99 / the ZADD's (pooled)", POOLED, JOIN, ("<=", 1.5)),
    ("  without the layers", POOLED, JOIN + " without the layers", None),
    ("  the join script alone, / the ZADD's", POOLED, SCRIPT, None),
    ("  join, / the script alone's", POOLED, JOIN_VS_SCRIPT, None),
]


def tables(text):
    """{table title's start: {row label: its ratio (see `row`)}} of one run's output.

    A table starts at a line beginning with a known title and ends at the first
    blank line; a row "the same without the protective layers" is named after
    the row right above it, which it repeats ("... without the layers"), and is
    left out when that row is not one this script knows."""
    found, current, above = {}, None, None
    for line in text.splitlines():
        if current is None:
            title = next((t for t in (SATURATION, POOLED) if line.startswith(t)), None)
            if title is not None:
                current, above = found.setdefault(title, {}), None
            continue
        if not line.strip():
            current = None
            continue
        label, value = row(line)
        if label is None:
            above = None
            continue
        if label == BARE:
            if above is None:
                continue
            label = above + " without the layers"
        else:
            above = label
        current[label] = value
    return found


def row(line):
    """(label, ratio) of a table row, or (None, None) for its header.

    The ratio is the row's verdict column: `87% (97 77 87)` gives 87.0 and
    `1.41x` gives 1.41."""
    for label in (STATUS, JOIN, SCRIPT, JOIN_VS_SCRIPT, BARE):
        if line.startswith(label):
            rest = line[len(label):].split()
            break
    else:
        return None, None
    for word in rest:
        if word.endswith("%") and word[:-1].isdigit():
            return label, float(word[:-1])
    for word in reversed(rest):
        if word.endswith("x"):
            try:
                value = float(word[:-1])
            except ValueError:
                continue
            if math.isfinite(value):
                return label, value
    raise ValueError(f"no ratio in the row {line!r}")


def met(value, goal):
    sign, bound = goal
    return value >= bound if sign == ">=" else value <= bound


def shown(value, percent):
    """A figure as the report prints it: "-" for none. A median of two
    figures as the bench prints them (whole percentages, ratios to 0.01) can
    end in a half, which is kept rather than rounded to even."""
    if value is None:
        return "-"
    if percent:
        return f"{value:.0f}" if value == round(value) else f"{value:.1f}"
    return f"{value:.2f}" if value == round(value, 2) else f"{value:.3f}"


def summary(runs):
    """The report's lines for runs, each the `tables` of one run's output."""
    lines = [
        f"edge over {len(runs)} runs: each run's figure in order, the median over"
        " the runs, the lowest and highest, and the runs that met the goal",
        f"{'figure':<42} {'goal':>6} {'median':>7} {'range':>13} {'met':>6}  runs",
    ]
    for what, table, label, goal in FIGURES:
        values = [run.get(table, {}).get(label) for run in runs]
        seen = [v for v in values if v is not None]
        if not seen:
            continue
        percent = table == SATURATION
        show = lambda v: shown(v, percent)  # noqa: E731
        goal_text = "" if goal is None else f"{goal[0]}{goal[1]}"
        met_text = "" if goal is None else f"{sum(met(v, goal) for v in seen)}/{len(seen)}"
        spread = f"{show(min(seen))}-{show(max(seen))}"
        lines.append(
            f"{what:<42} {goal_text:>6} {show(statistics.median(seen)):>7} {spread:>13}"
            f" {met_text:>6}  {' '.join(show(v) for v in values)}"
        )
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="run the benchmark N times, then summarize")
    run.add_argument("--runs", type=int, default=5)
    run.add_argument("--keep", type=Path, help="keep each run's output here (run-K.out)")
    run.add_argument("command", nargs="*", help=f"default: {' '.join(DEFAULT_COMMAND)}")
    read = sub.add_parser("summarize", help="summarize runs kept earlier")
    read.add_argument("outputs", nargs="+", type=Path)
    args = parser.parse_args(argv)

    if args.mode == "summarize":
        names = [str(path) for path in args.outputs]
        texts = [path.read_text() for path in args.outputs]
    else:
        command = args.command or DEFAULT_COMMAND
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        names, texts = [], []
        for k in range(1, args.runs + 1):
            print(f"run {k} of {args.runs}: {' '.join(command)}", file=sys.stderr, flush=True)
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=os.environ)
            if done.returncode != 0:
                sys.exit(f"run {k} failed with status {done.returncode}")
            if args.keep:
                (args.keep / f"run-{k}.out").write_text(done.stdout)
            names.append(f"run {k}")
            texts.append(done.stdout)
    runs = [tables(text) for text in texts]
    for name, run in zip(names, runs):
        if not any(label in run.get(table, {}) for _, table, label, _ in FIGURES):
            sys.exit(f"{name}: none of the edge benchmark's rows in it")
    print("\n".join(summary(runs)))


if __name__ == "__main__":
    main()
