"""Unit tests of pure client logic against an in-process stub HTTP server.

They check what goes on the wire (method, URL, headers, body encoding, chunked
uploads) and how answers are mapped (errors, NDJSON streams, fork results).
Real behaviour is tested against `panda up` in test_integration.py.
"""

import hashlib
import io
import json
import os
import socket
import tempfile
import threading
import time
import unittest
from datetime import datetime, timezone
from unittest import mock

from _helpers import SANDBOX, StubServer, send_chunked, send_json
import pandastack
from pandastack import Client, Sandbox


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubTestCase(unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)

    def sandbox(self) -> Sandbox:
        return Sandbox.connect("abc123", client=self.client)


class RequestEncodingTest(StubTestCase):
    def test_headers(self):
        self.sandbox()
        h = self.stub.last.headers
        self.assertEqual(h["Authorization"], "Bearer sekret")
        self.assertTrue(h["User-Agent"].startswith("pandastack-python/"))
        self.assertEqual(h["Accept"], "application/json")

    def test_health_needs_no_key(self):
        self.stub.json_route("GET", "/healthz", 200, {"status": "ok", "version": "v"})
        with Client(api_url=self.stub.url, api_key=None) as c:
            got = c.health()
        self.assertEqual(got["status"], "ok")
        self.assertNotIn("Authorization", self.stub.last.headers)

    def test_create_body(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        sb = Sandbox.create(template="tiny", memory_mib=256, metadata={"k": "v"}, env={"A": "1"}, client=self.client)
        self.assertEqual(sb.id, "abc123")
        self.assertEqual(sb.info.memory_mib, 256)
        rec = self.stub.last
        self.assertEqual(rec.headers["Content-Type"], "application/json")
        self.assertEqual(
            rec.json(),
            {"template": "tiny", "ttl_seconds": 3600, "memory_mib": 256, "metadata": {"k": "v"}, "env": {"A": "1"}},
        )

    def test_create_from_snapshot_omits_template(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        Sandbox.create(snapshot="snap1", ttl_seconds=None, client=self.client)
        self.assertEqual(self.stub.last.json(), {"snapshot_id": "snap1"})

    def test_create_on_expire(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, dict(SANDBOX, on_expire="pause"))
        sb = Sandbox.create(ttl_seconds=600, on_expire="pause", client=self.client)
        self.assertEqual(self.stub.last.json(), {"ttl_seconds": 600, "on_expire": "pause"})
        self.assertEqual(sb.info.on_expire, "pause")
        n = len(self.stub.requests)
        with self.assertRaises(ValueError):
            Sandbox.create(on_expire="sleep", client=self.client)
        self.assertEqual(len(self.stub.requests), n, "a bad on_expire was sent")

    def test_create_rejects_non_string_metadata(self):
        with self.assertRaises(TypeError):
            Sandbox.create(metadata={"n": 1}, client=self.client)

    def test_list_query(self):
        self.stub.json_route("GET", "/v1/sandboxes", 200, {"sandboxes": [SANDBOX, dict(SANDBOX, id="def456")]})
        got = Sandbox.list(state="running", metadata={"suite": "a b", "n": "1"}, client=self.client)
        self.assertEqual([s.id for s in got], ["abc123", "def456"])
        self.assertEqual(self.stub.last.query, "state=running&metadata=suite%3Da%20b&metadata=n%3D1")
        self.assertIs(got[0].client, self.client)

    def test_exec_body_cmd_and_argv(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/exec", 200, {"exit_code": 3, "stdout": "o", "stderr": "e", "duration_ms": 5, "signal": "", "timed_out": False})
        sb = self.sandbox()
        r = sb.exec("echo hi", env={"X": "y"}, cwd="/tmp", stdin="in", user="app")
        self.assertEqual(self.stub.last.json(), {"cmd": "echo hi", "env": {"X": "y"}, "cwd": "/tmp", "user": "app", "timeout_seconds": 60, "stdin": "in"})
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.duration_ms, r.signal, r.timed_out, r.ok), (3, "o", "e", 5, None, False, False))
        sb.exec(["ls", "-l"], timeout_seconds=0)
        self.assertEqual(self.stub.last.json(), {"argv": ["ls", "-l"], "timeout_seconds": 0})
        sb.exec(("true",), timeout_seconds=None)
        self.assertEqual(self.stub.last.json(), {"argv": ["true"]})
        for bad in ["", []]:
            with self.assertRaises(ValueError):
                sb.exec(bad)
        with self.assertRaises(TypeError):
            sb.exec(["ls", 1])

    def test_file_paths_are_quoted(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123/files/stat", 200, {"name": "a b", "path": "/w/a b", "size": 1, "mode": 420, "is_dir": False})
        fi = self.sandbox().filesystem.stat("/w/a b&c=d+e#f")
        self.assertEqual(self.stub.last.target, "/v1/sandboxes/abc123/files/stat?path=/w/a%20b%26c%3Dd%2Be%23f")
        self.assertEqual(fi.mode, 0o644)

    def test_remove_and_rename_and_mkdir(self):
        self.stub.route("DELETE", "/v1/sandboxes/abc123/files", lambda rec, h: send_json(h, 204, None))
        self.stub.json_route("POST", "/v1/sandboxes/abc123/files/rename", 200, {"name": "b", "path": "/b", "size": 0, "mode": 420, "is_dir": False})
        self.stub.json_route("POST", "/v1/sandboxes/abc123/files/mkdir", 200, {"name": "d", "path": "/d", "size": 0, "mode": 493, "is_dir": True})
        fs = self.sandbox().filesystem
        fs.remove("/x")
        self.assertEqual(self.stub.last.query, "path=/x")
        fs.remove("/x", recursive=True)
        self.assertEqual(self.stub.last.query, "path=/x&recursive=true")
        self.assertEqual(fs.rename("/a", "/b").path, "/b")
        self.assertEqual(self.stub.last.json(), {"from": "/a", "to": "/b"})
        self.assertTrue(fs.mkdir("/d").is_dir)
        self.assertEqual(self.stub.last.json(), {"path": "/d"})


class UploadEncodingTest(StubTestCase):
    def setUp(self):
        super().setUp()

        def put(rec, h):
            send_json(h, 200, {"name": "f", "path": "/f", "size": len(rec.body), "mode": 420, "is_dir": False})

        self.stub.route("PUT", "/v1/sandboxes/abc123/files", put)
        self.fs = self.sandbox().filesystem

    def test_str_is_utf8_with_length(self):
        fi = self.fs.write("/f", "héllo")
        rec = self.stub.last
        self.assertEqual(rec.body, "héllo".encode("utf-8"))
        self.assertEqual(rec.headers["Content-Length"], "6")
        self.assertEqual(rec.headers["Content-Type"], "application/octet-stream")
        self.assertFalse(rec.chunked)
        self.assertEqual(fi.size, 6)

    def test_mode(self):
        for mode, want in [(0o755, "755"), ("755", "755"), ("0o600", "600"), (None, None)]:
            self.fs.write("/f", b"x", mode=mode)
            q = self.stub.last.query
            self.assertEqual(q, "path=/f" + ("&mode=" + want if want else ""), mode)
        for bad in [0o10000, "9", True]:
            with self.assertRaises((ValueError, TypeError)):
                self.fs.write("/f", b"x", mode=bad)

    def test_real_file_streams_with_content_length(self):
        data = os.urandom(3 << 20)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.seek(1000)  # from the current position, like shutil.copyfileobj
            self.fs.write("/f", f)
        rec = self.stub.last
        self.assertEqual(rec.body, data[1000:])
        self.assertEqual(rec.headers["Content-Length"], str(len(data) - 1000))

    def test_unsized_stream_is_chunked_and_read_incrementally(self):
        class Reader(io.RawIOBase):
            """Non-seekable reader that records how much was asked at once."""

            def __init__(self, total):
                self.left = total
                self.max_ask = 0
                self.h = hashlib.sha256()

            def readable(self):
                return True

            def read(self, n=-1):
                self.max_ask = max(self.max_ask, n if n and n > 0 else 1 << 62)
                n = min(n if n and n > 0 else self.left, self.left)
                b = os.urandom(n)
                self.left -= n
                self.h.update(b)
                return b

        r = Reader(5 << 20)
        self.fs.write("/f", r)
        rec = self.stub.last
        self.assertTrue(rec.chunked)
        self.assertNotIn("Content-Length", rec.headers)
        self.assertEqual(hashlib.sha256(rec.body).hexdigest(), r.h.hexdigest())
        self.assertLessEqual(r.max_ask, 1 << 20, "the SDK read more than 1 MiB at once")
        self.assertGreater(len(rec.chunk_sizes), 1)

    def test_text_file_is_encoded_as_utf8(self):
        self.fs.write("/f", io.StringIO("ünï🐼"))
        rec = self.stub.last
        self.assertEqual(rec.body, "ünï🐼".encode("utf-8"))
        self.assertTrue(rec.chunked)

    def test_pathlike_uploads_local_file(self):
        import pathlib

        with tempfile.TemporaryDirectory() as d:
            p = pathlib.Path(d, "x.bin")
            p.write_bytes(b"\x00\x01\x02")
            self.fs.write("/f", p)
        self.assertEqual(self.stub.last.body, b"\x00\x01\x02")

    def test_upload_rejected_before_body_keeps_servers_error(self):
        self.stub.early_routes[("PUT", "/v1/sandboxes/abc123/files")] = lambda rec, h: send_json(
            h, 413, {"error": {"code": "payload_too_large", "message": "too big"}}, close=True
        )

        class Endless(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, b):
                b[:] = b"\0" * len(b)
                return len(b)

        fs = self.fs
        with self.assertRaises(pandastack.PayloadTooLargeError):
            fs.write("/f", io.BufferedReader(Endless()))

    def test_bad_type(self):
        with self.assertRaises(TypeError):
            self.fs.write("/f", 12)


class DownloadTest(StubTestCase):
    def test_download_to_path_and_file(self):
        data = os.urandom(2 << 20)

        def get(rec, h):
            send_chunked(h, 200, [data[i : i + 100000] for i in range(0, len(data), 100000)], "application/octet-stream")

        self.stub.route("GET", "/v1/sandboxes/abc123/files", get)
        fs = self.sandbox().filesystem
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "out")
            self.assertEqual(fs.download("/f", p), len(data))
            with open(p, "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertFalse(os.path.exists(p + ".part"))
        buf = io.BytesIO()
        fs.download("/f", buf)
        self.assertEqual(buf.getvalue(), data)
        self.assertEqual(fs.read("/f"), data)

    def test_broken_download_leaves_no_file(self):
        def get(rec, h):
            send_chunked(h, 200, [b"x" * 1000], "application/octet-stream", end=False)  # no final chunk, then close

        self.stub.route("GET", "/v1/sandboxes/abc123/files", get)
        fs = self.sandbox().filesystem
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "out")
            with self.assertRaises(pandastack.PandaConnectionError):
                fs.download("/f", p)
            self.assertEqual(os.listdir(d), [])

    def test_error_before_body(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123/files", 404, {"error": {"code": "not_found", "message": "no such file: /nope"}})
        with self.assertRaises(pandastack.NotFoundError):
            self.sandbox().filesystem.download("/nope", io.BytesIO())


class ErrorMappingOverHTTPTest(StubTestCase):
    def test_status_and_body(self):
        self.stub.json_route("GET", "/v1/sandboxes/nope", 404, {"error": {"code": "not_found", "message": "sandbox nope not found"}})
        with self.assertRaises(pandastack.NotFoundError) as cm:
            Sandbox.connect("nope", client=self.client)
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.message), (404, "not_found", "sandbox nope not found"))

    def test_non_json_error(self):
        self.stub.route("GET", "/v1/sandboxes/abc123", lambda rec, h: (h.send_response(502), h.send_header("Content-Length", "3"), h.end_headers(), h.wfile.write(b"bad")))
        with self.assertRaises(pandastack.PandaError) as cm:
            self.sandbox()
        self.assertEqual(cm.exception.status, 502)

    def test_kill_ignores_not_found_only(self):
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 404, {"error": {"code": "not_found", "message": "gone"}})
        sb = self.sandbox()
        sb.kill()
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 401, {"error": {"code": "unauthorized", "message": "bad key"}})
        with self.assertRaises(pandastack.AuthenticationError):
            sb.kill()

    def test_context_manager_kills_and_keeps_original_exception(self):
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 503, {"error": {"code": "unavailable", "message": "down"}})
        with self.assertRaises(KeyError):
            with self.sandbox():
                raise KeyError("boom")
        self.assertEqual(self.stub.last.method, "DELETE")
        with self.assertRaises(pandastack.UnavailableError):
            with self.sandbox():
                pass

    def test_exists(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123/files/stat", 404, {"error": {"code": "not_found", "message": "no such file"}})
        sb = self.sandbox()
        self.assertFalse(sb.filesystem.exists("/nope"))
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 404, {"error": {"code": "not_found", "message": "sandbox gone"}})
        with self.assertRaises(pandastack.NotFoundError):
            sb.filesystem.exists("/nope")

    def test_connection_refused_mentions_panda_up(self):
        url = "http://127.0.0.1:%d" % free_port()
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            Sandbox.connect("abc", api_key="k", api_url=url)
        self.assertIn("panda up", str(cm.exception))
        self.assertIn(url, str(cm.exception))
        self.assertIsInstance(cm.exception, ConnectionError)

    def test_read_timeout(self):
        ev = threading.Event()
        self.addCleanup(ev.set)
        self.stub.route("GET", "/v1/sandboxes/slow", lambda rec, h: ev.wait(5))
        c = Client(api_key="k", api_url=self.stub.url, timeout=0.3)
        with self.assertRaises(pandastack.RequestTimeoutError):
            Sandbox.connect("slow", client=c)


