"""Unit tests of the asyncio client against the in-process stub HTTP server.

They mirror test_unit_http.py for what the asyncio transport does itself
(framing, keep-alive, retries, timeouts, streams, cancellation), and hold the
two clients to the same wire requests and the same public surface. Real
behaviour is tested against `panda up` in test_integration_async.py.
"""

import asyncio
import gc
import gzip
import inspect
import io
import json
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
import unittest
import warnings
from unittest import mock

from _helpers import SANDBOX, StubServer, send_chunked, send_json
import pandastack
from pandastack import AsyncClient, AsyncFilesystem, AsyncSandbox, AsyncSnapshot, Client, Filesystem, Sandbox, Snapshot
from pandastack import AsyncCommandHandle, AsyncCommands, AsyncPty, AsyncTerminalHandle, CommandHandle, Commands, Pty, TerminalHandle
from pandastack import Template
from pandastack import AsyncVolume, AsyncVolumeFiles, Volume, VolumeFiles
from pandastack.async_client import _Conn
from test_unit_templates import BUILD, LOGS, make_tree, ndjson, parse_multipart


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AsyncStubTestCase(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = AsyncClient(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)

    async def asyncTearDown(self):
        await self.client.close()

    async def sandbox(self) -> AsyncSandbox:
        return await AsyncSandbox.connect("abc123", client=self.client)


class SurfaceTest(unittest.TestCase):
    """Every public method of the sync API has an async twin with the same name and arguments."""

    PAIRS = [
        (Client, AsyncClient),
        (Sandbox, AsyncSandbox),
        (Filesystem, AsyncFilesystem),
        (Snapshot, AsyncSnapshot),
        (Volume, AsyncVolume),
        (VolumeFiles, AsyncVolumeFiles),
        (Commands, AsyncCommands),
        (CommandHandle, AsyncCommandHandle),
        (Pty, AsyncPty),
        (TerminalHandle, AsyncTerminalHandle),
    ]
    # Sync-only on purpose: the context-manager protocol is __aenter__/__aexit__.
    # output returns its async iterator at once (the request goes out on the first iteration).
    NOT_COROUTINES = {"url", "template_build_logs", "create", "id", "info", "state", "network", "client", "output"}
    # Coroutines although a sync twin's name is in NOT_COROUTINES (a property there).
    COROUTINES = {(AsyncCommandHandle, "info"), (AsyncTerminalHandle, "info"), (AsyncPty, "create")}

    def test_same_names_and_signatures(self):
        for sync_cls, async_cls in self.PAIRS:
            for name, member in inspect.getmembers(sync_cls):
                if name.startswith("_"):
                    continue
                with self.subTest(cls=sync_cls.__name__, name=name):
                    self.assertTrue(hasattr(async_cls, name), "%s.%s has no async twin" % (async_cls.__name__, name))
                    twin = getattr(async_cls, name)
                    if isinstance(member, property) or not callable(member):
                        continue
                    got = [(p.name, p.kind, p.default) for p in inspect.signature(twin).parameters.values()]
                    want = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
                    self.assertEqual(got, want)
                    if name not in self.NOT_COROUTINES or (async_cls, name) in self.COROUTINES:
                        self.assertTrue(inspect.iscoroutinefunction(twin), "%s.%s is not a coroutine function" % (async_cls.__name__, name))

    def test_exported(self):
        for name in ("AsyncClient", "AsyncSandbox", "AsyncSnapshot", "AsyncFilesystem", "AsyncExecStream", "AsyncCommands", "AsyncCommandHandle",
                     "AsyncTerminalHandle", "AsyncPty", "AsyncOutputStream"):
            self.assertIn(name, pandastack.__all__)

    def test_sync_client_is_refused(self):
        async def go():
            await AsyncSandbox.connect("abc", client=Client(api_key="k"))

        with self.assertRaises(TypeError):
            asyncio.run(go())


class SameWireTest(unittest.TestCase):
    """The two clients send the same requests (headers compared but Host, Connection and Accept-Encoding)."""

    def test_requests_match_the_sync_client(self):
        stub = StubServer().start()
        self.addCleanup(stub.stop)
        stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        stub.json_route("GET", "/v1/sandboxes", 200, {"sandboxes": [SANDBOX]})
        stub.json_route("POST", "/v1/sandboxes/abc123/exec", 200, {"exit_code": 0})
        stub.json_route("PUT", "/v1/sandboxes/abc123/files", 200, {"path": "/a b"})
        stub.json_route("DELETE", "/v1/sandboxes/abc123", 204, None)
        args = dict(template="tiny", memory_mib=256, metadata={"k": "v é"}, env={"A": "1"}, network={"internet": False, "allow_out": ["pypi.org"]})

        with Client(api_key="k", api_url=stub.url) as c:
            sb = Sandbox.create(client=c, **args)
            Sandbox.list(state="running", metadata={"k": "v"}, client=c)
            sb.exec(["ls", "-l"], env={"X": "y"}, cwd="/w", stdin=b"in", user="1000", timeout_seconds=5)
            sb.filesystem.write("/a b&c", "héllo", mode=0o755)
            sb.kill()
        sync_reqs, stub.requests[:] = list(stub.requests), []

        async def go():
            async with AsyncClient(api_key="k", api_url=stub.url) as c:
                sb = await AsyncSandbox.create(client=c, **args)
                await AsyncSandbox.list(state="running", metadata={"k": "v"}, client=c)
                await sb.exec(["ls", "-l"], env={"X": "y"}, cwd="/w", stdin=b"in", user="1000", timeout_seconds=5)
                await sb.filesystem.write("/a b&c", "héllo", mode=0o755)
                await sb.kill()

        asyncio.run(go())
        skip = {"host", "connection", "accept-encoding"}
        self.assertEqual(len(stub.requests), len(sync_reqs))
        for got, want in zip(stub.requests, sync_reqs):
            self.assertEqual((got.method, got.target, got.body, got.chunked), (want.method, want.target, want.body, want.chunked))
            gh = {k.lower(): v for k, v in got.headers.items() if k.lower() not in skip}
            wh = {k.lower(): v for k, v in want.headers.items() if k.lower() not in skip}
            self.assertEqual(gh, wh)


class LifecycleTest(AsyncStubTestCase):
    async def test_create_awaited_and_as_context_manager(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 204, None)
        sb = await AsyncSandbox.create(template="tiny", client=self.client)
        self.assertEqual((sb.id, sb.state, sb.info.memory_mib), ("abc123", "running", 256))
        async with AsyncSandbox.create(template="tiny", client=self.client) as sb2:
            self.assertEqual(sb2.id, "abc123")
        self.assertEqual(self.stub.last.method, "DELETE")
        async with await AsyncSandbox.create(template="tiny", client=self.client) as sb3:
            self.assertIsInstance(sb3, AsyncSandbox)
        self.assertEqual(self.stub.last.method, "DELETE")

    async def test_create_progress(self):
        events = [{"type": "progress", "message": "fetching template app:2"}, {"type": "done", "sandbox": SANDBOX}]
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.stub.route("POST", "/v1/sandboxes", lambda rec, h: send_chunked(h, 200, [data]))
        steps = []

        async def note(msg):
            steps.append(msg)

        sb = await AsyncSandbox.create(template="app:2", client=self.client, on_progress=note)
        self.assertEqual((sb.id, steps, self.stub.last.query), ("abc123", ["fetching template app:2"], "progress=1"))
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)  # a server without progress
        sb = await AsyncSandbox.create(client=self.client, on_progress=steps.append)
        self.assertEqual((sb.id, len(steps)), ("abc123", 1))

    async def test_context_manager_kills_and_keeps_original_exception(self):
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 503, {"error": {"code": "unavailable", "message": "down"}})
        with self.assertRaises(KeyError):
            async with await self.sandbox():
                raise KeyError("boom")
        self.assertEqual(self.stub.last.method, "DELETE")
        with self.assertRaises(pandastack.UnavailableError):
            async with await self.sandbox():
                pass

    async def test_pause_resume_ttl_network(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/pause", 200, dict(SANDBOX, state="paused"))
        self.stub.json_route("POST", "/v1/sandboxes/abc123/resume", 200, SANDBOX)
        self.stub.json_route("PUT", "/v1/sandboxes/abc123/ttl", 200, dict(SANDBOX, ttl_seconds=60))
        self.stub.json_route("PATCH", "/v1/sandboxes/abc123/network", 200, dict(SANDBOX, network={"internet": False, "allow_out": [], "deny_out": []}))
        sb = await self.sandbox()
        self.assertEqual((await sb.pause()).state, "paused")
        self.assertEqual(sb.state, "paused")
        self.assertEqual((await sb.resume()).state, "running")
        self.assertEqual((await sb.set_ttl(60)).ttl_seconds, 60)
        self.assertFalse((await sb.set_network(internet=False)).internet)
        self.assertEqual(self.stub.last.json(), {"internet": False})

    async def test_fork_one_many_and_partial(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"sandbox": dict(SANDBOX, id="c1")}]})
        sb = await self.sandbox()
        child = await sb.fork()
        self.assertIsInstance(child, AsyncSandbox)
        self.assertEqual(child.id, "c1")
        self.stub.json_route(
            "POST",
            "/v1/sandboxes/abc123/fork",
            201,
            {"children": [{"sandbox": dict(SANDBOX, id="c1")}, {"error": {"code": "quota_exceeded", "message": "over"}}]},
        )
        with self.assertRaises(pandastack.ForkError) as cm:
            await sb.fork(2)
        self.assertEqual([c.id for c in cm.exception.children], ["c1"])
        self.assertIsInstance(cm.exception.children[0], AsyncSandbox)
        self.assertIsInstance(cm.exception.errors[0], pandastack.QuotaExceededError)

    async def test_snapshot_and_create_from_it(self):
        snap = {"id": "s1", "name": "n", "sandbox_id": "abc123", "template": "tiny", "memory_mib": 256}
        self.stub.json_route("POST", "/v1/sandboxes/abc123/snapshots", 201, snap)
        self.stub.json_route("GET", "/v1/snapshots", 200, {"snapshots": [snap]})
        self.stub.json_route("POST", "/v1/sandboxes", 201, SANDBOX)
        s = await (await self.sandbox()).snapshot(name="n")
        self.assertIsInstance(s, AsyncSnapshot)
        self.assertEqual((s.id, s.name, s.memory_mib), ("s1", "n", 256))
        self.assertEqual([x.id for x in await AsyncSnapshot.list(client=self.client)], ["s1"])
        await AsyncSandbox.create(snapshot=s, client=self.client)
        self.assertEqual(self.stub.last.json()["snapshot_id"], "s1")


