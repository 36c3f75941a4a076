#!/usr/bin/env python3
"""Unit tests of scripts/tail_stalls.py on made-up traces and perf text.

  python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tail_stalls  # noqa: E402

# Two CPUs sampled every millisecond from t = 100.000 s; CPU 1 takes no
# sample from 100.004 to 100.009 (5 ms), CPU 0 none from 100.020 to
# 100.0215 (1.5 ms). kdamond.0 runs on CPU 0 at 100.002 and 100.003.
PERF = "\n".join(
    f"{'kdamond.0' if (cpu, ms) in ((0, 2), (0, 3)) else 'tokio-rt-worker':>16} "
    f"{4000 + cpu} [{cpu:03}] {100 + ms / 1000:.6f}: "
    for ms in range(0, 30)
    for cpu in (0, 1)
    if not (cpu == 1 and 4 < ms < 9) and not (cpu == 0 and ms == 21)
) + "\n" + " " * 10 + "swapper     0 [000] 100.021500: \n"


class Clusters(unittest.TestCase):
    def test_slow_requests_due_within_10_ms_are_one_cluster_largest_first(self):
        rows = [(0, 9), (4_000, 9), (14_000, 9), (30_000, 1), (50_000, 9), (55_000, 9),
                (60_000, 9), (61_000, 9)]
        groups = tail_stalls.clusters(rows, threshold=5)
        self.assertEqual([(g[0], g[1], len(g[2])) for g in groups],
                         [(50_000, 61_000, 4), (0, 14_000, 3)])

    def test_a_request_below_the_threshold_parts_nothing_and_counts_for_nothing(self):
        groups = tail_stalls.clusters([(0, 9), (5_000, 1), (9_000, 9)], threshold=5)
        self.assertEqual(groups, [(0, 9_000, [9, 9])])


class Gaps(unittest.TestCase):
    def test_a_cpu_without_samples_for_longer_than_the_limit_is_a_gap(self):
        taken = tail_stalls.samples(PERF)
        gaps = tail_stalls.cpu_gaps(taken, gap_ms=2)
        self.assertEqual([(round(a, 4), round(b, 4), cpu) for a, b, cpu in gaps],
                         [(100.004, 100.009, 1)])
        shorter = tail_stalls.cpu_gaps(taken, gap_ms=1.2)
        self.assertEqual([(round(a, 4), cpu) for a, _, cpu in shorter],
                         [(100.004, 1), (100.02, 0)])

    def test_commands_between_counts_each_commands_samples(self):
        taken = tail_stalls.samples(PERF)
        ran = dict(tail_stalls.commands_between(taken, 100.0015, 100.0035))
        self.assertEqual(ran, {"kdamond.0": 2, "tokio-rt-worker": 2})

    def test_only_slow_requests_whose_wait_spans_a_gap_are_counted(self):
        gaps = tail_stalls.cpu_gaps(tail_stalls.samples(PERF), gap_ms=2)
        start_us = 100_000_000
        rows = [
            (3_000, 2_000),   # due 100.003, answered 100.005: across the gap
            (8_500, 1_000),   # due 100.0085, inside it
            (10_000, 2_000),  # after it
            (1_000, 2_500),   # answered at 100.0035, before it
            (5_000, 100),     # across it, but fast
        ]
        self.assertEqual(tail_stalls.waited_across(start_us, rows, threshold=1_000, gaps=gaps), 2)


class Traces(unittest.TestCase):
    def test_a_trace_is_read_with_its_start(self):
        with tempfile.TemporaryDirectory() as dir:
            path = Path(dir) / "status-ours-0.txt"
            path.write_text("# start_unix_us 1700000000000000\n# due_us latency_us\n0 812\n35 790\n")
            self.assertEqual(tail_stalls.read_trace(path), (1700000000000000, [(0, 812), (35, 790)]))

    def test_a_trace_without_its_start_is_refused(self):
        with tempfile.TemporaryDirectory() as dir:
            path = Path(dir) / "status-ours-0.txt"
            path.write_text("0 812\n")
            with self.assertRaises(ValueError):
                tail_stalls.read_trace(path)


if __name__ == "__main__":
    unittest.main()
