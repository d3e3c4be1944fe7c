"""Unit tests of sb.commands and sb.pty against the stub server: request
shapes, NDJSON output parsing, error mapping. Real behaviour is in
test_integration_processes.py."""

import json
import threading
import time
import unittest

from _helpers import SANDBOX, StubServer, send_chunked, send_json
import pandastack
from pandastack import Client, CommandHandle, ConflictError, ExecResult, NotFoundError, OutputChunk, RequestTimeoutError, Sandbox, TerminalHandle

P = "/v1/sandboxes/abc123/processes"
PROC = {"pid": 112, "cmd": "sleep 1", "state": "running", "started_at": "2025-01-02T03:04:05Z", "exit_code": None,
        "stdin_open": True, "stdout_bytes": 0, "stderr_bytes": 0, "stdout_dropped": 0, "stderr_dropped": 0}


def ndjson(*events):
    return [json.dumps(e).encode() + b"\n" for e in events]


class ProcessesStubTest(unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        self.sb = Sandbox.connect("abc123", client=self.client)

    def test_run_background_body(self):
        self.stub.json_route("POST", P, 201, PROC)
        h = self.sb.commands.run(["sh", "-c", "x"], background=True, stdin=True, env={"A": "1"}, cwd="/tmp", user="nobody", timeout_seconds=5)
        self.assertIsInstance(h, CommandHandle)
        self.assertEqual(h.pid, 112)
        self.assertTrue(h.last_info.stdin_open)
        self.assertEqual(self.stub.last.json(), {"argv": ["sh", "-c", "x"], "stdin": True, "env": {"A": "1"}, "cwd": "/tmp", "user": "nobody", "timeout_seconds": 5})

    def test_run_background_minimal_body(self):
        self.stub.json_route("POST", P, 201, PROC)
        self.sb.commands.run("sleep 1", background=True)
        self.assertEqual(self.stub.last.json(), {"cmd": "sleep 1"})

    def test_run_background_stdin_text_writes_and_closes(self):
        self.stub.json_route("POST", P, 201, PROC)
        self.stub.route("POST", P + "/112/stdin", lambda rec, h: send_json(h, 204, None))
        self.sb.commands.run("cat", background=True, stdin="hi")
        start, write = self.stub.requests[-2], self.stub.requests[-1]
        self.assertEqual(start.json(), {"cmd": "cat", "stdin": True})
        self.assertEqual((write.body, write.query), (b"hi", "close=true"))

    def test_run_foreground_is_exec(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/exec", 200, {"exit_code": 3, "stdout": "o", "stderr": "e", "duration_ms": 1})
        r = self.sb.commands.run("exit 3", stdin="x")
        self.assertEqual(r, ExecResult(3, "o", "e", 1))
        self.assertEqual(self.stub.last.json(), {"cmd": "exit 3", "stdin": "x"})
        with self.assertRaises(ValueError):
            self.sb.commands.run("cat", stdin=True)

    def test_stdin_signal_resize_delete_shapes(self):
        for suffix in ("/stdin", "/signal", "/resize"):
            self.stub.route("POST", P + "/7" + suffix, lambda rec, h: send_json(h, 204, None))
        self.stub.route("DELETE", P + "/7", lambda rec, h: send_json(h, 204, None))
        h = TerminalHandle(self.sb, 7)
        h.send_stdin(b"\x00raw\xff")
        self.assertEqual((self.stub.last.body, self.stub.last.query, self.stub.last.headers["Content-Type"]), (b"\x00raw\xff", "", "application/octet-stream"))
        h.send_input("ls\r")
        self.assertEqual(self.stub.last.body, b"ls\r")
        h.close_stdin()
        self.assertEqual((self.stub.last.body, self.stub.last.query), (b"", "close=true"))
        h.signal("TERM")
        self.assertEqual(self.stub.last.json(), {"signal": "TERM"})
        self.assertTrue(h.kill())
        self.assertEqual(self.stub.last.json(), {"signal": "KILL"})
        h.resize(50, 132)
        self.assertEqual((self.stub.last.path, self.stub.last.json()), (P + "/7/resize", {"rows": 50, "cols": 132}))
        h.remove()
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("DELETE", P + "/7"))

    def test_output_parsing_and_wait(self):
        events = ndjson(
            {"type": "start", "pid": 112},
            {"type": "dropped", "stream": "stdout", "bytes": 10, "offset": 10},
            {"type": "stdout", "data": "start\n", "offset": 10},
            {"type": "stderr", "data": "oops\n", "offset": 0},
            {"type": "future", "x": 1},
            {"type": "exit", "exit_code": 143, "signal": "SIGTERM", "timed_out": False, "duration_ms": 5},
        )
        # Split a line across chunks to check the decoder keeps it.
        pieces = [events[0] + events[1][:7], events[1][7:]] + events[2:]
        self.stub.route("GET", P + "/112/output", lambda rec, h: send_chunked(h, 200, pieces))
        h = CommandHandle(self.sb, 112)
        stream = h.output(from_=10)
        chunks = list(stream)
        self.assertEqual(self.stub.last.query, "from=10")
        self.assertEqual(chunks, [OutputChunk("stdout", "", 10, 10), OutputChunk("stdout", "start\n", 10), OutputChunk("stderr", "oops\n", 0)])
        self.assertEqual((stream.result.exit_code, stream.result.signal), (143, "SIGTERM"))
        got = []
        r = h.wait(on_stdout=got.append)
        self.assertEqual(self.stub.last.query, "from=start")
        self.assertEqual(r, ExecResult(143, "start\n", "oops\n", 5, "SIGTERM", False, True))
        self.assertEqual(got, ["start\n"])

    def test_output_error_event_and_cut_stream(self):
        self.stub.route("GET", P + "/1/output", lambda rec, h: send_chunked(h, 200, ndjson({"type": "error", "error": {"code": "not_found", "message": "gone"}})))
        with self.assertRaises(NotFoundError):
            list(CommandHandle(self.sb, 1).output())
        self.stub.route("GET", P + "/2/output", lambda rec, h: send_chunked(h, 200, ndjson({"type": "stdout", "data": "x", "offset": 0})))
        with self.assertRaises(pandastack.PandaConnectionError):
            CommandHandle(self.sb, 2).wait()
        with self.assertRaises(ValueError):
            CommandHandle(self.sb, 2).output(from_="middle")

    def test_wait_timeout(self):
        release, ended = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def slow(rec, h):
            send_chunked(h, 200, ndjson({"type": "start", "pid": 3}), end=False)
            release.wait(60)
            ended.set()
        self.stub.route("GET", P + "/3/output", slow)
        with self.assertRaises(RequestTimeoutError):
            CommandHandle(self.sb, 3).wait(timeout=0.3)
        # The wait's own timeout: the server still holds the stream open.
        self.assertFalse(ended.is_set(), "the stream ended before the wait timed out")

    def test_unknown_pid_not_found(self):
        self.stub.json_route("GET", P + "/999", 404, {"error": {"code": "not_found", "message": "no process 999"}})
        with self.assertRaises(NotFoundError):
            self.sb.commands.connect(999)

    def test_stdin_to_exited_conflict(self):
        self.stub.json_route("POST", P + "/5/stdin", 409, {"error": {"code": "conflict", "message": "process 5 has exited"}})
        with self.assertRaises(ConflictError):
            CommandHandle(self.sb, 5).send_stdin("x")
        self.stub.json_route("POST", P + "/5/signal", 409, {"error": {"code": "conflict", "message": "process 5 has exited"}})
        self.assertFalse(CommandHandle(self.sb, 5).kill())

    def test_list_and_connect_pty(self):
        self.stub.json_route("GET", P, 200, {"processes": [PROC, dict(PROC, pid=113, state="exited", exit_code=0, ended_at="2025-01-02T03:04:06Z")]})
        got = self.sb.commands.list()
        self.assertEqual([(p.pid, p.state, p.exit_code) for p in got], [(112, "running", None), (113, "exited", 0)])
        self.assertIsNotNone(got[1].ended_at)
        self.stub.json_route("GET", P + "/130", 200, dict(PROC, pid=130, pty={"rows": 24, "cols": 80}))
        h = self.sb.commands.connect(130)
        self.assertIsInstance(h, TerminalHandle)
        self.assertEqual(h.last_info.pty, {"rows": 24, "cols": 80})

    def test_pty_create_body(self):
        self.stub.json_route("POST", P, 201, dict(PROC, pid=130, pty={"rows": 30, "cols": 100}))
        t = self.sb.pty.create(rows=30, cols=100)
        self.assertIsInstance(t, TerminalHandle)
        body = self.stub.last.json()
        self.assertEqual(body["pty"], {"rows": 30, "cols": 100})
        self.assertIn("exec /bin/bash -i", body["cmd"])
        self.sb.pty.create(cmd=["top"])
        self.assertEqual(self.stub.last.json(), {"argv": ["top"], "pty": {"rows": 24, "cols": 80}})
        with self.assertRaises(ValueError):
            self.sb.pty.create(rows=0)


if __name__ == "__main__":
    unittest.main()
