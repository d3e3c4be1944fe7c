"""Integration tests of sb.commands (background processes) and sb.pty
(terminals) against a real `panda up`.

Same server fixture and environment variables as sdk/python/tests/_server.py.
"""

from __future__ import annotations

import os
import sys
import threading
import unittest
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _server import PandaServer, create_tiny, start_module_server  # noqa: E402
import pandastack  # noqa: E402
from pandastack import Client, CommandHandle, Sandbox, TerminalHandle  # noqa: E402

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


def read_until(h: CommandHandle, want: str, timeout: float = 60, from_="start") -> str:
    """Follow h's output until it contains want (or fail after timeout); return what was read."""
    got = []
    stream = h.output(from_=from_)
    timer = threading.Timer(timeout, stream.stop)
    timer.daemon = True
    timer.start()
    try:
        for c in stream:
            got.append(c.data)
            if want in "".join(got):
                return "".join(got)
    finally:
        timer.cancel()
        stream.stop()
    raise AssertionError("output never had %r; got %r" % (want, "".join(got)))


class ProcessesTest(unittest.TestCase):
    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = create_tiny(ADMIN)
        cls.addClassCleanup(cls.sb.kill)

    def test_background_stdin_output_wait(self):
        h = self.sb.commands.run("echo start; read l; echo got $l", background=True, stdin=True)
        self.assertIsInstance(h.pid, int)
        self.assertIn("start", read_until(h, "start"))
        h.send_stdin("hello\n")
        self.assertIn("got hello", read_until(h, "got hello"))
        r = h.wait(timeout=60)
        self.assertEqual((r.exit_code, r.stdout, r.signal), (0, "start\ngot hello\n", None))
        info = h.info()
        self.assertEqual((info.state, info.exit_code, info.stdin_open), ("exited", 0, False))
        with self.assertRaises(pandastack.ConflictError):
            h.send_stdin("late\n")

    def test_close_stdin_and_stderr(self):
        h = self.sb.commands.run("cat; echo err >&2; exit 4", background=True, stdin=True, env={"X": "1"}, cwd="/tmp")
        h.send_stdin(b"abc")
        h.close_stdin()
        r = h.wait(timeout=60)
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (4, "abc", "err\n"))

    def test_kill_shows_signal(self):
        h = self.sb.commands.run("sleep 1000", background=True)
        self.assertTrue(h.kill())
        r = h.wait(timeout=60)
        self.assertEqual((r.signal, r.exit_code), ("SIGKILL", 137))
        self.assertFalse(h.kill())  # already exited
        h.remove()
        with self.assertRaises(pandastack.NotFoundError):
            h.info()

    def test_signal_term(self):
        h = self.sb.commands.run(["sleep", "1000"], background=True)
        h.signal("TERM")
        self.assertEqual(h.wait(timeout=60).signal, "SIGTERM")

    def test_timeout_seconds(self):
        h = self.sb.commands.run("sleep 1000", background=True, timeout_seconds=1)
        self.assertTrue(h.wait(timeout=60).timed_out)

    def test_list_and_connect_from_second_handle(self):
        h = self.sb.commands.run("echo hi-there; sleep 1000", background=True)
        self.addCleanup(h.remove)
        self.assertIn(h.pid, [p.pid for p in self.sb.commands.list()])
        other = Sandbox.connect(self.sb.id, client=ADMIN)
        h2 = other.commands.connect(h.pid)
        self.assertEqual((h2.pid, h2.info().state), (h.pid, "running"))
        self.assertIn("hi-there", read_until(h2, "hi-there"))
        h2.kill()
        self.assertEqual(h.wait(timeout=60).signal, "SIGKILL")

    def test_unknown_pid(self):
        with self.assertRaises(pandastack.NotFoundError):
            self.sb.commands.connect(999999)

    def test_foreground_run_is_exec(self):
        r = self.sb.commands.run("echo fg; exit 2")
        self.assertEqual((r.exit_code, r.stdout), (2, "fg\n"))

    def test_pty(self):
        term = self.sb.pty.create(rows=24, cols=80)
        self.assertIsInstance(term, TerminalHandle)
        self.addCleanup(term.remove)
        term.send_input("echo h''i\r")  # the echo of the input is h''i: only the output has "hi"
        read_until(term, "hi")
        term.resize(50, 132)
        self.assertEqual(term.info().pty, {"rows": 50, "cols": 132})
        term.send_input("stty size\r")
        read_until(term, "50 132")
        term.send_input("exit 3\r")
        self.assertEqual(term.wait(timeout=60).exit_code, 3)


if __name__ == "__main__":
    unittest.main()