class ErrorMappingTest(AsyncStubTestCase):
    async def test_status_and_body(self):
        self.stub.json_route("GET", "/v1/sandboxes/nope", 404, {"error": {"code": "not_found", "message": "sandbox nope not found"}})
        with self.assertRaises(pandastack.NotFoundError) as cm:
            await AsyncSandbox.connect("nope", client=self.client)
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.message), (404, "not_found", "sandbox nope not found"))

    async def test_non_json_error(self):
        self.stub.route("GET", "/v1/sandboxes/abc123", lambda rec, h: (h.send_response(502), h.send_header("Content-Length", "3"), h.end_headers(), h.wfile.write(b"bad")))
        with self.assertRaises(pandastack.PandaError) as cm:
            await self.sandbox()
        self.assertEqual(cm.exception.status, 502)

    async def test_kill_ignores_not_found_only(self):
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 404, {"error": {"code": "not_found", "message": "gone"}})
        sb = await self.sandbox()
        await sb.kill()
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123", 401, {"error": {"code": "unauthorized", "message": "bad key"}})
        with self.assertRaises(pandastack.AuthenticationError):
            await sb.kill()

    async def test_exists(self):
        self.stub.json_route("GET", "/v1/sandboxes/abc123/files/stat", 404, {"error": {"code": "not_found", "message": "no such file"}})
        sb = await self.sandbox()
        self.assertFalse(await sb.filesystem.exists("/nope"))
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 404, {"error": {"code": "not_found", "message": "sandbox gone"}})
        with self.assertRaises(pandastack.NotFoundError):
            await sb.filesystem.exists("/nope")

    async def test_missing_key(self):
        with mock.patch.dict(os.environ, {"PANDASTACK_API_KEY": ""}):
            c = AsyncClient(api_url=self.stub.url)
        with self.assertRaises(pandastack.ConfigurationError):
            await c.list_keys()

    async def test_connection_refused_mentions_panda_up(self):
        url = "http://127.0.0.1:%d" % free_port()
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            await AsyncSandbox.connect("abc", api_key="k", api_url=url)
        self.assertIn("panda up", str(cm.exception))
        self.assertIn(url, str(cm.exception))
        self.assertIsInstance(cm.exception, ConnectionError)

    async def test_read_timeout(self):
        release, answered = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def hold(rec, h):
            release.wait(60)
            answered.set()

        self.stub.route("GET", "/v1/sandboxes/slow", hold)
        c = AsyncClient(api_key="k", api_url=self.stub.url, timeout=0.3)
        with self.assertRaises(pandastack.RequestTimeoutError):
            await AsyncSandbox.connect("slow", client=c)
        # The client's own timeout: the server still holds the request.
        self.assertFalse(answered.is_set(), "the server answered before the client timed out")
        self.assertEqual(c._idle, [])


