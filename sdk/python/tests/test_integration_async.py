"""Integration tests of the asyncio SDK against a real `panda up` (see _server.py).

They mirror test_integration.py's main flows with AsyncSandbox/AsyncClient:
create, exec, streaming exec, files, fork, pause/resume, snapshot, kill,
list, errors, cancellation, and ten creates at once with asyncio.gather.
Sandboxes use the `tiny` template with 256 MiB.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tempfile
import time
import unittest
from typing import Optional

from _server import PandaServer, create_tiny, free_port, start_module_server, tag
import pandastack
from pandastack import AsyncClient, AsyncCommandHandle, AsyncSandbox, AsyncSnapshot, AsyncTerminalHandle, Client, NotFoundError, Sandbox, WatchEvent

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None

MiB = 1 << 20


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


def create(client: AsyncClient, **kw):
    kw.setdefault("template", "tiny")
    kw.setdefault("memory_mib", 256)
    kw.setdefault("ttl_seconds", 600)
    return AsyncSandbox.create(client=client, **kw)


class AsyncCase(unittest.IsolatedAsyncioTestCase):
    """An admin AsyncClient per test; a class may share one sandbox (created with the sync SDK, attached with connect)."""

    shared: Optional[Sandbox] = None
    share_sandbox = False

    @classmethod
    def setUpClass(cls) -> None:
        if cls.share_sandbox:
            cls.shared = create_tiny(ADMIN)
            cls.addClassCleanup(cls.shared.kill)

    async def asyncSetUp(self) -> None:
        self.client = AsyncClient(api_key=SERVER.admin_key, api_url=SERVER.url, timeout=120)
        if self.shared is not None:
            self.sb = await AsyncSandbox.connect(self.shared.id, client=self.client)

    async def asyncTearDown(self) -> None:
        await self.client.close()


class ServerTest(AsyncCase):
    async def test_health_templates_keys(self):
        self.assertEqual((await self.client.health())["status"], "ok")
        self.assertIn("tiny", [t.name for t in await self.client.list_templates()])
        k = await self.client.create_key("async-" + tag(), max_sandboxes=1)
        self.assertTrue(k.key)
        self.assertIn(k.id, [x.id for x in await self.client.list_keys()])
        await self.client.revoke_key(k.id)


class ExecTest(AsyncCase):
    share_sandbox = True

    async def test_stdout_stderr_exit_code(self):
        r = await self.sb.exec("echo hi && echo oops >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hi\n", "oops\n", 3))

    async def test_argv_env_cwd_stdin(self):
        r = await self.sb.exec(["sh", "-c", 'echo "$A $(pwd)"; cat'], env={"A": "x y"}, cwd="/tmp", stdin="in")
        self.assertEqual(r.stdout, "x y /tmp\nin")

    async def test_missing_executable(self):
        with self.assertRaises(pandastack.NotFoundError):
            await self.sb.exec(["/nope/missing"])

    async def test_timeout(self):
        r = await self.sb.exec("sleep 30", timeout_seconds=1)
        self.assertTrue(r.timed_out)

    async def test_concurrent_execs_on_one_sandbox(self):
        rs = await asyncio.gather(*[self.sb.exec("echo %d" % i) for i in range(20)])
        self.assertEqual([r.stdout for r in rs], ["%d\n" % i for i in range(20)])


class StreamTest(AsyncCase):
    share_sandbox = True

    async def test_output_arrives_before_the_command_exits(self):
        # The command prints its first line, then waits (a minute at most)
        # for a file that the test makes only once that line has arrived:
        # a stream that held the line until the exit never sees "second".
        flag = "/tmp/stream-go-on-%d" % os.getpid()
        s = self.sb.exec_stream("echo first; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
                                "[ -e %s ] && echo second >&2" % (flag, flag))
        got = []
        async for kind, text in s:
            got.append((kind, text))
            if text == "first\n":
                await self.sb.exec("touch " + flag)
        self.assertEqual(got, [("stdout", "first\n"), ("stderr", "second\n")], "the first line arrived only with the exit")
        self.assertEqual((s.result.exit_code, s.result.stdout, s.result.stderr), (0, "first\n", "second\n"))

    async def test_async_callbacks(self):
        out = []

        async def on_out(t):
            out.append(t)

        r = await self.sb.exec("for i in 1 2 3; do echo $i; done", on_stdout=on_out)
        self.assertEqual("".join(out), "1\n2\n3\n")
        self.assertEqual(r.stdout, "1\n2\n3\n")

    async def test_breaking_out_kills_the_command(self):
        marker = "/tmp/async-survived-" + tag()
        # The command's first line is its shell's PID.
        async with self.sb.exec_stream("echo $$; sleep 2; touch %s" % marker) as s:
            async for kind, text in s:
                pid = int(text)
                break
        self.assertIsNone(s.result)
        await self.until_gone(pid)
        self.assertFalse(await self.sb.filesystem.exists(marker), "the command ran on after the stream was closed")

    async def test_cancelling_exec_kills_the_command(self):
        t = tag()
        pidfile, marker = "/tmp/async-pid-" + t, "/tmp/async-cancelled-" + t
        task = asyncio.ensure_future(self.sb.exec("echo $$ > %s.new && mv %s.new %s; sleep 2; touch %s" % (pidfile, pidfile, pidfile, marker)))
        await self.until(lambda: self.sb.filesystem.exists(pidfile), "the command to start")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await self.until_gone(int(await self.sb.filesystem.read_text(pidfile)))
        self.assertFalse(await self.sb.filesystem.exists(marker), "the command ran on after its exec was cancelled")

    async def until(self, cond, what: str, timeout: float = 30) -> None:
        """Poll the coroutine function cond until it returns true; fail after timeout."""
        deadline = time.monotonic() + timeout
        while not await cond():
            if time.monotonic() > deadline:
                self.fail("%s: not within %d s" % (what, timeout))
            await asyncio.sleep(0.05)  # polling a condition, bounded by the deadline

    async def until_gone(self, pid: int) -> None:
        """Wait until process pid of the sandbox has ended (killed, or done on its own)."""
        async def gone() -> bool:
            return (await self.sb.exec("test -d /proc/%d" % pid)).exit_code != 0
        await self.until(gone, "process %d to end" % pid)



async def read_until(h: AsyncCommandHandle, want: str, timeout: float = 60, from_="start") -> str:
    """Follow h's output until it contains want (or fail after timeout); return what was read."""
    got = []

    async def follow() -> bool:
        async with h.output(from_=from_) as stream:
            async for c in stream:
                got.append(c.data)
                if want in "".join(got):
                    return True
        return False

    try:
        if await asyncio.wait_for(follow(), timeout):
            return "".join(got)
    except asyncio.TimeoutError:
        pass
    raise AssertionError("output never had %r; got %r" % (want, "".join(got)))