class KeepAliveTest(StubTestCase):
    def test_connection_is_reused(self):
        sb = self.sandbox()
        for _ in range(5):
            sb.refresh()
        self.assertEqual(self.stub.connections, 1)

    def _closing_route(self):
        calls = []

        def get(rec, h):
            calls.append(1)
            send_json(h, 200, SANDBOX, silent_close=len(calls) == 1)  # closes the connection after the first answer

        self.stub.route("GET", "/v1/sandboxes/abc123", get)
        return calls

    def test_server_closed_idle_connection_is_not_reused(self):
        calls = self._closing_route()
        sb = self.sandbox()
        self.stub.wait_closed(1)  # the server hung up the idle connection
        sb.refresh()
        sb.refresh()
        self.assertEqual(len(calls), 3)
        self.assertEqual(self.stub.connections, 2)

    def test_stale_connection_is_retried_for_idempotent_requests(self):
        calls = self._closing_route()
        sb = self.sandbox()
        self.stub.wait_closed(1)  # the server hung up the idle connection
        with mock.patch("pandastack.client._dropped", return_value=False):
            sb.refresh()  # sent on the dead connection, then retried on a new one
        self.assertEqual(len(calls), 2)
        self.assertEqual(self.stub.connections, 2)

    def test_post_is_not_resent_once_sent(self):
        calls = []

        def post(rec, h):
            calls.append(1)
            h.close_connection = True  # read the request, then hang up without answering

        self.stub.route("POST", "/v1/sandboxes/abc123/exec", post)
        sb = self.sandbox()  # leaves a pooled connection that the POST reuses
        with self.assertRaises(pandastack.PandaConnectionError):
            sb.exec("true")
        self.assertEqual(len(calls), 1, "a non-idempotent request that reached the server was sent again")

    def test_get_is_resent_after_hang_up_on_reused_connection(self):
        calls = []

        def get(rec, h):
            calls.append(1)
            if len(calls) == 2:
                h.close_connection = True  # hang up on the second request (on the reused connection)
                return
            send_json(h, 200, SANDBOX)

        self.stub.route("GET", "/v1/sandboxes/abc123", get)
        sb = self.sandbox()
        sb.refresh()
        self.assertEqual(len(calls), 3)