class KeepAliveTest(AsyncStubTestCase):
    async def test_connection_is_reused(self):
        sb = await self.sandbox()
        for _ in range(5):
            await sb.refresh()
        self.assertEqual(self.stub.connections, 1)

    def _closing_route(self):
        calls = []

        def get(rec, h):
            calls.append(1)
            send_json(h, 200, SANDBOX, silent_close=len(calls) == 1)

        self.stub.route("GET", "/v1/sandboxes/abc123", get)
        return calls

    async def test_server_closed_idle_connection_is_not_reused(self):
        calls = self._closing_route()
        sb = await self.sandbox()
        # The server hung up the idle connection.
        await asyncio.get_running_loop().run_in_executor(None, self.stub.wait_closed, 1)
        await sb.refresh()
        await sb.refresh()
        self.assertEqual(len(calls), 3)
        self.assertEqual(self.stub.connections, 2)

    async def test_stale_connection_is_retried_for_idempotent_requests(self):
        calls = self._closing_route()
        sb = await self.sandbox()
        # The server hung up the idle connection.
        await asyncio.get_running_loop().run_in_executor(None, self.stub.wait_closed, 1)
        with mock.patch.object(_Conn, "dropped", return_value=False):
            await sb.refresh()  # sent on the dead connection, then retried on a new one
        self.assertEqual(len(calls), 2)
        self.assertEqual(self.stub.connections, 2)

    async def test_post_is_not_resent_once_sent(self):
        calls = []

        def post(rec, h):
            calls.append(1)
            h.close_connection = True

        self.stub.route("POST", "/v1/sandboxes/abc123/exec", post)
        sb = await self.sandbox()
        with self.assertRaises(pandastack.PandaConnectionError):
            await sb.exec("true")
        self.assertEqual(len(calls), 1, "a non-idempotent request that reached the server was sent again")

    async def test_concurrent_requests(self):
        sb = await self.sandbox()
        infos = await asyncio.gather(*[sb.refresh() for _ in range(100)])
        self.assertEqual({i.id for i in infos}, {"abc123"})
        # Requests without a local file run on the loop alone: no executor threads.
        self.assertEqual([t.name for t in threading.enumerate() if t.name.startswith("asyncio_")], [])
        self.assertLessEqual(len(self.client._idle), 64)

    def test_client_outlives_its_event_loop(self):
        c = AsyncClient(api_key="k", api_url=self.stub.url)
        # The first loop ends with a pooled connection (asyncio warns that
        # its writer outlived the loop); the second loop must not use it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            got = asyncio.run(AsyncSandbox.connect("abc123", client=c))
            gc.collect()
        self.assertEqual(got.id, "abc123")

        async def again():
            try:
                return await AsyncSandbox.connect("abc123", client=c)
            finally:
                await c.close()

        self.assertEqual(asyncio.run(again()).id, "abc123")
        self.assertEqual(self.stub.connections, 2)