class ProcessesTest(AsyncCase):
    """sb.commands and sb.pty (mirrors test_integration_processes.py)."""

    share_sandbox = True

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.to_remove = []

    async def asyncTearDown(self) -> None:
        # Before the client closes (cleanups would run after asyncTearDown, on a closed client).
        for h in self.to_remove:
            await h.remove()
        await super().asyncTearDown()

    async def test_background_stdin_output_wait(self):
        h = await self.sb.commands.run("echo start; read l; echo got $l", background=True, stdin=True)
        self.assertIsInstance(h, AsyncCommandHandle)
        self.assertIsInstance(h.pid, int)
        self.assertIn("start", await read_until(h, "start"))
        await h.send_stdin("hello\n")
        self.assertIn("got hello", await read_until(h, "got hello"))
        r = await h.wait(timeout=60)
        self.assertEqual((r.exit_code, r.stdout, r.signal), (0, "start\ngot hello\n", None))
        info = await h.info()
        self.assertEqual((info.state, info.exit_code, info.stdin_open), ("exited", 0, False))
        with self.assertRaises(pandastack.ConflictError):
            await h.send_stdin("late\n")

    async def test_close_stdin_and_stderr_with_callbacks(self):
        h = await self.sb.commands.run("cat; echo err >&2; exit 4", background=True, stdin=True, env={"X": "1"}, cwd="/tmp")
        await h.send_stdin(b"abc")
        await h.close_stdin()
        errs = []

        async def on_err(text):
            errs.append(text)

        r = await h.wait(timeout=60, on_stderr=on_err)
        self.assertEqual((r.exit_code, r.stdout, r.stderr, "".join(errs)), (4, "abc", "err\n", "err\n"))

    async def test_kill_shows_signal(self):
        h = await self.sb.commands.run("sleep 1000", background=True)
        self.assertTrue(await h.kill())
        r = await h.wait(timeout=60)
        self.assertEqual((r.signal, r.exit_code), ("SIGKILL", 137))
        self.assertFalse(await h.kill())  # already exited
        await h.remove()
        with self.assertRaises(NotFoundError):
            await h.info()

    async def test_signal_term_and_wait_timeout(self):
        h = await self.sb.commands.run(["sleep", "1000"], background=True)
        with self.assertRaises(pandastack.RequestTimeoutError):
            await h.wait(timeout=0.5)
        self.assertTrue((await h.info()).running)  # waiting gave up; the process runs on
        await h.signal("TERM")
        self.assertEqual((await h.wait(timeout=60)).signal, "SIGTERM")

    async def test_list_and_connect_from_second_handle(self):
        h = await self.sb.commands.run("echo hi-there; sleep 1000", background=True)
        self.to_remove.append(h)
        self.assertIn(h.pid, [p.pid for p in await self.sb.commands.list()])
        other = await AsyncSandbox.connect(self.sb.id, client=self.client)
        h2 = await other.commands.connect(h.pid)
        self.assertEqual((h2.pid, (await h2.info()).state), (h.pid, "running"))
        self.assertIn("hi-there", await read_until(h2, "hi-there"))
        self.assertTrue(await other.commands.kill(h.pid))
        self.assertEqual((await h.wait(timeout=60)).signal, "SIGKILL")
        with self.assertRaises(NotFoundError):
            await self.sb.commands.connect(999999)

    async def test_foreground_run_is_exec(self):
        r = await self.sb.commands.run("echo fg; exit 2")
        self.assertEqual((r.exit_code, r.stdout), (2, "fg\n"))

    async def test_pty(self):
        term = await self.sb.pty.create(rows=24, cols=80)
        self.assertIsInstance(term, AsyncTerminalHandle)
        self.to_remove.append(term)
        await term.send_input("echo h''i\r")  # the echo of the input is h''i: only the output has "hi"
        await read_until(term, "hi")
        await term.resize(50, 132)
        self.assertEqual((await term.info()).pty, {"rows": 50, "cols": 132})
        await term.send_input("stty size\r")
        await read_until(term, "50 132")
        await term.send_input("exit 3\r")
        self.assertEqual((await term.wait(timeout=60)).exit_code, 3)
        self.assertIsInstance(await self.sb.commands.connect(term.pid), AsyncTerminalHandle)


