#!/usr/bin/env python3
"""Unit tests of scripts/edge_runs.py on the edge benchmark's own output.

  python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import edge_runs  # noqa: E402

# The tables of one run as the bench prints them (cut to what the script reads
# and one table it must skip), with the ratios put in by `run`.
RUN = """\
Redis 7.0.15 (process 2288), appendonly no

edge at saturation (wrk -t1 -c64 -d8s, 3 rounds). Each figure is the median over the rounds
endpoint                                         req/s   p50 ms   p99 ms  non-2xx   vs baseline
baseline: axum + one ZRANK                       66092     0.78     1.97        0   100% (100 100 100)
GET  /v1/events/{{id}}/queue/status                57644     0.93     2.06        0   {status}% (97 77 87)
  the same without the protective layers         67613     0.81     2.09        0   105% (111 94 105)
baseline: axum + one ZADD (new member)           62506     0.84     2.17        0   100% (100 100 100)
POST /v1/events/{{id}}/queue (new fan)             50445     1.06     3.02        0   {join}% (81 81 82)
  the same without the protective layers         55597     0.95     2.63        0   89% (89 90 83)
baseline: axum + the join script (EVALSHA)       47726     1.16     2.37        0   73% (65 73 79)
POST /v1/events/{{id}}/queue, vs the script        50445     1.06     3.02        0   111% (124 111 103)
  the same without the protective layers         55597     0.95     2.63        0   123% (137 123 105)

CPU per request at saturation, µs, median over the rounds
endpoint                                       server    Redis      wrk    other    total   vs baseline   stolen
baseline: axum + one ZRANK                       14.4      5.6      8.7      0.2     28.8         1.00x      0.0
GET  /v1/events/{{id}}/queue/status                17.6      4.6      8.8      0.7     30.8         8.88x      0.0
  the same without the protective layers         14.1      4.8      8.4      0.4     27.4         8.88x      0.0
POST /v1/events/{{id}}/queue (new fan)             18.3      7.7     13.0      0.2     39.0         8.88x      0.0

