"""Integration tests of the SDK against a real `panda up` (see _server.py).

One server is started for this module with a fresh data directory and is
stopped with SIGTERM at the end, even when tests fail. Sandboxes use the
`tiny` template (busybox) with 256 MiB to keep the run short under TCG.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import List, Optional
from unittest import mock

from _server import PandaServer, create_tiny, free_port, start_module_server, tag
import pandastack
from pandastack import Client, Sandbox

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None

MiB = 1 << 20


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


def create(client: Optional[Client] = None, **kw) -> Sandbox:
    """A tiny sandbox of ADMIN's unless told otherwise (see create_tiny)."""
    return create_tiny(client or ADMIN, **kw)


class SandboxCase(unittest.TestCase):
    """A test class sharing one sandbox, killed after the class."""

    sb: Sandbox
    create_kwargs: dict = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = create(**cls.create_kwargs)
        cls.addClassCleanup(cls.sb.kill)


class ServerTest(unittest.TestCase):
    def test_health(self):
        self.assertEqual(ADMIN.health()["status"], "ok")

    def test_templates_list_tiny(self):
        names = [t.name for t in ADMIN.list_templates()]
        self.assertIn("tiny", names)

    def test_bake_template_streams_progress(self):
        progress: List[str] = []
        t = ADMIN.bake_template("tiny", memory_mib=256, on_progress=progress.append)
        self.assertEqual((t.name, t.state, t.memory_mib), ("tiny", "ready", 256))
        self.assertIsNotNone(t.baked_at)
        self.assertTrue(progress, "no progress events")
        with create() as sb:  # the re-baked template works
            self.assertEqual(sb.exec("echo ok").stdout, "ok\n")

    def test_create_reports_its_bake(self):
        # A shape no other test bakes: the create bakes it first and says so.
        steps: List[str] = []
        sb = Sandbox.create(template="tiny", memory_mib=320, client=ADMIN, on_progress=steps.append)
        self.addCleanup(sb.kill)
        self.assertEqual((sb.state, sb.info.memory_mib), ("running", 320))
        self.assertTrue(steps and steps[0].startswith("baking template tiny-320m-1c"), steps)
        self.assertEqual(sb.exec("echo ok").stdout, "ok\n")
        again: List[str] = []
        sb2 = Sandbox.create(template="tiny", memory_mib=320, client=ADMIN, on_progress=again.append)
        self.addCleanup(sb2.kill)
        self.assertEqual(again, [], "a baked shape has nothing to report")

    def test_configuration_from_environment(self):
        sb = create(metadata={"env-test": tag()})
        self.addCleanup(sb.kill)
        with mock.patch.dict(os.environ, {"PANDASTACK_API_KEY": SERVER.admin_key, "PANDASTACK_API_URL": SERVER.url}):
            got = Sandbox.connect(sb.id)  # default client from the environment
            self.assertEqual(got.id, sb.id)
            self.assertEqual(got.client.api_url, SERVER.url)
            self.assertIn(sb.id, [s.id for s in Sandbox.list(metadata=sb.info.metadata)])
        # Explicit arguments beat the environment.
        with mock.patch.dict(os.environ, {"PANDASTACK_API_KEY": "wrong", "PANDASTACK_API_URL": "http://127.0.0.1:1"}):
            got = Sandbox.connect(sb.id, api_key=SERVER.admin_key, api_url=SERVER.url)
            self.assertEqual(got.id, sb.id)