class UploadDownloadTest(AsyncStubTestCase):
    def setUp(self):
        super().setUp()

        def put(rec, h):
            send_json(h, 200, {"name": "f", "path": "/f", "size": len(rec.body), "mode": 420, "is_dir": False})

        self.stub.route("PUT", "/v1/sandboxes/abc123/files", put)

    async def test_str_and_pathlike(self):
        fs = (await self.sandbox()).filesystem
        fi = await fs.write("/f", "héllo")
        self.assertEqual((self.stub.last.body, self.stub.last.chunked, fi.size), ("héllo".encode(), False, 6))
        with tempfile.TemporaryDirectory() as d:
            p = pathlib.Path(d, "x.bin")
            p.write_bytes(b"\x00\x01\x02")
            await fs.write("/f", p)
        self.assertEqual(self.stub.last.body, b"\x00\x01\x02")

    async def test_unsized_stream_is_chunked(self):
        data = os.urandom(3 << 20)

        class Reader(io.RawIOBase):
            def __init__(self):
                self.pos = 0

            def readable(self):
                return True

            def readinto(self, b):
                n = min(len(b), len(data) - self.pos)
                b[:n] = data[self.pos : self.pos + n]
                self.pos += n
                return n

        fi = await (await self.sandbox()).filesystem.write("/f", Reader())
        self.assertTrue(self.stub.last.chunked)
        self.assertEqual(self.stub.last.body, data)
        self.assertEqual(fi.size, len(data))

    async def test_upload_rejected_before_body_keeps_servers_error(self):
        self.stub.early_routes[("PUT", "/v1/sandboxes/abc123/files")] = lambda rec, h: send_json(
            h, 413, {"error": {"code": "payload_too_large", "message": "too big"}}, close=True
        )

        class Endless(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, b):
                b[:] = b"\0" * len(b)
                return len(b)

        fs = (await self.sandbox()).filesystem
        with self.assertRaises(pandastack.PayloadTooLargeError):
            await fs.write("/f", io.BufferedReader(Endless()))

    async def test_download_to_path_and_file(self):
        data = os.urandom(2 << 20)
        self.stub.route("GET", "/v1/sandboxes/abc123/files", lambda rec, h: send_chunked(h, 200, [data[i : i + 100000] for i in range(0, len(data), 100000)], "application/octet-stream"))
        fs = (await self.sandbox()).filesystem
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "out")
            self.assertEqual(await fs.download("/f", p), len(data))
            with open(p, "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertFalse(os.path.exists(p + ".part"))
        buf = io.BytesIO()
        await fs.download("/f", buf)
        self.assertEqual(buf.getvalue(), data)
        self.assertEqual(await fs.read("/f"), data)

    async def test_broken_download_leaves_no_file(self):
        self.stub.route("GET", "/v1/sandboxes/abc123/files", lambda rec, h: send_chunked(h, 200, [b"x" * 1000], "application/octet-stream", end=False))
        fs = (await self.sandbox()).filesystem
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(pandastack.PandaConnectionError):
                await fs.download("/f", os.path.join(d, "out"))
            self.assertEqual(os.listdir(d), [])

    async def test_file_operations_paths(self):
        fi = {"name": "b", "path": "/a/b", "size": 0, "mode": 493, "is_dir": True}
        self.stub.json_route("GET", "/v1/sandboxes/abc123/files/list", 200, {"entries": [fi]})
        self.stub.json_route("POST", "/v1/sandboxes/abc123/files/mkdir", 200, fi)
        self.stub.json_route("POST", "/v1/sandboxes/abc123/files/rename", 200, fi)
        self.stub.json_route("DELETE", "/v1/sandboxes/abc123/files", 204, None)
        fs = (await self.sandbox()).filesystem
        self.assertEqual([e.name for e in await fs.list("/a")], ["b"])
        self.assertEqual(self.stub.last.query, "path=/a")
        self.assertTrue((await fs.mkdir("/a/b")).is_dir)
        await fs.rename("/x", "/a/b")
        self.assertEqual(self.stub.last.json(), {"from": "/x", "to": "/a/b"})
        await fs.remove("/a b", recursive=True)
        self.assertEqual(self.stub.last.query, "path=/a%20b&recursive=true")


class ExecStreamTest(AsyncStubTestCase):
    def route_events(self, events, split=5, end=True):
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        pieces = [data[i : i + split] for i in range(0, len(data), split)]
        self.stub.route("POST", "/v1/sandboxes/abc123/exec/stream", lambda rec, h: send_chunked(h, 200, pieces, end=end))

    EVENTS = [
        {"type": "start", "pid": 12},
        {"type": "stdout", "data": "one\n"},
        {"type": "stderr", "data": "warn 🐼\n"},
        {"type": "stdout", "data": "two\n"},
        {"type": "future_event", "x": 1},
        {"type": "exit", "exit_code": 137, "signal": "SIGKILL", "timed_out": True, "duration_ms": 1000},
    ]

    async def test_events_to_callbacks_plain_and_async(self):
        self.route_events(self.EVENTS)
        out, err = [], []

        async def on_err(s):
            await asyncio.sleep(0)
            err.append(s)

        r = await (await self.sandbox()).exec("x", on_stdout=out.append, on_stderr=on_err)
        self.assertEqual(out, ["one\n", "two\n"])
        self.assertEqual(err, ["warn 🐼\n"])
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out, r.duration_ms), ("one\ntwo\n", "warn 🐼\n", 137, "SIGKILL", True, 1000))
        self.assertEqual(self.stub.last.json(), {"cmd": "x", "timeout_seconds": 60})
        self.assertEqual(self.stub.last.headers["Accept"], "application/x-ndjson")

    async def test_exec_stream_iterator(self):
        self.route_events(self.EVENTS)
        s = (await self.sandbox()).exec_stream(["x", "y"])
        got = [ev async for ev in s]
        self.assertEqual(got, [("stdout", "one\n"), ("stderr", "warn 🐼\n"), ("stdout", "two\n")])
        self.assertEqual((s.result.exit_code, s.result.stdout), (137, "one\ntwo\n"))
        self.assertEqual(self.stub.last.json(), {"argv": ["x", "y"], "timeout_seconds": 60})

    async def test_error_event_raises_mapped_error(self):
        self.route_events([{"type": "start", "pid": 1}, {"type": "error", "error": {"code": "conflict", "message": "sandbox stopped"}}])
        with self.assertRaises(pandastack.ConflictError) as cm:
            await (await self.sandbox()).exec("x", on_stdout=print)
        self.assertEqual(cm.exception.message, "sandbox stopped")

    async def test_stream_cut_before_exit(self):
        self.route_events([{"type": "stdout", "data": "o"}], end=False)
        with self.assertRaises(pandastack.PandaConnectionError):
            async for _ in (await self.sandbox()).exec_stream("x"):
                pass

    async def test_http_error_before_stream(self):
        self.stub.json_route("POST", "/v1/sandboxes/abc123/exec/stream", 404, {"error": {"code": "not_found", "message": "executable not found"}})
        with self.assertRaises(pandastack.NotFoundError):
            await (await self.sandbox()).exec(["nope"], on_stdout=lambda s: None)


