"""Unit tests of the code server's logic, run by codeinterp's Go tests
(TestServerPython) with the host's python3: the cell runner over a
scripted backend (FIFO order, timeouts, interrupts, a client that leaves,
a machine that changed, a dying interpreter), the stream's output cap, the
result and error shapes, and the JavaScript and bash backends for real
(node and bash run on the host too). The Python backend needs ipykernel and
is tested in the guest (cmd/panda's TestCodeGuest). Not shipped to guests.
"""

import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server  # noqa: E402


class FakeBackend:
    """A scripted interpreter: each cell's events come from script(code),
    a list of event lists, one per poll; a cell "runs" until the list is
    exhausted, or forever for code "forever" until interrupted."""

    language = "python"

    def __init__(self, stubborn=False):
        self.alive_ = True
        self.interrupts = 0
        self.killed = False
        self.began = []
        self.polls = []
        self.stubborn = stubborn

    def alive(self):
        return self.alive_

    def begin(self, code, env):
        self.began.append((code, env))
        self.code = code
        if code == "forever":
            self.polls = None
        elif code == "die":
            self.polls = [[{"type": "stdout", "text": "dying\n"}]]
        elif code.startswith("exit "):
            self.polls = [[{"type": "_done", "execution_count": None, "status": int(code[5:])}]]
        else:
            self.polls = [[{"type": "stdout", "text": code + "\n"}], [{"type": "_done", "execution_count": len(self.began)}]]

    def poll(self, timeout):
        if self.polls is None:  # forever
            if self.interrupts and not self.stubborn:
                self.polls = [[{"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": "tb"},
                               {"type": "_done", "execution_count": len(self.began)}]]
            else:
                time.sleep(min(timeout, 0.01))
                return []
        if not self.polls:
            if self.code == "die":
                self.alive_ = False
            time.sleep(min(timeout, 0.01))
            return []
        return self.polls.pop(0)

    def finish(self):
        pass

    def interrupt(self):
        self.interrupts += 1

    def kill(self):
        self.killed = True
        self.alive_ = False

    def close(self):
        self.kill()


class FakeStream:
    def __init__(self):
        self.events = []
        self.left = False

    def send(self, ev):
        self.events.append(ev)
        return not self.left

    def gone(self):
        return self.left

    def types(self):
        return [e["type"] for e in self.events]

    def error(self):
        errs = [e for e in self.events if e["type"] == "error"]
        return errs[0] if errs else None


class RunnerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.mid = os.path.join(self.dir, "machine-id")
        with open(self.mid, "w") as f:
            f.write("one\n")
        self.old_mid = server.MACHINE_ID
        server.MACHINE_ID = self.mid
        self.old_poll, server.POLL = server.POLL, 0.01
        self.old_again, server.INTERRUPT_AGAIN = server.INTERRUPT_AGAIN, 0.05
        self.old_give_up, server.INTERRUPT_GIVE_UP = server.INTERRUPT_GIVE_UP, 0.3

    def tearDown(self):
        server.MACHINE_ID = self.old_mid
        server.POLL = self.old_poll
        server.INTERRUPT_AGAIN = self.old_again
        server.INTERRUPT_GIVE_UP = self.old_give_up
        shutil.rmtree(self.dir)

    def context(self, backend=None):
        ctx = server.Context("c1", "python", "/")
        ctx.backend = backend or FakeBackend()
        return ctx

    def run_cell(self, ctx, code, timeout_ms=0, out=None, env=None):
        out = out or FakeStream()
        server.run_cell(None, ctx, code, env or {}, timeout_ms, out, time.monotonic(), server.machine_id())
        return out

    def test_cell(self):
        ctx = self.context()
        out = self.run_cell(ctx, "hello", env={"A": "b"})
        self.assertEqual(out.types(), ["stdout", "number_of_executions", "end_of_execution"])
        self.assertEqual(out.events[0]["text"], "hello\n")
        self.assertEqual(out.events[-1]["context_id"], "c1")
        self.assertIn("duration_ms", out.events[-1])
        self.assertEqual(ctx.backend.began, [("hello", {"A": "b"})])
        self.assertEqual(ctx.state, "idle")

    def test_timeout_interrupts(self):
        ctx = self.context()
        out = self.run_cell(ctx, "forever", timeout_ms=50)
        err = out.error()
        self.assertEqual(err["name"], "TimeoutError")
        self.assertIn("50 ms", err["value"])
        self.assertEqual(err["traceback"], "tb")  # the interpreter's, kept
        self.assertEqual(out.types()[-1], "end_of_execution")
        self.assertEqual(ctx.backend.interrupts, 1)
        self.assertEqual(ctx.state, "idle")

    def test_stubborn_cell_is_killed(self):
        ctx = self.context(FakeBackend(stubborn=True))
        out = self.run_cell(ctx, "forever", timeout_ms=20)
        self.assertEqual(out.error()["name"], "KernelDied")
        self.assertTrue(ctx.backend.killed)
        self.assertGreater(ctx.backend.interrupts, 1)  # sent again before giving up
        self.assertEqual(ctx.describe()["state"], "dead")

    def test_client_leaves(self):
        ctx = self.context()
        out = FakeStream()
        threading.Timer(0.05, lambda: setattr(out, "left", True)).start()
        self.run_cell(ctx, "forever", out=out)
        self.assertEqual(ctx.backend.interrupts, 1)
        self.assertEqual(out.error()["name"], "KeyboardInterrupt")
        self.assertEqual(ctx.state, "idle")

    def test_interrupt_request(self):
        ctx = self.context()
        t = threading.Thread(target=lambda: setattr(self, "out", self.run_cell(ctx, "forever")))
        t.start()
        deadline = time.monotonic() + 5
        while ctx.cell is None and time.monotonic() < deadline:
            time.sleep(0.005)
        self.assertEqual(ctx.describe()["state"], "busy")
        self.assertTrue(ctx.cell.interrupt("interrupt"))
        t.join(5)
        self.assertEqual(self.out.error()["name"], "KeyboardInterrupt")
        self.assertEqual(self.out.error()["value"], "the cell was interrupted")

    def test_machine_changed(self):
        ctx = self.context()

        def move():
            with open(self.mid, "w") as f:
                f.write("two\n")

        threading.Timer(0.05, move).start()
        out = FakeStream()
        with self.assertRaises(server.Gone):
            self.run_cell(ctx, "forever", out=out)
        self.assertEqual(out.events, [])  # nobody listens on the copy
        self.assertEqual(ctx.backend.interrupts, 1)
        self.assertIsNone(ctx.cell)

    def test_died(self):
        ctx = self.context()
        out = self.run_cell(ctx, "die")
        self.assertEqual(out.types(), ["stdout", "error", "end_of_execution"])
        self.assertEqual(out.error()["name"], "KernelDied")
        self.assertEqual(ctx.state, "dead")
        out = self.run_cell(ctx, "again")
        self.assertEqual(out.error()["name"], "KernelDied")
        self.assertIn("restart", out.error()["value"])

    def test_exit_status(self):
        ctx = self.context()
        out = self.run_cell(ctx, "exit 3")
        self.assertEqual(out.error(), {"type": "error", "name": "ExitError", "value": "exit status 3", "traceback": ""})

    def test_fifo(self):
        ctx = self.context()
        order = []
        w = ctx.fifo.enter()  # someone is running
        threads = []
        for i in range(3):
            t = threading.Thread(target=lambda i=i: order.append((i, self.run_cell(ctx, "c%d" % i))))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 5
            while len(ctx.fifo.q) < i + 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        self.assertEqual(order, [])
        ctx.fifo.leave(w)
        for t in threads:
            t.join(5)
        self.assertEqual([i for i, _ in order], [0, 1, 2])
        self.assertEqual([c for c, _ in ctx.backend.began], ["c0", "c1", "c2"])

    def test_waiting_cell_times_out_or_leaves(self):
        ctx = self.context()
        w = ctx.fifo.enter()
        out = self.run_cell(ctx, "late", timeout_ms=30)
        self.assertEqual(out.error()["name"], "TimeoutError")
        self.assertIn("waited", out.error()["value"])
        gone = FakeStream()
        gone.left = True
        with self.assertRaises(server.Gone):
            self.run_cell(ctx, "late", out=gone)
        self.assertEqual(list(ctx.fifo.q), [w])  # both left the queue
        ctx.fifo.leave(w)
        self.assertEqual(ctx.backend.began, [])

    def test_removed_while_waiting(self):
        ctx = self.context()
        w = ctx.fifo.enter()
        t = threading.Thread(target=lambda: setattr(self, "out", self.run_cell(ctx, "x")))
        t.start()
        while len(ctx.fifo.q) < 2:
            time.sleep(0.005)
        ctx.removed = True
        ctx.fifo.leave(w)
        t.join(5)
        self.assertEqual(self.out.error()["name"], "ContextRemoved")


