"""Unit tests: NDJSON decoding across arbitrary chunk boundaries."""

import json
import unittest

import _helpers  # noqa: F401
from pandastack._ndjson import NDJSONDecoder, iter_ndjson

EVENTS = [
    {"type": "start", "pid": 7},
    {"type": "stdout", "data": "héllo wörld ✓ 🐼\n"},
    {"type": "stderr", "data": "warn: {\"nested\": true}\n"},
    {"type": "stdout", "data": ""},
    {"type": "exit", "exit_code": 0, "signal": "", "timed_out": False, "duration_ms": 12},
]


def encode(events) -> bytes:
    return b"".join(json.dumps(e, ensure_ascii=False).encode("utf-8") + b"\n" for e in events)


class NDJSONTest(unittest.TestCase):
    def test_every_split_point(self):
        data = encode(EVENTS)
        for i in range(len(data) + 1):
            for j in range(i, len(data) + 1, 7):
                got = list(iter_ndjson([data[:i], data[i:j], data[j:]]))
                self.assertEqual(got, EVENTS, "split at %d, %d" % (i, j))

    def test_byte_at_a_time(self):
        data = encode(EVENTS)
        got = list(iter_ndjson(data[k : k + 1] for k in range(len(data))))
        self.assertEqual(got, EVENTS)

    def test_feed_returns_only_complete_lines(self):
        dec = NDJSONDecoder()
        self.assertEqual(dec.feed(b'{"a":'), [])
        self.assertEqual(dec.pending, 5)
        self.assertEqual(dec.feed(b'1}\n{"b"'), [{"a": 1}])
        self.assertEqual(dec.feed(b":2}\n"), [{"b": 2}])
        self.assertEqual(dec.pending, 0)
        self.assertEqual(dec.close(), [])

    def test_crlf_blank_lines_and_missing_final_newline(self):
        got = list(iter_ndjson([b'{"a":1}\r\n\r\n\n{"b":2}\r\n{"c":3}']))
        self.assertEqual(got, [{"a": 1}, {"b": 2}, {"c": 3}])

    def test_multibyte_character_split(self):
        line = json.dumps({"d": "🐼"}, ensure_ascii=False).encode("utf-8") + b"\n"
        k = line.index("🐼".encode("utf-8")) + 2  # inside the 4-byte sequence
        self.assertEqual(list(iter_ndjson([line[:k], line[k:]])), [{"d": "🐼"}])

    def test_malformed_line_raises(self):
        with self.assertRaises(ValueError):
            list(iter_ndjson([b'{"a":1}\nnot json\n']))


if __name__ == "__main__":
    unittest.main()
