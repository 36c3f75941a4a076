#!/usr/bin/env python3
"""Unit tests of the --help parser and the argv check that
scripts/check_manifests.py and scripts/check_compose.py share, on a made-up
--help text.

  python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_manifests as manifests  # noqa: E402

HELP = """\
Runs the ticket workers

Usage: order-service worker [OPTIONS] --database-url <DATABASE_URL>

Options:
      --database-url <DATABASE_URL>
          PostgreSQL [env: DATABASE_URL=]
      --listen <LISTEN>
          Where to serve /metrics [env: BOXOFFICE_LISTEN=] [default: 127.0.0.1:8083]
      --log-json
          One JSON object a line [env: BOXOFFICE_LOG_JSON=]
  -h, --help
          Print help
  -V, --version
          Print version
"""


class ParseFlags(unittest.TestCase):
    def setUp(self):
        self.cli = manifests.Cli(HELP)

    def parse(self, *argv):
        return manifests.parse_flags(self.cli, "order-service worker", list(argv))

    def test_the_help_text_gives_each_flag_its_env_default_and_value(self):
        self.assertEqual(self.cli.flags["listen"]["env"], "BOXOFFICE_LISTEN")
        self.assertEqual(self.cli.flags["listen"]["default"], "127.0.0.1:8083")
        self.assertTrue(self.cli.flags["database-url"]["value"])
        self.assertFalse(self.cli.flags["log-json"]["value"])

    def test_values_after_the_flag_or_its_equals_sign(self):
        flags, found = self.parse("--listen", "0.0.0.0:8083", "--database-url=postgres://db/x=y", "--log-json")
        self.assertEqual(found, [])
        self.assertEqual(flags, {"listen": "0.0.0.0:8083", "database-url": "postgres://db/x=y", "log-json": ""})

    def test_unknown_flags_stray_arguments_and_a_missing_value_are_problems(self):
        flags, found = self.parse("--workers", "3", "--listen")
        self.assertEqual(flags, {})
        self.assertEqual(found, [
            "order-service worker has no flag --workers",
            "order-service worker: unexpected argument '3'",
            "order-service worker: --listen needs a value",
        ])

    def test_help_and_version_do_not_run_the_service(self):
        flags, found = self.parse("--help", "--version")
        self.assertEqual(flags, {})
        self.assertEqual(found, ["order-service worker has no flag --help",
                                 "order-service worker has no flag --version"])


if __name__ == "__main__":
    unittest.main()