class CancellationTest(AsyncStubTestCase):
    def _endless_stream(self):
        """A stream route writing a line every 10 ms until the client hangs up; sets the event then."""
        hung_up = threading.Event()

        def route(rec, h):
            h.send_response(200)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            line = json.dumps({"type": "stdout", "data": "x"}).encode() + b"\n"
            try:
                for _ in range(500):
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    h.wfile.flush()
                    time.sleep(0.01)
            except OSError:
                hung_up.set()
            h.close_connection = True

        self.stub.route("POST", "/v1/sandboxes/abc123/exec/stream", route)
        return hung_up

    async def test_cancelled_request_closes_its_connection(self):
        ev, arrived = threading.Event(), threading.Event()
        self.addCleanup(ev.set)
        def slow(rec, h):
            arrived.set()
            ev.wait(5)
            try:
                send_json(h, 201, SANDBOX)
            except OSError:
                pass  # the client hung up, as it should

        self.stub.route("POST", "/v1/sandboxes", slow)
        task = asyncio.ensure_future(AsyncSandbox.create(template="tiny", client=self.client))
        # Cancel once the request is on the server.
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, arrived.wait, 30), "the create never reached the server")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertEqual(self.client._idle, [])
        ev.set()
        self.assertEqual((await self.sandbox()).id, "abc123")  # the client is still usable

    async def test_cancelled_exec_stream_hangs_up(self):
        hung_up = self._endless_stream()
        sb = await self.sandbox()
        got = []

        async def consume():
            async for kind, text in sb.exec_stream("yes"):
                got.append(text)

        task = asyncio.ensure_future(consume())
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # polling for the first output, bounded by the deadline
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertTrue(got)
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, hung_up.wait, 3), "the server kept writing to a cancelled stream")

    async def test_break_out_of_exec_stream_hangs_up(self):
        hung_up = self._endless_stream()
        sb = await self.sandbox()
        async with sb.exec_stream("yes") as s:
            async for _ in s:
                break
        self.assertIsNone(s.result)
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, hung_up.wait, 3))


P = "/v1/sandboxes/abc123/processes"
def ndjson_lines(*events):
    return [json.dumps(e).encode() + b"\n" for e in events]


PROC = {"pid": 112, "cmd": "sleep 1", "state": "running", "started_at": "2025-01-02T03:04:05Z", "exit_code": None, "stdin_open": True}