edge at a fixed rate (50% of the endpoint's saturated rate). In brackets, each round's p99 ratio
endpoint                                         req/s   p50 ms   p99 ms p99.9 ms  non-2xx   p99 vs base
GET  /v1/events/{{id}}/queue/status                28562     0.67     2.93     5.59        0         9.99x (1.20 1.70)
POST /v1/events/{{id}}/queue (new fan)             24989     0.81     4.53     7.06        0         9.99x (1.41 1.09)

the fixed rate's tail over every request of a server's 6 rounds together, the rounds pooled
endpoint                                      requests   p99 ms p99.9 ms  non-2xx   p99 vs base
baseline: axum + one ZRANK                     1383456     2.04     5.23        0         1.00x
GET  /v1/events/{{id}}/queue/status              1383456     2.88     5.77        0         {status_p99}x
  the same without the protective layers       1383456     2.75     5.97        0         1.35x
baseline: axum + one ZADD (new member)         1210704     2.65     5.74        0         1.00x
POST /v1/events/{{id}}/queue (new fan)           1210704     4.74    11.85        0         {join_p99}x
  the same without the protective layers       1210704     3.92    21.08        0         1.48x
baseline: axum + the join script (EVALSHA)     1210704     4.54    10.28        0         1.71x
POST /v1/events/{{id}}/queue, vs the script      1210704     4.74    11.85        0         1.04x
  the same without the protective layers       1210704     3.92    21.08        0         0.86x

CPU per request at the fixed rate, µs, median over the rounds
endpoint                                       server    Redis     both       vs base
GET  /v1/events/{{id}}/queue/status                21.1      5.5     26.5         7.77x (1.21 1.35)
POST /v1/events/{{id}}/queue (new fan)             23.7      9.2     32.9         7.77x (1.29 1.24)
"""

# The rows of each endpoint, as `Kind::rows` in gateway/benches/edge.rs
# prints them: a run with BENCH_KINDS set to one endpoint has only its own.
STATUS_ROWS = ("baseline: axum + one ZRANK", "GET  /v1/events/{id}/queue/status")
JOIN_ROWS = ("baseline: axum + one ZADD", "POST /v1/events/{id}/queue", "baseline: axum + the join script")


def only(text, dropped):
    """text without the rows starting with `dropped`, nor the without-layers
    rows right under them: as a run of the other endpoint alone prints it."""
    lines, dropping = [], False
    for line in text.splitlines():
        if not line.startswith(edge_runs.BARE):
            dropping = line.startswith(dropped)
        if not dropping:
            lines.append(line)
    return "\n".join(lines)


def join_only(text):
    return only(text, STATUS_ROWS)


def status_only(text):
    return only(text, JOIN_ROWS)


def run(status=87, join=81, status_p99=1.41, join_p99=1.79):
    return RUN.format(status=status, join=join, status_p99=status_p99, join_p99=join_p99)


def report_row(lines, what):
    (line,) = [line for line in lines if line.startswith(what)]
    return line


@contextlib.contextmanager
def quiet():
    """The script's report and progress kept out of the test's output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        yield out


class Tables(unittest.TestCase):
    def test_each_rows_verdict_column_is_read_from_its_own_table(self):
        tables = edge_runs.tables(run())
        saturated, pooled = tables[edge_runs.SATURATION], tables[edge_runs.POOLED]
        self.assertEqual(saturated[edge_runs.STATUS], 87.0)
        self.assertEqual(saturated[edge_runs.JOIN], 81.0)
        self.assertEqual(pooled[edge_runs.STATUS], 1.41)
        self.assertEqual(pooled[edge_runs.JOIN], 1.79)
        self.assertEqual(pooled[edge_runs.SCRIPT], 1.71)
        self.assertEqual(pooled[edge_runs.JOIN_VS_SCRIPT], 1.04)

    def test_a_row_without_the_layers_is_named_after_the_row_it_repeats(self):
        pooled = edge_runs.tables(run())[edge_runs.POOLED]
        self.assertEqual(pooled[edge_runs.STATUS + " without the layers"], 1.35)
        self.assertEqual(pooled[edge_runs.JOIN + " without the layers"], 1.48)
        self.assertEqual(pooled[edge_runs.JOIN_VS_SCRIPT + " without the layers"], 0.86)

    def test_the_per_round_and_cpu_tables_are_not_read(self):
        tables = edge_runs.tables(run())
        self.assertEqual(set(tables), {edge_runs.SATURATION, edge_runs.POOLED})
        for table in tables.values():
            self.assertFalse({9.99, 8.88, 7.77} & set(table.values()), table)

    def test_a_row_without_the_layers_under_an_unknown_row_is_left_out(self):
        # Were the join's row renamed in the bench, its without-layers row
        # must not be taken for the status poll's (the last row known).
        renamed = run().replace("POST /v1/events/{id}/queue (new fan)", "POST /v1/join")
        pooled = edge_runs.tables(renamed)[edge_runs.POOLED]
        self.assertEqual(pooled[edge_runs.STATUS + " without the layers"], 1.35)
        self.assertNotIn(edge_runs.JOIN + " without the layers", pooled)
        self.assertNotIn(1.48, pooled.values())

    def test_a_ratio_that_is_not_a_number_is_an_error(self):
        with self.assertRaises(ValueError):
            edge_runs.tables(run(join_p99="NaN"))

    def test_one_endpoints_runs_read_only_its_own_rows(self):
        join = edge_runs.tables(join_only(run()))[edge_runs.POOLED]
        self.assertEqual(set(join), {edge_runs.JOIN, edge_runs.JOIN + " without the layers",
                                     edge_runs.SCRIPT, edge_runs.JOIN_VS_SCRIPT,
                                     edge_runs.JOIN_VS_SCRIPT + " without the layers"})
        status = edge_runs.tables(status_only(run()))[edge_runs.POOLED]
        self.assertEqual(status, {edge_runs.STATUS: 1.41, edge_runs.STATUS + " without the layers": 1.35})

    def test_the_labels_and_titles_read_are_the_ones_the_bench_prints(self):
        bench = (Path(__file__).resolve().parent.parent / "gateway/benches/edge.rs").read_text()
        for label in (edge_runs.STATUS, edge_runs.JOIN, edge_runs.SCRIPT,
                      edge_runs.JOIN_VS_SCRIPT, edge_runs.BARE):
            self.assertIn(f'"{label}"', bench)
        for title in (edge_runs.SATURATION, edge_runs.POOLED):
            self.assertIn(f'"\\n{title}', bench)

    def test_a_row_without_a_ratio_is_an_error_not_a_zero(self):
        broken = run().replace("{status}% (97 77 87)".format(status=87), "n/a")
        with self.assertRaises(ValueError):
            edge_runs.tables(broken)


class Summary(unittest.TestCase):
    def test_median_range_and_runs_that_met_each_goal(self):
        runs = [edge_runs.tables(run(join=j, join_p99=p))
                for j, p in ((81, 1.79), (79, 1.29), (83, 1.31), (84, 2.85))]
        lines = edge_runs.summary(runs)
        join = report_row(lines, "join, % of the ZADD's rate")
        self.assertIn(">=80      82         79-84    3/4  81 79 83 84", join)
        tail = report_row(lines, "join, p99 / the ZADD's (pooled)")
        # The median of 1.29, 1.31, 1.79 and 2.85 is 1.55: over the goal, though
        # two runs of the four met it.
        self.assertIn("<=1.5    1.55     1.29-2.85    2/4  1.79 1.29 1.31 2.85", tail)

    def test_an_endpoint_left_out_of_a_run_shows_as_a_dash_and_is_not_counted(self):
        runs = [edge_runs.tables(run(status=90)), edge_runs.tables(join_only(run()))]
        line = report_row(edge_runs.summary(runs), "status, % of the ZRANK's rate")
        self.assertTrue(line.endswith("1/1  90 -"), line)

    def test_figures_no_run_has_are_left_out(self):
        lines = edge_runs.summary([edge_runs.tables(join_only(run()))])
        self.assertEqual(len(lines), 2 + 4 + 2, lines)
        self.assertFalse([line for line in lines if "status" in line or "ZRANK" in line])
        self.assertEqual(len(edge_runs.summary([edge_runs.tables(status_only(run()))])), 2 + 4)

    def test_a_median_between_two_whole_percentages_keeps_its_half(self):
        runs = [edge_runs.tables(run(join=j)) for j in (77, 78)]
        join = report_row(edge_runs.summary(runs), "join, % of the ZADD's rate")
        self.assertIn(">=80    77.5         77-78    0/2", join)
        runs = [edge_runs.tables(run(join_p99=p)) for p in (1.34, 1.37)]
        tail = report_row(edge_runs.summary(runs), "join, p99 / the ZADD's (pooled)")
        self.assertIn("<=1.5   1.355     1.34-1.37    2/2", tail)


class Main(unittest.TestCase):
    def test_summarize_reads_kept_runs_and_refuses_a_file_with_no_tables(self):
        with tempfile.TemporaryDirectory() as tmp:
            good, empty = Path(tmp, "run-1.out"), Path(tmp, "run-2.out")
            good.write_text(run())
            # The titles without a row the script knows: as good as nothing.
            empty.write_text(edge_runs.SATURATION + "\nendpoint req/s\nbaseline: x 1 100%\n")
            with self.assertRaises(SystemExit) as refused, quiet():
                edge_runs.main(["summarize", str(good), str(empty)])
            self.assertIn("run-2.out", str(refused.exception))

    def test_run_keeps_each_runs_output_and_stops_at_a_failed_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Path(tmp, "out.txt")
            fixture.write_text(run())
            keep = Path(tmp, "kept")
            with quiet() as out:
                edge_runs.main(["run", "--runs", "2", "--keep", str(keep), "--", "cat", str(fixture)])
            self.assertIn("edge over 2 runs", out.getvalue())
            self.assertEqual(sorted(p.name for p in keep.iterdir()), ["run-1.out", "run-2.out"])
            with self.assertRaises(SystemExit) as failed, quiet():
                edge_runs.main(["run", "--runs", "2", "--", "false"])
            self.assertIn("run 1 failed", str(failed.exception))


if __name__ == "__main__":
    unittest.main()