class ExecStreamTest(StubTestCase):
    def route_events(self, events, split=5, end=True):
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        pieces = [data[i : i + split] for i in range(0, len(data), split)]
        self.stub.route("POST", "/v1/sandboxes/abc123/exec/stream", lambda rec, h: send_chunked(h, 200, pieces, end=end))

    def test_events_to_callbacks_and_result(self):
        self.route_events(
            [
                {"type": "start", "pid": 12},
                {"type": "stdout", "data": "one\n"},
                {"type": "stderr", "data": "warn 🐼\n"},
                {"type": "stdout", "data": "two\n"},
                {"type": "future_event", "x": 1},
                {"type": "exit", "exit_code": 137, "signal": "SIGKILL", "timed_out": True, "duration_ms": 1000},
            ]
        )
        out, err = [], []
        r = self.sandbox().exec("x", on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(out, ["one\n", "two\n"])
        self.assertEqual(err, ["warn 🐼\n"])
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out, r.duration_ms), ("one\ntwo\n", "warn 🐼\n", 137, "SIGKILL", True, 1000))
        self.assertEqual(self.stub.last.path, "/v1/sandboxes/abc123/exec/stream")
        self.assertEqual(self.stub.last.json(), {"cmd": "x", "timeout_seconds": 60})

    def test_only_stderr_callback_still_streams(self):
        self.route_events([{"type": "stdout", "data": "o"}, {"type": "exit", "exit_code": 0, "duration_ms": 1}])
        r = self.sandbox().exec("x", on_stderr=lambda s: None)
        self.assertEqual(r.stdout, "o")

    def test_error_event_raises_mapped_error(self):
        self.route_events([{"type": "start", "pid": 1}, {"type": "error", "error": {"code": "conflict", "message": "sandbox stopped"}}])
        with self.assertRaises(pandastack.ConflictError) as cm:
            self.sandbox().exec("x", on_stdout=print)
        self.assertEqual(cm.exception.message, "sandbox stopped")

    def test_stream_cut_before_exit(self):
        self.route_events([{"type": "stdout", "data": "o"}], end=False)
        with self.assertRaises(pandastack.PandaConnectionError):
            self.sandbox().exec("x", on_stdout=lambda s: None)

    def test_http_error_before_stream(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/exec/stream", 404, {"error": {"code": "not_found", "message": "executable not found"}})
        with self.assertRaises(pandastack.NotFoundError):
            self.sandbox().exec(["nope"], on_stdout=lambda s: None)


class ForkAndSnapshotDecodingTest(StubTestCase):
    def test_fork_one(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"sandbox": dict(SANDBOX, id="child1")}]})
        child = self.sandbox().fork()
        self.assertIsInstance(child, Sandbox)
        self.assertEqual(child.id, "child1")
        self.assertEqual(self.stub.last.json(), {"count": 1})

    def test_fork_many(self):
        kids = [{"sandbox": dict(SANDBOX, id="c%d" % i)} for i in range(3)]
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": kids})
        got = self.sandbox().fork(count=3)
        self.assertEqual([c.id for c in got], ["c0", "c1", "c2"])
        self.assertEqual(self.stub.last.json(), {"count": 3})

    def test_fork_partial_failure(self):
        body = {"children": [{"sandbox": dict(SANDBOX, id="c0")}, {"error": {"code": "quota_exceeded", "message": "too many"}}]}
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, body)
        with self.assertRaises(pandastack.ForkError) as cm:
            self.sandbox().fork(count=2)
        e = cm.exception
        self.assertEqual([c.id for c in e.children], ["c0"])
        self.assertEqual(len(e.errors), 1)
        self.assertIsInstance(e.errors[0], pandastack.QuotaExceededError)
        self.assertEqual(e.code, "quota_exceeded")

    def test_fork_single_failure_raises_child_error(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"error": {"code": "insufficient_storage", "message": "disk"}}]})
        with self.assertRaises(pandastack.InsufficientStorageError):
            self.sandbox().fork()

    def test_fork_count_validation(self):
        for bad in [0, -1, True, "2"]:
            with self.assertRaises(ValueError):
                self.sandbox().fork(count=bad)

    def test_snapshot_and_create_from_it(self):
        snap = {"id": "s1", "name": "n", "sandbox_id": "abc123", "template": "tiny", "memory_mib": 256, "created_at": "2025-01-01T00:00:00Z", "size_bytes": 4096, "stored": "uploading", "store_error": "the object store is unavailable"}
        self.stub.json_route("POST", "/v1/sandboxes/abc123/snapshots", 201, snap)
        self.stub.json_route("GET", "/v1/snapshots", 200, {"snapshots": [snap]})
        self.stub.json_route("GET", "/v1/snapshots/s1", 200, snap)
        self.stub.route("DELETE", "/v1/snapshots/s1", lambda rec, h: send_json(h, 204, None))
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        s = self.sandbox().snapshot(name="n")
        self.assertEqual(self.stub.last.json(), {"name": "n"})
        self.assertEqual((s.id, s.name, s.size_bytes, s.memory_mib), ("s1", "n", 4096, 256))
        self.assertEqual((s.stored, s.store_error), ("uploading", "the object store is unavailable"))
        self.stub.json_route("GET", "/v1/snapshots/s1", 200, dict(snap, stored="durable", store_error=None))
        self.assertEqual((s.refresh().stored, s.store_error), ("durable", None))
        self.assertEqual(pandastack.Snapshot.list(client=self.client), [s])
        self.assertEqual(pandastack.Snapshot.get("s1", client=self.client).sandbox_id, "abc123")
        Sandbox.create(snapshot=s, client=self.client)
        self.assertEqual(self.stub.last.json()["snapshot_id"], "s1")
        s.delete()
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("DELETE", "/v1/snapshots/s1"))

    def test_pause_resume_update_info(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/pause", 200, dict(SANDBOX, state="paused"))
        self.stub.json_route("POST", "/v1/sandboxes/abc123/resume", 200, dict(SANDBOX, state="running"))
        sb = self.sandbox()
        self.assertEqual(sb.pause().state, "paused")
        self.assertEqual(sb.info.state, "paused")
        self.assertEqual(sb.resume().state, "running")


class PortsTest(StubTestCase):
    def test_ports(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123/ports", 200, {"ports": [{"port": 22, "address": "::1"}, {"port": 8000, "address": "0.0.0.0"}]})
        got = self.sandbox().ports()
        self.assertEqual(got, [pandastack.Port(22, "::1"), pandastack.Port(8000, "0.0.0.0")])
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("GET", "/v1/sandboxes/abc123/ports"))

    def test_get_url(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/ports/8000/url", 200, {"url": "http://h/p/TOKEN/", "expires_at": "2030-01-02T03:04:05Z"})
        sb = self.sandbox()
        url = sb.get_url(8000, ttl_seconds=600)
        self.assertEqual(self.stub.last.json(), {"ttl_seconds": 600})
        self.assertIsInstance(url, str)
        self.assertEqual(url, "http://h/p/TOKEN/")
        self.assertEqual(url + "x", "http://h/p/TOKEN/x")
        self.assertEqual(url.expires_at, datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
        sb.get_url(8000)
        self.assertEqual(self.stub.last.json(), {})

    def test_get_url_validation_and_errors(self):
        sb = self.sandbox()
        n = len(self.stub.requests)
        for bad in [0, 65536, True, "80", 80.0]:
            with self.assertRaises(ValueError):
                sb.get_url(bad)
        for bad in [0, -1, 1.5, True]:
            with self.assertRaises(ValueError):
                sb.get_url(80, ttl_seconds=bad)
        self.assertEqual(len(self.stub.requests), n, "invalid arguments went to the server")
        self.stub.json_route("POST", "/v1/sandboxes/abc123/ports/80/url", 409, {"error": {"code": "conflict", "message": "sandbox abc123 is stopped"}})
        with self.assertRaises(pandastack.ConflictError):
            sb.get_url(80)


class NetworkTest(StubTestCase):
    BAD = {"error": {"code": "bad_request", "message": 'network policy: allow_out entry "bad entry!": not a valid domain name (character \' \')'}}

    def test_create_with_network(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        Sandbox.create(template="tiny", network={"internet": False, "allow_out": ["pypi.org", "10.0.0.0/8"]}, client=self.client)
        self.assertEqual(self.stub.last.json()["network"], {"internet": False, "allow_out": ["pypi.org", "10.0.0.0/8"]})
        Sandbox.create(network={"deny_out": ("*.example.com",)}, client=self.client)
        self.assertEqual(self.stub.last.json()["network"], {"deny_out": ["*.example.com"]})
        Sandbox.create(network=pandastack.NetworkPolicy(internet=False), client=self.client)
        self.assertEqual(self.stub.last.json()["network"], {"internet": False, "allow_out": [], "deny_out": []})
        Sandbox.create(client=self.client)
        self.assertNotIn("network", self.stub.last.json())

    def test_create_progress(self):
        events = [
            {"type": "progress", "message": "baking template tiny-224m-1c (not baked yet)"},
            {"type": "progress", "message": "booting guest"},
            {"type": "done", "sandbox": dict(SANDBOX, memory_mib=224)},
        ]
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.stub.route("POST", "/v1/sandboxes", lambda rec, h: send_chunked(h, 200, [data[i : i + 7] for i in range(0, len(data), 7)]))
        steps = []
        sb = Sandbox.create(template="tiny", memory_mib=224, client=self.client, on_progress=steps.append)
        self.assertEqual((sb.id, sb.info.memory_mib), ("abc123", 224))
        self.assertEqual(steps, ["baking template tiny-224m-1c (not baked yet)", "booting guest"])
        self.assertEqual(self.stub.last.query, "progress=1")
        self.assertEqual(self.stub.last.json()["memory_mib"], 224)

    def test_create_progress_error_and_old_server(self):
        err = json.dumps({"type": "error", "error": {"code": "not_found", "message": "template \"x\" not found"}}).encode() + b"\n"
        self.stub.route("POST", "/v1/sandboxes", lambda rec, h: send_chunked(h, 200, [err]))
        with self.assertRaises(pandastack.NotFoundError):
            Sandbox.create(template="x", client=self.client, on_progress=lambda m: None)
        cut = json.dumps({"type": "progress", "message": "baking"}).encode() + b"\n"
        self.stub.route("POST", "/v1/sandboxes", lambda rec, h: send_chunked(h, 200, [cut]))
        with self.assertRaises(pandastack.PandaConnectionError):
            Sandbox.create(client=self.client, on_progress=lambda m: None)
        # A server that does not stream a create's progress answers JSON.
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        sb = Sandbox.create(client=self.client, on_progress=lambda m: self.fail("progress from a server that sent none"))
        self.assertEqual(sb.id, "abc123")

    def test_network_of_info(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, dict(SANDBOX, network={"internet": False, "allow_out": ["pypi.org"]}))
        sb = self.sandbox()
        self.assertEqual(sb.network, pandastack.NetworkPolicy(internet=False, allow_out=["pypi.org"], deny_out=[]))
        self.assertIs(sb.network, sb.info.network)
        self.assertIsNone(pandastack.SandboxInfo.from_dict(SANDBOX).network, "a sandbox without network")
        self.assertFalse(pandastack.SandboxInfo.from_dict(SANDBOX).network_off)
        self.assertTrue(pandastack.SandboxInfo.from_dict(dict(SANDBOX, network_off=True)).network_off, "a host without sandbox networking")

    def test_set_network_sends_only_given_fields(self):
        answer = dict(SANDBOX, network={"internet": True, "allow_out": ["pypi.org"], "deny_out": ["*.example.com"]})
        self.stub.json_route("PATCH", "/v1/sandboxes/abc123/network", 200, answer)
        sb = self.sandbox()
        got = sb.set_network(internet=True, deny_out=["*.example.com"])
        self.assertEqual((self.stub.last.method, self.stub.last.json()), ("PATCH", {"internet": True, "deny_out": ["*.example.com"]}))
        self.assertEqual(got, pandastack.NetworkPolicy(True, ["pypi.org"], ["*.example.com"]))
        self.assertEqual(sb.network, got)
        sb.set_network(allow_out=[])
        self.assertEqual(self.stub.last.json(), {"allow_out": []})
        sb.set_network(internet=False)
        self.assertEqual(self.stub.last.json(), {"internet": False})

    def test_local_type_checks(self):
        sb = self.sandbox()
        n = len(self.stub.requests)
        for bad in [{"allow_out": "pypi.org"}, {"deny_out": [1]}, {"internet": "no"}, "internet", {"internet": 0}]:
            with self.assertRaises(TypeError, msg=repr(bad)):
                Sandbox.create(network=bad, client=self.client)
        with self.assertRaisesRegex(ValueError, "allow_in"):
            Sandbox.create(network={"allow_in": []}, client=self.client)
        with self.assertRaises(TypeError):
            sb.set_network(allow_out="pypi.org")
        with self.assertRaises(ValueError):
            sb.set_network()
        self.assertEqual(len(self.stub.requests), n, "invalid arguments went to the server")

    def test_bad_entry_names_it(self):
        self.stub.json_route("POST", "/v1/sandboxes", 400, self.BAD)
        self.stub.json_route("PATCH", "/v1/sandboxes/abc123/network", 400, self.BAD)
        with self.assertRaises(pandastack.BadRequestError) as cm:
            Sandbox.create(network={"allow_out": ["bad entry!"]}, client=self.client)
        self.assertIn('allow_out entry "bad entry!"', str(cm.exception))
        sb = self.sandbox()
        with self.assertRaises(pandastack.BadRequestError) as cm:
            sb.set_network(allow_out=["bad entry!"])
        self.assertEqual(cm.exception.status, 400)
        self.assertIn('"bad entry!"', cm.exception.message)
        self.assertIsNone(sb.network, "a refused change must not change info")


if __name__ == "__main__":
    unittest.main()