class ProcessesTest(AsyncStubTestCase):
    """sb.commands and sb.pty send what the sync ones send (test_unit_processes.py) and decode the same."""

    async def test_run_background_body_and_stdin_text(self):
        sb = await self.sandbox()
        self.stub.json_route("POST", P, 201, PROC)
        self.stub.route("POST", P + "/112/stdin", lambda rec, h: send_json(h, 204, None))
        h = await sb.commands.run(["sh", "-c", "x"], background=True, stdin=True, env={"A": "1"}, cwd="/tmp", user="nobody", timeout_seconds=5)
        self.assertIsInstance(h, AsyncCommandHandle)
        self.assertEqual((h.pid, h.last_info.stdin_open), (112, True))
        self.assertEqual(self.stub.last.json(), {"argv": ["sh", "-c", "x"], "stdin": True, "env": {"A": "1"}, "cwd": "/tmp", "user": "nobody", "timeout_seconds": 5})
        await sb.commands.run("cat", background=True, stdin="hi")
        start, write = self.stub.requests[-2], self.stub.requests[-1]
        self.assertEqual(start.json(), {"cmd": "cat", "stdin": True})
        self.assertEqual((write.body, write.query), (b"hi", "close=true"))
        with self.assertRaises(ValueError):
            await sb.commands.run("cat", background=True, on_stdout=print)

    async def test_run_foreground_is_exec(self):
        sb = await self.sandbox()
        self.stub.json_route("POST", "/v1/sandboxes/abc123/exec", 200, {"exit_code": 3, "stdout": "o", "stderr": "e", "duration_ms": 1})
        r = await sb.commands.run("exit 3", stdin="x")
        self.assertEqual(r, pandastack.ExecResult(3, "o", "e", 1))
        self.assertEqual(self.stub.last.json(), {"cmd": "exit 3", "stdin": "x"})
        with self.assertRaises(ValueError):
            await sb.commands.run("cat", stdin=True)

    async def test_stdin_signal_resize_delete_shapes(self):
        sb = await self.sandbox()
        for suffix in ("/stdin", "/signal", "/resize"):
            self.stub.route("POST", P + "/7" + suffix, lambda rec, h: send_json(h, 204, None))
        self.stub.route("DELETE", P + "/7", lambda rec, h: send_json(h, 204, None))
        h = AsyncTerminalHandle(sb, 7)
        await h.send_stdin(b"\x00raw\xff")
        self.assertEqual((self.stub.last.body, self.stub.last.query, self.stub.last.headers["Content-Type"]), (b"\x00raw\xff", "", "application/octet-stream"))
        await h.send_input("ls\r")
        self.assertEqual(self.stub.last.body, b"ls\r")
        await h.close_stdin()
        self.assertEqual((self.stub.last.body, self.stub.last.query), (b"", "close=true"))
        await h.signal("TERM")
        self.assertEqual(self.stub.last.json(), {"signal": "TERM"})
        self.assertTrue(await h.kill())
        self.assertEqual(self.stub.last.json(), {"signal": "KILL"})
        self.assertTrue(await sb.commands.kill(7))
        self.assertEqual((self.stub.last.path, self.stub.last.json()), (P + "/7/signal", {"signal": "KILL"}))
        await h.resize(50, 132)
        self.assertEqual((self.stub.last.path, self.stub.last.json()), (P + "/7/resize", {"rows": 50, "cols": 132}))
        await h.remove()
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("DELETE", P + "/7"))

    async def test_output_parsing_and_wait_with_async_callback(self):
        sb = await self.sandbox()
        events = ndjson_lines(
            {"type": "start", "pid": 112},
            {"type": "dropped", "stream": "stdout", "bytes": 10, "offset": 10},
            {"type": "stdout", "data": "start\n", "offset": 10},
            {"type": "stderr", "data": "oops\n", "offset": 0},
            {"type": "future", "x": 1},
            {"type": "exit", "exit_code": 143, "signal": "SIGTERM", "timed_out": False, "duration_ms": 5},
        )
        pieces = [events[0] + events[1][:7], events[1][7:]] + events[2:]
        self.stub.route("GET", P + "/112/output", lambda rec, h: send_chunked(h, 200, pieces))
        h = AsyncCommandHandle(sb, 112)
        stream = h.output(from_=10)
        chunks = [c async for c in stream]
        self.assertEqual(self.stub.last.query, "from=10")
        self.assertEqual(self.stub.last.headers["Accept"], "application/x-ndjson")
        OC = pandastack.OutputChunk
        self.assertEqual(chunks, [OC("stdout", "", 10, 10), OC("stdout", "start\n", 10), OC("stderr", "oops\n", 0)])
        self.assertEqual((stream.result.exit_code, stream.result.signal), (143, "SIGTERM"))
        got = []

        async def on_err(text):
            got.append(("err", text))

        r = await h.wait(on_stdout=lambda t: got.append(("out", t)), on_stderr=on_err)
        self.assertEqual(self.stub.last.query, "from=start")
        self.assertEqual(r, pandastack.ExecResult(143, "start\n", "oops\n", 5, "SIGTERM", False, True))
        self.assertEqual(got, [("out", "start\n"), ("err", "oops\n")])

    async def test_output_error_event_cut_stream_and_bad_from(self):
        sb = await self.sandbox()
        self.stub.route("GET", P + "/1/output", lambda rec, h: send_chunked(h, 200, ndjson_lines({"type": "error", "error": {"code": "not_found", "message": "gone"}})))
        with self.assertRaises(pandastack.NotFoundError):
            [c async for c in AsyncCommandHandle(sb, 1).output()]
        self.stub.route("GET", P + "/2/output", lambda rec, h: send_chunked(h, 200, ndjson_lines({"type": "stdout", "data": "x", "offset": 0})))
        with self.assertRaises(pandastack.PandaConnectionError):
            await AsyncCommandHandle(sb, 2).wait()
        with self.assertRaises(ValueError):
            AsyncCommandHandle(sb, 2).output(from_="middle")

    async def test_wait_timeout_and_stop(self):
        sb = await self.sandbox()

        release = threading.Event()
        self.addCleanup(release.set)
        started, ended = [], []  # output requests the server streamed to, and ended

        def slow(rec, h):
            send_chunked(h, 200, ndjson_lines({"type": "start", "pid": 3}), end=False)
            started.append(rec)
            release.wait(60)
            ended.append(rec)

        self.stub.route("GET", P + "/3/output", slow)
        with self.assertRaises(pandastack.RequestTimeoutError):
            await AsyncCommandHandle(sb, 3).wait(timeout=0.3)
        # The wait's own timeout: the server still holds the stream open.
        self.assertEqual(ended, [], "the stream ended before the wait timed out")
        # stop() from another task ends an iteration that waits for output.
        stream = AsyncCommandHandle(sb, 3).output()

        async def follow():
            return [c async for c in stream]

        task = asyncio.ensure_future(follow())
        deadline = time.monotonic() + 30
        while len(started) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # polling the stub, bounded by the deadline
        self.assertEqual(len(started), 2, "the iteration's request never reached the server")
        await stream.stop()
        self.assertEqual(await asyncio.wait_for(task, 30), [])
        self.assertIsNone(stream.result)

    async def test_errors_list_connect_pty(self):
        sb = await self.sandbox()
        self.stub.json_route("GET", P + "/999", 404, {"error": {"code": "not_found", "message": "no process 999"}})
        with self.assertRaises(pandastack.NotFoundError):
            await sb.commands.connect(999)
        with self.assertRaises(TypeError):
            await sb.commands.connect("999")
        self.stub.json_route("POST", P + "/5/stdin", 409, {"error": {"code": "conflict", "message": "process 5 has exited"}})
        with self.assertRaises(pandastack.ConflictError):
            await AsyncCommandHandle(sb, 5).send_stdin("x")
        self.stub.json_route("POST", P + "/5/signal", 409, {"error": {"code": "conflict", "message": "process 5 has exited"}})
        self.assertFalse(await AsyncCommandHandle(sb, 5).kill())
        self.stub.json_route("GET", P, 200, {"processes": [PROC, dict(PROC, pid=113, state="exited", exit_code=0, ended_at="2025-01-02T03:04:06Z")]})
        got = await sb.commands.list()
        self.assertEqual([(p.pid, p.state, p.exit_code) for p in got], [(112, "running", None), (113, "exited", 0)])
        self.stub.json_route("GET", P + "/130", 200, dict(PROC, pid=130, pty={"rows": 24, "cols": 80}))
        h = await sb.commands.connect(130)
        self.assertIsInstance(h, AsyncTerminalHandle)
        self.assertEqual((await h.info()).pty, {"rows": 24, "cols": 80})
        self.stub.json_route("GET", P + "/112", 200, PROC)
        self.assertIs(type(await sb.commands.connect(112)), AsyncCommandHandle)
        self.stub.json_route("POST", P, 201, dict(PROC, pid=130, pty={"rows": 30, "cols": 100}))
        t = await sb.pty.create(rows=30, cols=100)
        self.assertIsInstance(t, AsyncTerminalHandle)
        body = self.stub.last.json()
        self.assertEqual(body["pty"], {"rows": 30, "cols": 100})
        self.assertIn("exec /bin/bash -i", body["cmd"])
        await sb.pty.create(cmd=["top"])
        self.assertEqual(self.stub.last.json(), {"argv": ["top"], "pty": {"rows": 24, "cols": 80}})
        with self.assertRaises(ValueError):
            await sb.pty.create(rows=0)
        self.stub.json_route("POST", P, 201, {"cmd": "x"})
        with self.assertRaises(pandastack.PandaError):
            await sb.commands.run("x", background=True)


