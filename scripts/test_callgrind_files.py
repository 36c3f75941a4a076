#!/usr/bin/env python3
"""Unit tests of scripts/callgrind_files.py on small dumps in callgrind's format.

  python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind_files  # noqa: E402

# A layer inlined into its caller (fi=/fe=), a call whose inclusive cost must
# not count as the caller's own, and compressed names whose ids are the same
# number in the three namespaces (files, functions, objects).
DUMP = """\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 150

ob=(1) /bin/gateway
fl=(1) src/edge.rs
fn=(1) call
10 5
fi=(2) http/src/header/map.rs
+2 30
* 7
fe=(1)
-1 3
cob=(2) /lib/libc.so.6
cfi=(3) memmove.S
cfn=(2) memcpy
calls=4 0
13 100
14 1
ob=(2)
fl=(3)
fn=(2)
0 100
fn=(1)
fl=(1)
fi=(2)
20 4
"""


def costs(text):
    return dict(callgrind_files.by_file(io.StringIO(text).readlines()))


class ByFile(unittest.TestCase):
    def test_inlined_lines_count_under_their_own_file_and_a_calls_cost_is_not_the_callers(self):
        self.assertEqual(
            costs(DUMP),
            {"src/edge.rs": 5 + 3 + 1, "http/src/header/map.rs": 30 + 7 + 4, "memmove.S": 100},
        )
        # Every instruction once: the dump's summary.
        self.assertEqual(sum(costs(DUMP).values()), 150)

    def test_the_first_event_after_every_position_column_is_read(self):
        text = DUMP.replace("positions: line", "positions: instr line")
        for old, new in [("10 5", "0x10 10 5"), ("+2 30", "+4 +2 30"), ("* 7", "+1 * 7"),
                         ("-1 3", "0x20 -1 3"), ("13 100", "0x24 13 100"), ("14 1", "+2 14 1"),
                         ("0 100", "0x90 0 100"), ("20 4", "0x40 20 4")]:
            text = text.replace(old, new, 1)
        self.assertEqual(costs(text), costs(DUMP))

    def test_a_new_function_is_back_in_its_own_file_after_inlined_code(self):
        # fn= after fi=: the lines that follow are the function's file's again.
        text = DUMP.replace("fe=(1)\n", "fn=(3) next\n")
        self.assertEqual(costs(text)["src/edge.rs"], 5 + 3 + 1)

    def test_a_file_first_named_by_a_jump_is_known_by_its_number_after(self):
        text = DUMP.replace("fi=(2) http/src/header/map.rs", "jfi=(2) http/src/header/map.rs\nfi=(2)")
        self.assertEqual(costs(text), costs(DUMP))

    def test_a_name_defined_for_functions_does_not_rename_a_file_of_the_same_id(self):
        # fn=(1) call and cfn=(2) memcpy must not be read back by fl=(1) and fi=(2).
        self.assertNotIn("call", costs(DUMP))
        self.assertNotIn("memcpy", costs(DUMP))


class Main(unittest.TestCase):
    def run_main(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(callgrind_files.main(list(args)), 0)
        return out.getvalue()

    def test_minus_shows_what_the_first_dump_has_over_the_second_per_request(self):
        with tempfile.TemporaryDirectory() as d:
            first, second = Path(d, "a"), Path(d, "b")
            first.write_text(DUMP)
            # The same run without the inlined header map's work.
            second.write_text(DUMP.replace("+2 30", "+2 0").replace("20 4", "20 0"))
            out = self.run_main(str(first), "--minus", str(second), "--per", "2")
        lines = out.splitlines()
        self.assertEqual(lines[0], "instructions over the second dump, over 2: 17")
        self.assertEqual(lines[2].split(), ["17", "20", "4", "http/src/header/map.rs"])

    def test_a_registry_path_is_shortened(self):
        self.assertEqual(
            callgrind_files.short("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/http-1.5.0/src/header/map.rs"),
            "http-1.5.0/src/header/map.rs",
        )


if __name__ == "__main__":
    unittest.main()
