"""Tests of check_compose.tansu_group, which the native compose run reads the
ticket workers' consumer group with from tansu's SQLite store: on a store
with tansu 0.6.0's two tables and a group as tansu wrote it in a run (the
members by their static ids, the leader's assignment in Kafka's consumer
protocol encoding).

  python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import json
import sqlite3
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_compose  # noqa: E402

TOPIC = list(b"order-events")
METADATA = [0, 3, 0, 0, 0, 1, 0, 12] + TOPIC + [0] * 8 + [255] * 4 + [0, 0]


def assignment(*partitions):
    """Version 0, one topic, its partitions, no user data."""
    out = [0, 0, 0, 0, 0, 1, 0, 12] + TOPIC + [0, 0, 0, len(partitions)]
    for p in partitions:
        out += [0, 0, 0, p]
    return out + [0, 0, 0, 0]


def member(member_id, instance):
    return {"join_response": {"group_instance_id": instance, "member_id": member_id, "metadata": METADATA},
            "last_contact": {"nanos_since_epoch": 0, "secs_since_epoch": 1796143966}}


W1 = "ticket-worker-1-b5cae250-5280-4a49-89f2-22904bd582f0"
W2 = "ticket-worker-2-7b4f2ff1-444c-4098-a9b7-9d67628643eb"


def formed(assignments, members):
    return {"generation_id": 1, "inception": {"nanos_since_epoch": 0, "secs_since_epoch": 1796143960},
            "members": members, "rebalance_timeout_ms": 60000, "session_timeout_ms": 10000,
            "skip_assignment": False,
            "state": {"Formed": {"assignments": assignments, "leader": W2, "protocol_name": "range",
                                 "protocol_type": "consumer"}}}


class TansuGroupTest(unittest.TestCase):
    def store(self, detail):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        db = Path(folder.name) / "tansu.db"
        with sqlite3.connect(db) as c:
            c.execute("CREATE TABLE consumer_group (id integer primary key autoincrement, cluster integer, "
                      "name text not null)")
            c.execute("CREATE TABLE consumer_group_detail (id integer primary key autoincrement, "
                      "consumer_group int, e_tag text not null, detail text not null)")
            c.execute("INSERT INTO consumer_group (id, cluster, name) VALUES (1, 1, 'other'), (2, 1, 'ticket-issuer')")
            if detail is not None:
                c.execute("INSERT INTO consumer_group_detail (consumer_group, e_tag, detail) VALUES (2, 'x', ?)",
                          (json.dumps(detail),))
        c.close()
        return db

    def test_each_member_by_its_static_id_with_its_partitions(self):
        db = self.store(formed({W1: assignment(0, 1, 2), W2: assignment(3, 4, 5)},
                               {W1: member(W1, "ticket-worker-1"), W2: member(W2, "ticket-worker-2")}))
        self.assertEqual(check_compose.tansu_group(db, "ticket-issuer"), {
            "ticket-worker-1": [("order-events", 0), ("order-events", 1), ("order-events", 2)],
            "ticket-worker-2": [("order-events", 3), ("order-events", 4), ("order-events", 5)],
        })

    def test_a_member_without_a_static_id_or_partitions(self):
        detail = formed({W1: assignment(0, 1, 2, 3, 4, 5)},
                        {W1: member(W1, "ticket-worker-1"), "rdkafka-9": member("rdkafka-9", None)})
        self.assertEqual(check_compose.tansu_group(self.store(detail), "ticket-issuer"), {
            "ticket-worker-1": [("order-events", p) for p in range(6)],
            "rdkafka-9": [],
        })

    def test_a_group_still_forming_has_members_without_partitions(self):
        detail = formed({}, {W1: member(W1, "ticket-worker-1")})
        detail["state"] = {"Forming": {"protocol_type": "consumer", "protocol_name": "range", "leader": None}}
        self.assertEqual(check_compose.tansu_group(self.store(detail), "ticket-issuer"), {"ticket-worker-1": []})

    def test_no_such_group(self):
        self.assertEqual(check_compose.tansu_group(self.store(None), "ticket-issuer"), {})


if __name__ == "__main__":
    unittest.main()
