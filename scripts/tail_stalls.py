#!/usr/bin/env python3
"""Where a fixed-rate round's p99 comes from: steady queueing, or a few stalls.

Reads the per-request traces the edge benchmark's open-model client writes
when BENCH_TRACE_DIR is set (one file a server and round,
`KIND-SERVER-ROUND.txt`: a `# start_unix_us N` line, then `due_us
latency_us` a request; the bench makes the directory), and prints
for each: p50, p99 and p99.9; the requests at or above the p99 grouped into
clusters by when they fell due (two of them due within 10 ms of each other
are in one); the share the four largest clusters hold; and those four, with
their wall-clock time.

    BENCH_TRACE_DIR=target/trace cargo bench -p gateway --bench edge
    scripts/tail_stalls.py target/trace

With `--perf FILE`, the text of a whole-machine recording made meanwhile
(`perf record -a -F 2999 -k CLOCK_REALTIME`, then
`perf script -F comm,tid,cpu,time`), it also lists the spans in which a CPU
took no sample for longer than `--gap-ms` (default 2). On a CPU busy
throughout, such a span means the (virtual) CPU itself was not running; an
idle CPU may take no samples either, so on a half-busy machine a span is a
pause or an idle CPU, and the count below is an upper bound. Then, for each
trace, how many of the slow requests waited across such a span, and for each
of the four clusters the samples each command took from 5 ms before it to
its end (a kernel thread such as `kdamond.0` taking a CPU shows there).
"""

import argparse
import bisect
import re
import sys
from pathlib import Path

JOIN_US = 10_000


def read_trace(path):
    """(start in unix µs, [(due µs from start, latency µs)]) of one trace."""
    start, rows = None, []
    for line in Path(path).read_text().splitlines():
        if line.startswith("# start_unix_us"):
            start = int(line.split()[2])
        elif line and not line.startswith("#"):
            due, latency = line.split()
            rows.append((int(due), int(latency)))
    if start is None:
        raise ValueError(f"{path}: no '# start_unix_us' line")
    return start, rows


def quantile(ordered, q):
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def clusters(rows, threshold):
    """The requests at or above `threshold`, grouped by due time: a list of
    (first due µs, last due µs, [latencies]), largest first."""
    slow = sorted((due, latency) for due, latency in rows if latency >= threshold)
    groups = []
    for due, latency in slow:
        if groups and due - groups[-1][1] <= JOIN_US:
            groups[-1][1] = due
            groups[-1][2].append(latency)
        else:
            groups.append([due, due, [latency]])
    groups.sort(key=lambda g: -len(g[2]))
    return [tuple(g) for g in groups]


def samples(perf_text):
    """(time s, cpu, command) of each sample in `perf script -F
    comm,tid,cpu,time` text, in time order."""
    line = re.compile(r"\s*(.+?)\s+\d+\s+\[(\d+)\]\s+([\d.]+):")
    found = []
    for text in perf_text.splitlines():
        m = line.match(text)
        if m:
            found.append((float(m.group(3)), int(m.group(2)), m.group(1)))
    found.sort()
    return found


def cpu_gaps(taken, gap_ms):
    """Spans (start s, end s, cpu) in which a CPU took no sample for longer
    than `gap_ms`, from [`samples`]."""
    last, gaps = {}, []
    for t, cpu, _ in taken:
        if cpu in last and t - last[cpu] > gap_ms / 1000:
            gaps.append((last[cpu], t, cpu))
        last[cpu] = t
    gaps.sort()
    return gaps


def commands_between(taken, begin, end):
    """How many samples each command took from `begin` to `end` (s), most
    first."""
    counts = {}
    first = bisect.bisect_left(taken, (begin,))
    last = bisect.bisect_right(taken, (end, float("inf")))
    for _, _, command in taken[first:last]:
        counts[command] = counts.get(command, 0) + 1
    return sorted(counts.items(), key=lambda c: -c[1])


def waited_across(start_us, rows, threshold, gaps):
    """How many requests at or above `threshold` were waiting (from when
    they fell due to their answer) across a span without samples."""
    starts = [g[0] for g in gaps]
    count = 0
    for due, latency in rows:
        if latency < threshold:
            continue
        begin = (start_us + due) / 1e6
        end = begin + latency / 1e6
        # Of the gaps starting before the request's end, any ending after
        # its start overlaps it.
        i = bisect.bisect_left(starts, end)
        if any(gap_end > begin for _, gap_end, _ in gaps[:i]):
            count += 1
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="BENCH_TRACE_DIR of an edge benchmark run")
    parser.add_argument("--perf", help="perf script text recorded meanwhile")
    parser.add_argument("--gap-ms", type=float, default=2.0)
    args = parser.parse_args()

    taken, gaps = [], []
    if args.perf:
        taken = samples(Path(args.perf).read_text())
        gaps = cpu_gaps(taken, args.gap_ms)
        lengths = sorted((b - a) * 1000 for a, b, _ in gaps)
        print(f"{len(gaps)} spans with a CPU not sampled for over {args.gap_ms} ms"
              + (f", median {lengths[len(lengths) // 2]:.1f} ms, longest {lengths[-1]:.1f} ms"
                 if gaps else ""))
        for a, b, cpu in gaps:
            print(f"  cpu {cpu} at {a:.3f} for {(b - a) * 1000:.1f} ms")

    traces = sorted(Path(args.dir).glob("*-*-*.txt"))
    if not traces:
        sys.exit(f"no traces in {args.dir}")
    for path in traces:
        start, rows = read_trace(path)
        ordered = sorted(latency for _, latency in rows)
        p99 = quantile(ordered, 0.99)
        groups = clusters(rows, p99)
        slow = sum(len(g[2]) for g in groups)
        held = sum(len(g[2]) for g in groups[:4])
        print(f"{path.stem}: {len(rows)} requests, p50 {quantile(ordered, 0.5) / 1000:.2f} ms, "
              f"p99 {p99 / 1000:.2f} ms, p99.9 {quantile(ordered, 0.999) / 1000:.2f} ms; "
              f"{slow} at or above the p99 in {len(groups)} clusters, "
              f"the largest four hold {100 * held / max(slow, 1):.0f} %")
        for first, last, latencies in groups[:4]:
            print(f"  at {(start + first) / 1e6:.3f} (+{first / 1e6:.3f} s) for "
                  f"{(last - first) / 1000:.0f} ms: {len(latencies)} requests, "
                  f"the slowest {max(latencies) / 1000:.1f} ms")
            if args.perf:
                # What ran from 5 ms before the first fell due to the last.
                ran = commands_between(taken, (start + first) / 1e6 - 0.005, (start + last) / 1e6)
                print("    samples meanwhile: " + ", ".join(f"{c} {n}" for c, n in ran))
        if args.perf:
            print(f"  waited across a CPU without samples (at most a pause): "
                  f"{waited_across(start, rows, p99, gaps)} of {slow}")


if __name__ == "__main__":
    main()
