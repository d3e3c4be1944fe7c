"""Unit tests of the event stream's and the command history's parsing (pandastack.events)."""

from __future__ import annotations

import unittest

import _helpers  # noqa: F401

from pandastack import CommandRecord, PandaConnectionError
from pandastack.events import _command_records, _event, _hello_seq


class EventParsingTest(unittest.TestCase):
    def test_lines(self):
        snap = lambda d: ("snapshot", d["id"])  # noqa: E731 - stands in for Snapshot(d, client)
        self.assertIsNone(_event({"type": "ping", "time": "2026-12-01T05:00:00Z"}, snap))
        self.assertIsNone(_event([1], snap))
        ev = _event({"seq": 12, "time": "2026-12-01T05:00:00Z", "type": "sandbox", "id": "sb1",
                     "sandbox": {"id": "sb1", "state": "paused", "template": "tiny", "memory_mib": 256, "vcpus": 1}}, snap)
        self.assertEqual((ev.type, ev.seq, ev.id, ev.sandbox.state, ev.time.year), ("sandbox", 12, "sb1", "paused", 2026))
        ev = _event({"seq": 13, "time": "2026-12-01T05:00:00Z", "type": "sandbox_deleted", "id": "sb1", "stop_reason": "killed"}, snap)
        self.assertEqual((ev.type, ev.sandbox, ev.stop_reason), ("sandbox_deleted", None, "killed"))
        ev = _event({"seq": 14, "time": "2026-12-01T05:00:00Z", "type": "snapshot", "id": "sn1", "snapshot": {"id": "sn1"}}, snap)
        self.assertEqual(ev.snapshot, ("snapshot", "sn1"))
        self.assertEqual(_event({"type": "overflow", "time": "2026-12-01T05:00:00Z"}, snap).type, "overflow")

    def test_hello(self):
        self.assertEqual(_hello_seq({"type": "hello", "seq": 7}), 7)
        with self.assertRaises(PandaConnectionError):
            _hello_seq({"type": "sandbox", "seq": 7})
        with self.assertRaises(PandaConnectionError):
            _hello_seq(None)

    def test_command_records(self):
        got = _command_records({"commands": [
            {"n": 1, "kind": "exec", "command": "echo hi", "started_at": "2026-12-01T05:00:00Z",
             "finished_at": "2026-12-01T05:00:01Z", "exit_code": 0, "duration_ms": 1000},
            {"n": 2, "kind": "process", "command": "sleep 9", "pid": 42, "started_at": "2026-12-01T05:00:02Z",
             "finished_at": None, "exit_code": None, "duration_ms": None},
        ]})
        self.assertEqual([(c.n, c.exit_code, c.pid, c.duration_ms) for c in got], [(1, 0, None, 1000), (2, None, 42, None)])
        self.assertIsNone(got[1].finished_at)
        self.assertIsInstance(got[0], CommandRecord)
        self.assertEqual(_command_records({}), [])


if __name__ == "__main__":
    unittest.main()