class FakeHandler:
    def __init__(self):
        self.wfile = io.BytesIO()
        self.connection = None


class StreamTest(unittest.TestCase):
    def lines(self, h):
        # De-chunk.
        data, out = h.wfile.getvalue(), b""
        while data:
            size, rest = data.split(b"\r\n", 1)
            n = int(size, 16)
            out += rest[:n]
            data = rest[n + 2:]
        return [json.loads(l) for l in out.splitlines()]

    def test_output_cap(self):
        old = server.MAX_OUTPUT
        server.MAX_OUTPUT = 10
        try:
            h = FakeHandler()
            s = server.Stream(h)
            for text in ("12345", "67890", "x", "y"):
                s.send({"type": "stdout", "text": text})
            s.send({"type": "result", "text": "r", "is_main_result": True})
        finally:
            server.MAX_OUTPUT = old
        lines = self.lines(h)
        self.assertEqual([l.get("text") for l in lines], ["12345", "67890", server.TRUNCATED, "r"])
        self.assertEqual(lines[2]["type"], "stderr")
        self.assertTrue(all("timestamp" in l for l in lines[:3]))
        self.assertTrue(s.truncated)

    def test_long_output_in_pieces(self):
        old = server.OUTPUT_PIECE
        server.OUTPUT_PIECE = 4
        try:
            h = FakeHandler()
            server.Stream(h).send({"type": "stderr", "text": "0123456789"})
        finally:
            server.OUTPUT_PIECE = old
        self.assertEqual([(l["type"], l["text"]) for l in self.lines(h)], [("stderr", "0123"), ("stderr", "4567"), ("stderr", "89")])

    def test_nan_in_results(self):
        h = FakeHandler()
        server.Stream(h).send({"type": "result", "json": {"a": float("nan"), "b": [float("inf"), 1.5]}, "is_main_result": True})
        self.assertEqual(self.lines(h)[0]["json"], {"a": None, "b": [None, 1.5]})

    def test_result_event(self):
        ev = server.result_event(
            {"text/plain": "1", "image/png": "aGk=\n", "application/json": {"a": 1},
             server.CHART_MIME: {"type": "line"}, server.DATA_MIME: {"a": [1]}, "application/x-foo": "bar"},
            True,
        )
        self.assertEqual(ev, {"type": "result", "text": "1", "png": "aGk=", "json": {"a": 1}, "chart": {"type": "line"},
                              "data": {"a": [1]}, "extra": {"application/x-foo": "bar"}, "is_main_result": True})

    def test_result_event_drops_what_cannot_be_carried(self):
        ev = server.result_event(
            {"text/html": 5, "text/plain": ["a", "b"], "image/png": "not base64!", "image/jpeg": "aGk",
             server.CHART_MIME: [1], server.DATA_MIME: "x", "nomime": 1, "a/b c": 2, "application/x-ok": 3},
            False,
        )
        self.assertEqual(ev, {"type": "result", "html": "5", "text": "ab", "extra": {"application/x-ok": 3}, "is_main_result": False})

    def test_clean_traceback(self):
        self.assertEqual(server.clean_traceback(["\x1b[0;31mZeroDivisionError\x1b[0m", "line 2"]), "ZeroDivisionError\nline 2")

    def test_utf8_tail(self):
        e = "é€😀".encode()
        self.assertEqual(server.utf8_tail(b"ab"), 0)
        self.assertEqual(server.utf8_tail(e[:1]), 1)
        self.assertEqual(server.utf8_tail(e[:2]), 0)
        self.assertEqual(server.utf8_tail(e[:4]), 2)
        self.assertEqual(server.utf8_tail(e[:8]), 3)
        self.assertEqual(server.utf8_tail(e), 0)

    def test_canonical(self):
        self.assertEqual(server.canonical("JS"), "javascript")
        self.assertEqual(server.canonical("sh"), "bash")
        with self.assertRaises(server.BadRequest) as cm:
            server.canonical("cobol")
        self.assertEqual(cm.exception.msg, 'unknown language "cobol": python, javascript, bash')