class FilesystemTest(AsyncCase):
    share_sandbox = True

    async def test_round_trips_and_operations(self):
        fs = self.sb.filesystem
        d = "/tmp/async-" + tag()
        await fs.write(d + "/a b/hello.txt", "héllo\n", mode=0o600)
        self.assertEqual(await fs.read_text(d + "/a b/hello.txt"), "héllo\n")
        st = await fs.stat(d + "/a b/hello.txt")
        self.assertEqual((st.size, st.mode & 0o777), (len("héllo\n".encode()), 0o600))
        await fs.mkdir(d + "/sub")
        self.assertEqual([e.name for e in await fs.list(d)], ["a b", "sub"])
        await fs.rename(d + "/a b/hello.txt", d + "/sub/h.txt")
        self.assertFalse(await fs.exists(d + "/a b/hello.txt"))
        self.assertTrue(await fs.exists(d + "/sub/h.txt"))
        await fs.remove(d, recursive=True)
        self.assertFalse(await fs.exists(d))
        with self.assertRaises(pandastack.NotFoundError):
            await fs.read(d + "/nope")

    async def test_8mib_streamed_upload_and_download(self):
        data = os.urandom(8 * MiB)
        p = "/tmp/async-big-" + tag()
        fi = await self.sb.filesystem.write(p, io.BytesIO(data))
        self.assertEqual(fi.size, len(data))
        r = await self.sb.exec("sha256sum %s" % p)
        self.assertEqual(r.stdout.split()[0], hashlib.sha256(data).hexdigest())
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            self.assertEqual(await self.sb.filesystem.download(p, out), len(data))
            with open(out, "rb") as f:
                self.assertEqual(f.read(), data)
        await self.sb.filesystem.remove(p)


class WatchDirTest(AsyncCase):
    share_sandbox = True

    async def test_events_in_order(self):
        d = "/tmp/aw-" + tag()
        await self.sb.exec("mkdir -p " + d)
        async with await self.sb.filesystem.watch_dir(d) as w:
            await self.sb.exec("echo a > {0}/f && echo b >> {0}/f && mv {0}/f {0}/g && rm {0}/g".format(d))
            want = [
                WatchEvent("create", d + "/f"),
                WatchEvent("write", d + "/f"),
                WatchEvent("rename", d + "/g", d + "/f"),
                WatchEvent("remove", d + "/g"),
            ]
            got: list = []
            async for ev in w:
                if got and got[-1] == ev:
                    continue  # writes may come as one event or several
                got.append(ev)
                if len(got) == len(want):
                    break
            self.assertEqual(got, want)
        with self.assertRaises(NotFoundError):
            await self.sb.filesystem.watch_dir("/no/such/dir")