class ExecTest(SandboxCase):
    create_kwargs = {"env": {"SANDBOX_VAR": "from-create"}}

    def test_created_running(self):
        info = self.sb.info
        self.assertEqual((info.template, info.state, info.memory_mib), ("tiny", "running", 256))
        self.assertTrue(info.id.isalnum() and info.id == info.id.lower(), info.id)
        self.assertIsNotNone(info.created_at)
        self.assertIsNotNone(info.expires_at)
        self.assertEqual(info.metadata, {})

    def test_stdout_stderr_exit_code(self):
        r = self.sb.exec("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 3))
        self.assertFalse(r.timed_out)
        self.assertIsNone(r.signal)
        self.assertGreaterEqual(r.duration_ms, 0)
        self.assertFalse(r.ok)
        self.assertTrue(self.sb.exec("true").ok)

    def test_argv_is_not_a_shell(self):
        r = self.sb.exec(["echo", "a  b", "$HOME", ";", "x"])
        self.assertEqual(r.stdout, "a  b $HOME ; x\n")

    def test_missing_executable(self):
        # An HTTP error before the command starts, in both modes.
        with self.assertRaises(pandastack.NotFoundError):
            self.sb.exec(["/no/such/program"])
        with self.assertRaises(pandastack.NotFoundError):
            self.sb.exec(["/no/such/program"], on_stdout=lambda s: None)
        self.assertEqual(self.sb.exec("/no/such/program").exit_code, 127)  # through the shell: a result

    def test_env(self):
        r = self.sb.exec("echo $SANDBOX_VAR $X", env={"X": "from-exec"})
        self.assertEqual(r.stdout, "from-create from-exec\n")
        r = self.sb.exec("echo $SANDBOX_VAR", env={"SANDBOX_VAR": "override"})
        self.assertEqual(r.stdout, "override\n")

    def test_cwd(self):
        self.assertEqual(self.sb.exec("pwd", cwd="/tmp").stdout, "/tmp\n")
        self.assertEqual(self.sb.exec("pwd").stdout, "/root\n")

    def test_stdin(self):
        self.assertEqual(self.sb.exec("cat", stdin="hello\nwörld").stdout, "hello\nwörld")

    def test_timeout(self):
        r = self.sb.exec("sleep 30", timeout_seconds=1)
        # The server's verdict, not a stopwatch: timed out, and killed.
        self.assertTrue(r.timed_out, r)
        self.assertNotEqual(r.exit_code, 0)

    def test_unicode_and_invalid_utf8(self):
        self.assertEqual(self.sb.exec("echo 'héllo 🐼'").stdout, "héllo 🐼\n")
        r = self.sb.exec("printf '\\377ok'")
        self.assertTrue(r.stdout.endswith("ok"), repr(r.stdout))
        self.assertIn("\ufffd", r.stdout)

    def test_large_output(self):
        r = self.sb.exec("head -c 3000000 /dev/zero | tr '\\000' a")
        self.assertEqual(len(r.stdout), 3000000)
        self.assertFalse(r.truncated)


class StreamTest(SandboxCase):
    def test_callback_gets_output_before_the_command_exits(self):
        # The command prints "ready" and then blocks on a fifo that only the
        # callback opens, so it can only finish if "ready" reached the callback
        # while it was still running.
        fifo = "/tmp/gate-" + tag()
        self.sb.exec(["mkfifo", fifo])
        seen: List[str] = []
        opened: List[bool] = []

        def on_stdout(chunk: str) -> None:
            seen.append(chunk)
            if "ready" in "".join(seen) and not opened:
                opened.append(True)
                self.sb.exec("echo go > %s" % fifo, timeout_seconds=20)

        r = self.sb.exec("echo ready; read x < %s; echo got $x" % fifo, timeout_seconds=30, on_stdout=on_stdout)
        self.assertFalse(r.timed_out, "the command waited for the gate: its output was not streamed before it exited")
        self.assertEqual((r.stdout, r.exit_code), ("ready\ngot go\n", 0))
        self.assertEqual(opened, [True])
        self.assertEqual("".join(seen), r.stdout)

    def test_chunks_arrive_as_produced(self):
        # "one", then the command waits (a minute at most) for a file that
        # the callback makes, through a second connection, once "one" has
        # arrived: only a streamed "one" lets the command print "two".
        flag = "/tmp/chunks-go-on-%d" % os.getpid()
        second = Client(api_key=SERVER.admin_key, api_url=SERVER.url, timeout=120)
        self.addCleanup(second.close)
        other = Sandbox.connect(self.sb.id, client=second)

        def arrived(s: str) -> None:
            if "one" in s:
                other.exec("touch " + flag)

        r = self.sb.exec("echo one; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
                         "[ -e %s ] && echo two" % (flag, flag), on_stdout=arrived)
        self.assertEqual(r.stdout, "one\ntwo\n", "one arrived only with the exit: not streamed")

    def test_stdout_and_stderr_callbacks(self):
        out: List[str] = []
        err: List[str] = []
        r = self.sb.exec("echo e1 >&2; echo o1; echo e2 >&2; exit 4", on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(("".join(out), "".join(err)), ("o1\n", "e1\ne2\n"))
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("o1\n", "e1\ne2\n", 4))

    def test_stream_timeout_and_argv(self):
        r = self.sb.exec(["sleep", "30"], timeout_seconds=1, on_stdout=lambda s: None)
        self.assertTrue(r.timed_out)
        r = self.sb.exec(["echo", "x y"], on_stderr=lambda s: None)
        self.assertEqual(r.stdout, "x y\n")


class FilesystemTest(SandboxCase):
    def setUp(self) -> None:
        self.fs = self.sb.filesystem
        self.dir = "/work/t-" + tag()

    def guest_sha256(self, path: str) -> str:
        r = self.sb.exec(["sha256sum", path], timeout_seconds=120)
        self.assertEqual(r.exit_code, 0, r.stderr)
        return r.stdout.split()[0]

    def test_text_round_trip(self):
        p = self.dir + "/hello.txt"
        fi = self.fs.write(p, "héllo\nwörld 🐼\n")
        self.assertEqual((fi.path, fi.name, fi.size, fi.is_dir), (p, "hello.txt", len("héllo\nwörld 🐼\n".encode()), False))
        self.assertEqual(self.fs.read_text(p), "héllo\nwörld 🐼\n")
        self.assertEqual(self.sb.exec(["cat", p]).stdout, "héllo\nwörld 🐼\n")
        self.fs.write(p, "replaced")
        self.assertEqual(self.fs.read(p), b"replaced")

    def test_binary_round_trip(self):
        data = bytes(range(256)) * 4096 + b"\x00\r\n\xff"
        p = self.dir + "/bin.dat"
        self.assertEqual(self.fs.write(p, data).size, len(data))
        self.assertEqual(self.fs.read(p), data)
        self.assertEqual(self.guest_sha256(p), hashlib.sha256(data).hexdigest())
        buf = io.BytesIO()
        self.assertEqual(self.fs.download(p, buf), len(data))
        self.assertEqual(buf.getvalue(), data)

    def test_20mib_streamed_file(self):
        size = 20 * MiB
        h = hashlib.sha256()
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src.bin")
            with open(src, "wb") as f:
                for _ in range(size // MiB):
                    chunk = os.urandom(MiB)
                    h.update(chunk)
                    f.write(chunk)
            want = h.hexdigest()
            p = self.dir + "/big.bin"
            with open(src, "rb") as f:
                fi = self.fs.write(p, f)
            self.assertEqual(fi.size, size)
            self.assertEqual(self.guest_sha256(p), want)
            dst = os.path.join(d, "dst.bin")
            self.assertEqual(self.fs.download(p, dst), size)
            with open(dst, "rb") as f:
                got = hashlib.sha256()
                for chunk in iter(lambda: f.read(MiB), b""):
                    got.update(chunk)
            self.assertEqual(got.hexdigest(), want)

    def test_20mib_unsized_stream_is_chunked(self):
        class Pseudo(io.RawIOBase):
            """20 MiB of deterministic bytes, not seekable, no fileno: sent chunked."""

            def __init__(self) -> None:
                self.left = 20 * MiB
                self.h = hashlib.sha256()
                self.block = hashlib.sha512(b"seed").digest() * (MiB // 64)

            def readable(self) -> bool:
                return True

            def readinto(self, b) -> int:
                n = min(len(b), self.left, len(self.block))
                b[:n] = self.block[:n]
                self.h.update(self.block[:n])
                self.left -= n
                return n

        src = Pseudo()
        p = self.dir + "/chunked.bin"
        self.assertEqual(self.fs.write(p, io.BufferedReader(src)).size, 20 * MiB)
        self.assertEqual(self.guest_sha256(p), src.h.hexdigest())

    def test_mode(self):
        p = self.dir + "/run.sh"
        fi = self.fs.write(p, "#!/bin/sh\necho ran\n", mode=0o755)
        self.assertEqual(fi.mode, 0o755)
        self.assertEqual(self.sb.exec([p]).stdout, "ran\n")
        self.assertEqual(self.fs.write(p, "x", mode="600").mode, 0o600)
        self.assertEqual(self.fs.write(self.dir + "/default", "x").mode, 0o644)

    def test_list_stat_exists_mkdir_remove_rename(self):
        d = self.dir + "/d"
        self.assertFalse(self.fs.exists(d))
        fi = self.fs.mkdir(d + "/e/f")
        self.assertTrue(fi.is_dir)
        self.fs.mkdir(d + "/e/f")  # like mkdir -p: an existing directory is fine
        self.assertTrue(self.fs.exists(d + "/e/f"))
        self.fs.write(d + "/a.txt", "a")
        self.fs.write(d + "/b.txt", "bb")
        entries = self.fs.list(d)
        self.assertEqual([e.name for e in entries], ["a.txt", "b.txt", "e"])
        self.assertEqual([e.is_dir for e in entries], [False, False, True])
        self.assertEqual(entries[1].size, 2)
        self.assertEqual(entries[1].path, d + "/b.txt")
        st = self.fs.stat(d + "/b.txt")
        self.assertEqual((st.size, st.is_dir, st.is_symlink), (2, False, False))
        self.assertIsNotNone(st.modified_at)
        moved = self.fs.rename(d + "/a.txt", d + "/e/c.txt")
        self.assertEqual(moved.path, d + "/e/c.txt")
        self.assertFalse(self.fs.exists(d + "/a.txt"))
        self.assertEqual(self.fs.read_text(d + "/e/c.txt"), "a")
        self.fs.remove(d + "/b.txt")
        self.assertFalse(self.fs.exists(d + "/b.txt"))
        with self.assertRaises(pandastack.ConflictError):
            self.fs.remove(d)  # not empty
        self.fs.remove(d, recursive=True)
        self.assertFalse(self.fs.exists(d))

    def test_parents_are_created_and_odd_names_survive(self):
        p = self.dir + "/deep/er/ü n&i=x+y#z?.txt"
        self.fs.write(p, "odd")
        self.assertEqual(self.fs.read_text(p), "odd")
        self.assertEqual([e.name for e in self.fs.list(self.dir + "/deep/er")], ["ü n&i=x+y#z?.txt"])

    def test_symlink(self):
        target = self.dir + "/target"
        self.fs.write(target, "t")
        self.sb.exec(["ln", "-s", target, self.dir + "/link"])
        st = self.fs.stat(self.dir + "/link")
        self.assertTrue(st.is_symlink)
        self.assertEqual(st.link_target, target)

    def test_missing_file_and_relative_path(self):
        with self.assertRaises(pandastack.NotFoundError):
            self.fs.read(self.dir + "/nope")
        with self.assertRaises(pandastack.NotFoundError):
            self.fs.stat(self.dir + "/nope")
        with self.assertRaises(pandastack.NotFoundError):
            self.fs.download(self.dir + "/nope", io.BytesIO())
        for call in (
            lambda: self.fs.write("relative/x.txt", "x"),
            lambda: self.fs.read("relative/x.txt"),
            lambda: self.fs.list("work"),
            lambda: self.fs.mkdir("a/b"),
        ):
            with self.assertRaises(pandastack.InvalidArgumentError):
                call()


class WatchDirTest(SandboxCase):
    def test_events_in_order(self):
        self.sb.exec("mkdir -p /tmp/pw")
        w = self.sb.filesystem.watch_dir("/tmp/pw")
        self.addCleanup(w.stop)
        self.sb.exec("echo a > /tmp/pw/f && echo b >> /tmp/pw/f && mv /tmp/pw/f /tmp/pw/g && rm /tmp/pw/g")
        want = [
            pandastack.WatchEvent("create", "/tmp/pw/f"),
            pandastack.WatchEvent("write", "/tmp/pw/f"),
            pandastack.WatchEvent("rename", "/tmp/pw/g", "/tmp/pw/f"),
            pandastack.WatchEvent("remove", "/tmp/pw/g"),
        ]
        got: list = []
        for ev in w:
            if got and got[-1] == ev:
                continue  # writes may come as one event or several
            got.append(ev)
            if len(got) == len(want):
                break
        self.assertEqual(got, want)
        # stop() from another thread ends a blocked iteration.
        import threading
        t = threading.Timer(0.2, w.stop)
        t.start()
        self.assertEqual(list(w), [])
        t.join()

    def test_missing_directory(self):
        with self.assertRaises(pandastack.NotFoundError):
            self.sb.filesystem.watch_dir("/no/such/dir")


class PortsTest(unittest.TestCase):
    def test_ports_and_signed_url(self):
        sb = create()
        self.addCleanup(sb.kill)
        r = sb.exec("mkdir -p /tmp/www && echo hello from the sandbox > /tmp/www/index.html && httpd -p 8000 -h /tmp/www")
        self.assertEqual(r.exit_code, 0, r.stderr)
        deadline = time.monotonic() + 30
        while True:
            ports = sb.ports()
            if any(p.port == 8000 for p in ports) or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # polling a condition, bounded by the deadline
        self.assertTrue(any(p.port == 8000 and p.address in ("0.0.0.0", "::") for p in ports), ports)

        before = datetime.now(timezone.utc)
        url = sb.get_url(8000, ttl_seconds=90)
        self.assertTrue(url.startswith(SERVER.url + "/p/"), url)
        self.assertIsNotNone(url.expires_at)
        self.assertGreaterEqual(url.expires_at, before + timedelta(seconds=89))
        self.assertLessEqual(url.expires_at, datetime.now(timezone.utc) + timedelta(seconds=92))
        # No key: the sandbox's own page (the test server runs with
        # --network off: the guest agent carries the connection).
        try:
            with urllib.request.urlopen(url, timeout=60) as res:
                status, body = res.status, res.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        self.assertEqual((status, body), (200, b"hello from the sandbox\n"))

        sb.kill()
        with self.assertRaises(pandastack.ConflictError):
            sb.get_url(8000)
        with self.assertRaises(pandastack.ConflictError):
            sb.ports()


class NetworkTest(unittest.TestCase):
    def test_policy_create_read_change(self):
        with self.assertRaises(pandastack.BadRequestError) as cm:
            create(network={"internet": False, "allow_out": ["pypi.org", "bad entry!"]})
        self.assertIn('"bad entry!"', cm.exception.message)

        sb = create(network={"internet": False, "allow_out": ["pypi.org", "10.1.0.0/16"]})
        self.addCleanup(sb.kill)
        want = pandastack.NetworkPolicy(internet=False, allow_out=["pypi.org", "10.1.0.0/16"], deny_out=[])
        self.assertEqual(sb.network, want)
        self.assertEqual(Sandbox.connect(sb.id, client=ADMIN).network, want)

        # The arguments given replace their part, the others stay.
        got = sb.set_network(internet=True, deny_out=["*.example.com"])
        want = pandastack.NetworkPolicy(internet=True, allow_out=["pypi.org", "10.1.0.0/16"], deny_out=["*.example.com"])
        self.assertEqual(got, want)
        self.assertEqual(sb.refresh().network, want)

        with self.assertRaises(pandastack.BadRequestError) as cm:
            sb.set_network(deny_out=["300.1.2.3/8"])
        self.assertIn('deny_out entry "300.1.2.3/8"', cm.exception.message)
        self.assertEqual(sb.refresh().network, want, "a refused change left the policy as it was")


class LifecycleTest(unittest.TestCase):
    def test_set_ttl(self):
        sb = create(ttl_seconds=600)
        self.addCleanup(sb.kill)
        before = datetime.now(timezone.utc)
        info = sb.set_ttl(120)
        after = datetime.now(timezone.utc)
        self.assertIs(info, sb.info)
        # 120 s from when the server took the call (a second either side
        # for rounding), however long the call took.
        self.assertGreaterEqual(info.expires_at, before + timedelta(seconds=119))
        self.assertLessEqual(info.expires_at, after + timedelta(seconds=121))
        self.assertEqual(sb.refresh().expires_at, info.expires_at)
        with self.assertRaises(pandastack.InvalidArgumentError):
            sb.set_ttl(10**9)

    def test_on_expire_pause(self):
        # A long TTL until the file is written, then 1 s: the sandbox pauses
        # instead of stopping, and resumes with its file.
        sb = create(ttl_seconds=600, on_expire="pause")
        self.addCleanup(sb.kill)
        self.assertEqual(sb.info.on_expire, "pause")
        sb.exec("echo kept > /root/k")
        sb.set_ttl(1)
        deadline = time.monotonic() + 60
        while sb.refresh().state != "paused" and time.monotonic() < deadline:
            time.sleep(0.1)  # polling a condition, bounded by the deadline
        self.assertEqual(sb.info.state, "paused")
        sb.resume()
        sb.set_ttl(120)  # the resumed sandbox has its 1 s TTL again
        self.assertEqual(sb.exec("cat /root/k").stdout, "kept\n")

    def test_context_manager_kills(self):
        with create() as sb:
            sid = sb.id
            self.assertEqual(sb.exec("echo in").stdout, "in\n")
        try:
            state = Sandbox.connect(sid, client=ADMIN).info.state
        except pandastack.NotFoundError:
            state = "gone"
        self.assertIn(state, ("stopped", "gone"))
        self.assertNotIn(sid, [s.id for s in Sandbox.list(client=ADMIN)])

    def test_context_manager_kills_on_error(self):
        with self.assertRaises(ZeroDivisionError):
            with create() as sb:
                1 / 0
        with self.assertRaises(pandastack.ConflictError):
            sb.exec("true")

    def test_kill_is_idempotent(self):
        sb = create()
        sb.kill()
        sb.kill()
        info = sb.refresh()
        self.assertEqual(info.state, "stopped")
        self.assertEqual(info.stop_reason, "killed")
        with self.assertRaises(pandastack.ConflictError):
            sb.exec("true")
        # A streamed upload the server rejects before reading it still gives
        # the server's error, not a broken pipe.
        with self.assertRaises(pandastack.ConflictError):
            sb.filesystem.write("/work/x", io.BytesIO(bytes(20 * MiB)))
        ghost = Sandbox(pandastack.SandboxInfo.from_dict(dict(sb.info.raw, id="nosuchsandbox0")), ADMIN)
        with self.assertRaises(pandastack.NotFoundError):
            ghost.filesystem.write("/work/x", io.BytesIO(bytes(20 * MiB)))

    def test_list_with_metadata_filter(self):
        t = tag()
        a = create(metadata={"suite": t, "n": "1"})
        self.addCleanup(a.kill)
        b = create(metadata={"suite": t, "n": "2"})
        self.addCleanup(b.kill)
        ids = lambda **kw: [s.id for s in Sandbox.list(client=ADMIN, **kw)]  # noqa: E731
        self.assertEqual(ids(metadata={"suite": t}), [a.id, b.id])
        self.assertEqual(ids(metadata={"suite": t, "n": "2"}), [b.id])
        self.assertEqual(ids(state="running", metadata={"suite": t}), [a.id, b.id])
        self.assertEqual(ids(metadata={"suite": t, "n": "3"}), [])
        got = Sandbox.list(metadata={"suite": t, "n": "1"}, client=ADMIN)[0]
        self.assertEqual(got.info.metadata, {"suite": t, "n": "1"})
        b.kill()
        self.assertEqual(ids(metadata={"suite": t}), [a.id])
        self.assertEqual(ids(state="stopped", metadata={"suite": t}), [b.id])


class ErrorsTest(unittest.TestCase):
    def test_unknown_sandbox(self):
        with self.assertRaises(pandastack.NotFoundError) as cm:
            Sandbox.connect("doesnotexist000", client=ADMIN)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    def test_bad_key(self):
        bad = Client(api_key="not-a-key", api_url=SERVER.url)
        self.addCleanup(bad.close)
        with self.assertRaises(pandastack.AuthenticationError) as cm:
            Sandbox.list(client=bad)
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))

    def test_missing_key(self):
        with mock.patch.dict(os.environ, {"PANDASTACK_API_KEY": ""}):
            with self.assertRaises(pandastack.ConfigurationError) as cm:
                Sandbox.list(api_url=SERVER.url)
        self.assertIn("PANDASTACK_API_KEY", str(cm.exception))

    def test_server_not_running(self):
        url = "http://127.0.0.1:%d" % free_port()
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            Sandbox.list(api_key="k", api_url=url)
        self.assertIn("panda up", str(cm.exception))

    def test_invalid_create(self):
        with self.assertRaises(pandastack.InvalidArgumentError):
            create(ttl_seconds=10**9)
        with self.assertRaises(pandastack.NotFoundError):
            create(template="nosuchtemplate")

    def test_admin_only(self):
        key = ADMIN.create_key("sdk-test-user-" + tag())
        self.addCleanup(ADMIN.revoke_key, key.id)
        user = Client(api_key=key.key, api_url=SERVER.url)
        self.addCleanup(user.close)
        with self.assertRaises(pandastack.ForbiddenError):
            user.create_key("nope")
        with self.assertRaises(pandastack.ForbiddenError):
            user.list_keys()
        with self.assertRaises(pandastack.ForbiddenError):
            user.bake_template("tiny", memory_mib=256)


class KeyIsolationTest(unittest.TestCase):
    def test_second_key_does_not_see_first_keys_sandbox(self):
        key = ADMIN.create_key("sdk-test-other-" + tag())
        self.assertTrue(key.key)
        self.assertFalse(key.admin)
        other = Client(api_key=key.key, api_url=SERVER.url)
        self.addCleanup(other.close)
        revoked = []

        def revoke():
            if not revoked:
                ADMIN.revoke_key(key.id)

        self.addCleanup(revoke)
        mine = create(metadata={"iso": tag()})
        self.addCleanup(mine.kill)

        with self.assertRaises(pandastack.NotFoundError):
            Sandbox.connect(mine.id, client=other)
        self.assertNotIn(mine.id, [s.id for s in Sandbox.list(client=other)])
        self.assertEqual(Sandbox.list(metadata=mine.info.metadata, client=other), [])
        as_other = Sandbox(mine.info, other)
        with self.assertRaises(pandastack.NotFoundError):
            as_other.exec("true")
        with self.assertRaises(pandastack.NotFoundError):
            as_other.filesystem.read("/etc/passwd")
        as_other.kill()  # a 404, swallowed: and it must not have killed anything
        self.assertEqual(mine.refresh().state, "running")

        theirs = create(client=other)  # killed when the key is revoked
        self.assertEqual([s.id for s in Sandbox.list(client=other)], [theirs.id])
        self.assertEqual(theirs.exec("echo mine").stdout, "mine\n")

        ADMIN.revoke_key(key.id)
        revoked.append(True)
        with self.assertRaises(pandastack.AuthenticationError):
            Sandbox.list(client=other)


if __name__ == "__main__":
    unittest.main()


class EventsTest(unittest.TestCase):
    def test_events_command_history_and_revoke(self):
        k = ADMIN.create_key("events-" + tag())
        c = Client(api_key=k.key, api_url=SERVER.url, timeout=120)
        self.addCleanup(c.close)
        with c.events() as stream:
            sb = create(c)
            got = [next(stream), next(stream)]
            self.assertEqual([(e.type, e.id, e.sandbox.state) for e in got], [("sandbox", sb.id, "starting"), ("sandbox", sb.id, "running")])
            self.assertGreater(got[0].seq, stream.seq)
            self.assertIsNone(got[1].sandbox.memory)

            sb.exec("echo hi")
            sb.exec(["false"])
            h = sb.commands.run("exit 3", background=True)
            h.wait()
            cmds = sb.commands()
            self.assertEqual([(x.kind, x.command, x.exit_code) for x in cmds], [("exec", "echo hi", 0), ("exec", "false", 1), ("process", "exit 3", 3)])
            self.assertEqual(cmds[2].pid, h.pid)
            self.assertEqual(sb.commands.history(), cmds)

            ADMIN.revoke_key(k.id)  # the stream ends
            rest = list(stream)
            self.assertEqual([e for e in rest if e.id != sb.id], [], "events of others after the revoke")