def run(backend, code, env=None, timeout=20, interrupt_after=None):
    """Runs one cell on a real backend and returns its events."""
    events = []
    backend.begin(code, env or {})
    start = time.monotonic()
    interrupted = False
    while time.monotonic() - start < timeout:
        if interrupt_after is not None and not interrupted and time.monotonic() - start > interrupt_after:
            backend.interrupt()
            interrupted = True
        for ev in backend.poll(0.05):
            events.append(ev)
            if ev["type"] == "_done":
                backend.finish()
                return events
    raise AssertionError("the cell did not end within %ds: %s" % (timeout, events))


def text(events, typ):
    return "".join(e["text"] for e in events if e["type"] == typ)


class NodeTest(unittest.TestCase):
    def test_node(self):
        b = server.NodeBackend(tempfile.gettempdir())
        b.start()
        try:
            ev = run(b, "let a = 40; console.log('a', a); process.stderr.write('e\\n'); a + 2")
            self.assertEqual(text(ev, "stdout"), "a 40\n")
            self.assertEqual(text(ev, "stderr"), "e\n")
            self.assertEqual([e["text"] for e in ev if e["type"] == "result"], ["42"])
            self.assertEqual(ev[-1], {"type": "_done", "execution_count": 1})
            ev = run(b, "a += 1; throw new RangeError('no')")
            errs = [e for e in ev if e["type"] == "error"]
            self.assertEqual((errs[0]["name"], errs[0]["value"]), ("RangeError", "no"))
            ev = run(b, "while (true) {}", interrupt_after=0.3)
            self.assertEqual([e["type"] for e in ev][:1], ["error"])
            ev = run(b, "await new Promise(r => setTimeout(r, 10)); console.log(a, process.env.X)", env={"X": "y"})
            self.assertEqual(text(ev, "stdout"), "41 y\n")
            ev = run(b, "const w = await Promise.resolve(2); w * a")
            self.assertEqual([e["text"] for e in ev if e["type"] == "result"], ["82"])
            ev = run(b, "w")  # declared in a cell with top-level await: kept
            self.assertEqual([e["text"] for e in ev if e["type"] == "result"], ["2"])
            ev = run(b, "process.env.X")
            self.assertEqual([e for e in ev if e["type"] == "result"], [])  # undefined: no result
            self.assertTrue(b.alive())
        finally:
            b.close()
        self.assertFalse(b.alive())


class BashTest(unittest.TestCase):
    def test_bash(self):
        b = server.BashBackend(tempfile.gettempdir())
        b.start()
        try:
            ev = run(b, "X=1; f() { echo \"f$1\"; }; cd /; echo out; echo err >&2; printf 'no newline'")
            self.assertEqual(text(ev, "stdout"), "out\nno newline")
            self.assertEqual(text(ev, "stderr"), "err\n")
            self.assertEqual(ev[-1]["status"], 0)
            ev = run(b, "f $X; pwd; echo \"[$E]\"; nosuchcommand", env={"E": "it's"})
            self.assertEqual(text(ev, "stdout"), "f1\n/\n[it's]\n")
            self.assertIn("nosuchcommand: command not found", text(ev, "stderr"))
            self.assertNotIn(b.dir, text(ev, "stderr"))
            self.assertEqual(ev[-1]["status"], 127)
            ev = run(b, "echo \"[${E-unset}]\"; for i in $(seq 1 20000); do printf 'é€'; done; echo")
            out = text(ev, "stdout")
            self.assertEqual(out, "[unset]\n" + "é€" * 20000 + "\n")  # characters split across reads kept whole
            ev = run(b, "sleep 30; echo never", interrupt_after=0.3, timeout=10)
            self.assertNotIn("never", text(ev, "stdout"))
            self.assertEqual(ev[-1]["status"], 130)
            ev = run(b, "while :; do :; done", interrupt_after=0.3, timeout=10)
            self.assertEqual(ev[-1]["status"], 130)
            ev = run(b, "echo $X")
            self.assertEqual(text(ev, "stdout"), "1\n")
        finally:
            b.close()
        self.assertFalse(os.path.exists(b.dir))


if __name__ == "__main__":
    unittest.main()