class LifecycleTest(AsyncCase):
    async def test_create_exec_pause_resume_fork_snapshot_kill(self):
        label = {"async-test": tag()}
        async with create(self.client, metadata=label) as sb:
            self.assertEqual(sb.state, "running")
            await sb.exec("echo kept > /root/state")
            self.assertEqual((await sb.pause()).state, "paused")
            with self.assertRaises(pandastack.ConflictError):
                await sb.exec("true")
            self.assertEqual((await sb.resume()).state, "running")
            self.assertEqual((await sb.exec("cat /root/state")).stdout, "kept\n")

            children = await sb.fork(2)
            try:
                self.assertEqual(len(children), 2)
                outs = await asyncio.gather(*[c.exec("cat /root/state") for c in children])
                self.assertEqual([r.stdout for r in outs], ["kept\n", "kept\n"])
            finally:
                await asyncio.gather(*[c.kill() for c in children])

            snap = await sb.snapshot(name="async-" + tag())
            self.assertIsInstance(snap, AsyncSnapshot)
            try:
                async with create(self.client, template=None, memory_mib=None, snapshot=snap) as again:
                    self.assertEqual((await again.exec("cat /root/state")).stdout, "kept\n")
            finally:
                await snap.delete()

            listed = await AsyncSandbox.list(metadata=label, client=self.client)
            self.assertEqual([s.id for s in listed], [sb.id])
        self.assertEqual((await sb.refresh()).state, "stopped")
        await sb.kill()  # idempotent
        self.assertEqual(await AsyncSandbox.list(metadata=label, client=self.client), [])

    async def test_ten_creates_at_once(self):
        label = {"async-gather": tag()}
        t0 = time.monotonic()
        sbs = await asyncio.gather(*[create(self.client, metadata=label) for _ in range(10)])
        try:
            self.assertEqual(len({sb.id for sb in sbs}), 10)
            rs = await asyncio.gather(*[sb.exec("cat /proc/sys/kernel/random/uuid") for sb in sbs])
            self.assertEqual(len({r.stdout for r in rs}), 10)
            listed = await AsyncSandbox.list(metadata=label, client=self.client)
            self.assertEqual({s.id for s in listed}, {sb.id for sb in sbs})
        finally:
            await asyncio.gather(*[sb.kill() for sb in sbs])
        print("\n10 concurrent creates, exec and kill: %.1fs" % (time.monotonic() - t0))

    async def test_cancelled_create_leaves_nothing_unfindable(self):
        label = {"async-cancel": tag()}
        task = asyncio.ensure_future(create(self.client, metadata=label))
        await asyncio.sleep(0.05)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        # The server abandons the create; if it had finished, the sandbox is
        # found by its label. Either way nothing stays running unseen.
        deadline = time.monotonic() + 30
        while True:
            found = await AsyncSandbox.list(metadata=label, client=self.client)
            if all(s.state in ("running", "stopped") for s in found) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        for s in found:
            self.assertIn(s.state, ("running", "stopped"))
            await s.kill()


class ErrorsTest(AsyncCase):
    async def test_unknown_sandbox_and_bad_key(self):
        with self.assertRaises(pandastack.NotFoundError):
            await AsyncSandbox.connect("nosuchsandbox", client=self.client)
        async with AsyncClient(api_key="pk_wrong", api_url=SERVER.url) as bad:
            with self.assertRaises(pandastack.AuthenticationError):
                await AsyncSandbox.list(client=bad)

    async def test_server_not_running(self):
        url = "http://127.0.0.1:%d" % free_port()
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            await AsyncSandbox.list(api_key="k", api_url=url)
        self.assertIn("panda up", str(cm.exception))

    async def test_invalid_create(self):
        with self.assertRaises(pandastack.NotFoundError):
            await create(self.client, template="no-such-template")


if __name__ == "__main__":
    unittest.main()


class EventsTest(AsyncCase):
    async def test_events_and_command_history(self):
        stream = await self.client.events()
        async with stream:
            sb = await create(self.client)
            try:
                got = [await stream.__anext__(), await stream.__anext__()]
                self.assertEqual([(e.type, e.id, e.sandbox.state) for e in got], [("sandbox", sb.id, "starting"), ("sandbox", sb.id, "running")])
                await sb.exec("echo hi")
                cmds = await sb.commands()
                self.assertEqual([(x.kind, x.command, x.exit_code) for x in cmds], [("exec", "echo hi", 0)])
                snap = await sb.snapshot()
                ev = await stream.__anext__()
                self.assertEqual((ev.type, ev.id), ("snapshot", snap.id))
                self.assertIsInstance(ev.snapshot, AsyncSnapshot)
                await snap.delete()
                ev = await stream.__anext__()
                self.assertEqual((ev.type, ev.id), ("snapshot_deleted", snap.id))
            finally:
                await sb.kill()
            kinds = [(await stream.__anext__()).type for _ in range(2)]
            self.assertEqual(kinds, ["sandbox", "sandbox_deleted"])