class TemplatesAndKeysTest(AsyncStubTestCase):
    async def test_build_logs_and_final_build(self):
        events = [{"line": "step 1"}, {"line": "step 2"}, {"build_id": "b1", "name": "app", "status": "succeeded", "version": 2}]
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.stub.route("GET", "/v1/templates/builds/b1/logs", lambda rec, h: send_chunked(h, 200, [data[:7], data[7:]]))
        self.stub.json_route("POST", "/v1/templates", 202, {"build_id": "b1", "name": "app", "status": "queued"})
        logs = self.client.template_build_logs("b1")
        self.assertEqual([line async for line in logs], ["step 1", "step 2"])
        self.assertEqual((logs.build.build_id, logs.build.status), ("b1", "succeeded"))
        seen = []
        b = await self.client.build_template("app", "docker.io/library/alpine:3", on_log=seen.append)
        self.assertTrue(b.succeeded)
        self.assertEqual(seen, ["step 1", "step 2"])

    async def test_failed_build_raises(self):
        ev = json.dumps({"build_id": "b1", "status": "failed", "code": "build_failed", "error": "boom"}).encode() + b"\n"
        self.stub.route("GET", "/v1/templates/builds/b1/logs", lambda rec, h: send_chunked(h, 200, [ev]))
        self.stub.json_route("POST", "/v1/templates", 202, {"build_id": "b1", "name": "app", "status": "queued"})
        with self.assertRaises(pandastack.TemplateBuildError):
            await self.client.build_template("app", "alpine")

    async def test_bake_progress_and_keys(self):
        events = [{"type": "progress", "message": "booting"}, {"type": "done", "template": {"name": "tiny", "baked": True}}]
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.stub.route("POST", "/v1/templates/tiny/bake", lambda rec, h: send_chunked(h, 200, [data]))
        progress = []
        t = await self.client.bake_template("tiny", memory_mib=256, on_progress=progress.append)
        self.assertEqual((t.name, progress), ("tiny", ["booting"]))
        self.assertEqual(self.stub.last.json(), {"memory_mib": 256})
        self.stub.json_route("POST", "/v1/keys", 201, {"id": "k1", "name": "ci", "key": "pk_x"})
        self.stub.json_route("GET", "/v1/keys", 200, {"keys": [{"id": "k1", "name": "ci"}, {"id": "k2", "name": "old", "revoked": True}]})
        k = await self.client.create_key("ci", max_sandboxes=3)
        self.assertEqual((k.id, k.key), ("k1", "pk_x"))
        self.assertEqual(self.stub.last.json(), {"name": "ci", "admin": False, "max_sandboxes": 3})
        self.assertEqual([(x.id, x.revoked) for x in await self.client.list_keys()], [("k1", False), ("k2", True)])


@unittest.skipUnless(shutil.which("openssl"), "needs the openssl command to make a certificate")
class TLSTest(unittest.TestCase):
    """An https URL is spoken over TLS, verified against the system's (here: a test) CA."""

    def test_https(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stub = StubServer()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        stub.httpd.socket = ctx.wrap_socket(stub.httpd.socket, server_side=True)
        stub.start()
        self.addCleanup(stub.stop)
        stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        url = "https://127.0.0.1:%d" % stub.port

        async def go(client):
            try:
                return [(await AsyncSandbox.connect("abc123", client=client)).id for _ in range(3)]
            finally:
                await client.close()

        with mock.patch.dict(os.environ, {"SSL_CERT_FILE": cert}):
            self.assertEqual(asyncio.run(go(AsyncClient(api_key="k", api_url=url))), ["abc123"] * 3)
        self.assertEqual(stub.connections, 1)
        # Without the CA the certificate is refused.
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            asyncio.run(go(AsyncClient(api_key="k", api_url=url)))
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(cm.exception))


class TemplateBuilderAsyncTest(AsyncStubTestCase):
    """``TemplateBuilder.build_async`` sends what ``build`` sends."""

    def setUp(self):
        super().setUp()
        self.stub.json_route("POST", "/v1/templates", 202, BUILD)
        self.stub.route("GET", LOGS, lambda rec, h: send_chunked(h, 200, [ndjson({"line": "step 1"}, dict(BUILD, status="succeeded"))]))

    async def test_from_image(self):
        lines = []
        b = await Template.from_image("registry.example.com/myapp:1.0").start_cmd("srv", ready="true").build_async("myapp", on_log=lines.append, client=self.client)
        self.assertTrue(b.succeeded)
        self.assertEqual(lines, ["step 1"])
        post = [r for r in self.stub.requests if r.method == "POST"][0]
        self.assertEqual(post.json(), {"name": "myapp", "from_image": "registry.example.com/myapp:1.0", "start_cmd": "srv", "ready_cmd": "true"})

    async def test_dockerfile_with_context_and_copy(self):
        d = make_tree(self, {"Dockerfile": "FROM alpine\n", "app.py": "print(1)\n"})
        seen = []
        b = await Template.from_dockerfile(os.path.join(d, "Dockerfile")).build_arg("V", "1").build_async("myapp", on_context=seen.append, client=self.client)
        self.assertTrue(b.succeeded)
        post = [r for r in self.stub.requests if r.method == "POST"][0]
        self.assertTrue(post.chunked, "the context is streamed")
        parts = parse_multipart(post)
        self.assertEqual(json.loads(parts["spec"]), {"name": "myapp", "build_args": {"V": "1"}})
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(parts["context"]))) as tf:
            self.assertEqual(sorted(tf.getnames()), ["Dockerfile", "app.py"])
        self.assertEqual(seen[-1].files, 2)
        self.stub.requests.clear()
        await Template.from_image("alpine:3").copy(os.path.join(d, "app.py"), "/app.py").build_async("myapp", client=self.client)
        parts = parse_multipart([r for r in self.stub.requests if r.method == "POST"][0])
        self.assertIn(b"COPY", parts["dockerfile"])


if __name__ == "__main__":
    unittest.main()
