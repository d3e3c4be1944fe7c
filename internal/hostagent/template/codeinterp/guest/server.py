#!/usr/bin/python3
"""PandaStack's code server: runs code in persistent contexts for the
sandbox's clients, speaking E2B's code-interpreter protocol on port 49999.

Each context is one interpreter of one language, kept between cells:
  python      an IPython kernel (ipykernel, driven with jupyter_client)
  javascript  a Node.js process (node_driver.js)
  bash        an interactive bash on a pseudo-terminal
The default context of each language is started (and, for Python, warmed
up: numpy, pandas and matplotlib imported) before /health answers ok.

Cells of one context run one at a time, in the order they arrived. A cell
is interrupted (SIGINT, so the context keeps its state) when its client
leaves, when its timeout_ms passes, when /contexts/{id}/interrupt asks, or
when this machine turns out to be a copy (a fork's child, a restore of a
snapshot: /etc/machine-id changed), whose output nobody would read.

The protocol (requests, stream lines, errors) is in docs/code-interpreter.md
and the spec it follows; the Go package around this file
(internal/hostagent/template/codeinterp) writes it into the guest at bake
time. Standard library and jupyter_client only.
"""

import json
import os
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(os.environ.get("PANDASTACK_CODE_PORT", "49999"))
HOME = os.environ.get("HOME") or "/home/user"
MACHINE_ID = "/etc/machine-id"

MAX_BODY = 64 << 20  # a request body (the code of a cell, mostly)
MAX_OUTPUT = 100 << 20  # stdout+stderr forwarded per cell
MAX_RESULT_LINE = 60 << 20  # one result line (the host takes at most 64 MiB)
OUTPUT_PIECE = 1 << 20  # characters of stdout or stderr per line, at most
START_TIMEOUT = 600  # seconds a context may take to start (pandas under TCG)
POLL = 0.1  # seconds between checks while a cell runs or waits
INTERRUPT_AGAIN = 5.0  # seconds between SIGINTs to a cell that goes on
INTERRUPT_GIVE_UP = 60.0  # seconds after the first SIGINT: the context is killed
WRITE_TIMEOUT = 120  # seconds a client may leave a write blocked

TRUNCATED = "[output truncated: the cell wrote more than 100 MiB]"

LANGUAGES = {
    "python": "python",
    "python3": "python",
    "py": "python",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
    "nodejs": "javascript",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
}
LANGUAGE_LIST = "python, javascript, bash"
DEFAULT_ORDER = ("python", "javascript", "bash")
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

CHART_MIME = "application/vnd.pandastack.chart+json"
DATA_MIME = "application/vnd.pandastack.data+json"
# Jupyter MIME types as E2B's result keys.
RESULT_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    DATA_MIME: "data",
    CHART_MIME: "chart",
}


def log(msg, *args):
    sys.stderr.write(time.strftime("%H:%M:%S ") + (msg % args if args else msg) + "\n")
    sys.stderr.flush()


def machine_id():
    """This machine's identity, which the guest agent rewrites on every
    restore; "" if unreadable."""
    try:
        with open(MACHINE_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def clean_traceback(tb):
    """A traceback as one string without colour codes."""
    if isinstance(tb, list):
        tb = "\n".join(str(line) for line in tb)
    return ANSI_RE.sub("", str(tb or ""))


class Gone(Exception):
    """The request ends without a response: its client is not there."""


# --- backends ----------------------------------------------------------------
#
# A backend is one interpreter. The server calls it from one thread at a time
# (the context's FIFO), except interrupt() and kill(), which any thread may
# call. poll() returns protocol events (dicts with "type") of the running
# cell and {"type": "_done", "execution_count": N} as its last.


class Jupyter:
    """The one asyncio loop, in a thread of its own, that owns every
    jupyter_client object: its kernel managers and clients are asyncio
    objects (zmq.asyncio sockets), which must not be used from other
    threads or loops. Other threads call in with run()."""

    def __init__(self):
        import asyncio

        self.asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="jupyter", daemon=True).start()

    def run(self, coro, timeout=None):
        """Runs coroutine coro in the loop and returns its result."""
        return self.asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro):
        """Starts coroutine coro in the loop without waiting for it."""
        return self.asyncio.run_coroutine_threadsafe(coro, self.loop)


_jupyter = None
_jupyter_lock = threading.Lock()


def jupyter():
    global _jupyter
    with _jupyter_lock:
        if _jupyter is None:
            _jupyter = Jupyter()
        return _jupyter


class PythonBackend:
    """An IPython kernel through jupyter_client (its asyncio API, in the
    Jupyter loop). A task of the loop moves the kernel's iopub and shell
    messages into queues that the cell's thread reads."""

    language = "python"

    def __init__(self, cwd):
        self.cwd = cwd
        self.km = None
        self.kc = None
        self.reader = None
        self.iopub = queue.Queue()
        self.shell = queue.Queue()
        self.msg_id = None
        self.count = None
        self.env_set = False

    def start(self):
        j = jupyter()
        j.run(self._start(), START_TIMEOUT + 30)
        setup = (
            "import sys as _ps_sys\n"
            "_ps_sys.path.insert(0, %r)\n"
            "try:\n"
            "    import pandastack_kernel as _ps_kernel\n"
            "finally:\n"
            "    _ps_sys.path.remove(%r)\n"
            "_ps_kernel.setup(get_ipython())\n"
            "del _ps_sys, _ps_kernel\n"
        ) % (HERE, HERE)
        self._silent(setup, START_TIMEOUT)

    async def _start(self):
        from jupyter_client import AsyncKernelManager

        env = dict(os.environ)
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's warning at every start
        env.pop("PANDASTACK_CODE_PORT", None)
        self.km = AsyncKernelManager(kernel_name="python3")
        await self.km.start_kernel(cwd=self.cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=START_TIMEOUT)
        self.reader = [
            jupyter().asyncio.ensure_future(self._read(self.kc.get_iopub_msg, self.iopub)),
            jupyter().asyncio.ensure_future(self._read(self.kc.get_shell_msg, self.shell)),
        ]

    @staticmethod
    async def _read(get, q):
        while True:
            try:
                msg = await get(timeout=None)
            except Exception:
                q.put(None)
                return
            q.put(msg)

    def _execute(self, code, silent):
        async def send():
            return self.kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False)

        return jupyter().run(send(), 30)

    def _silent(self, code, timeout):
        """Runs code in the kernel without a trace in its history; raises
        if it fails."""
        msg_id = self._execute(code, True)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("the Python kernel did not answer within %ds" % timeout)
            if not self.alive():
                raise RuntimeError("the Python kernel died")
            try:
                reply = self.shell.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if reply is None:
                raise RuntimeError("the Python kernel's channel closed")
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            content = reply.get("content", {})
            if content.get("status") != "ok":
                raise RuntimeError(
                    "%s: %s\n%s"
                    % (content.get("ename"), content.get("evalue"), clean_traceback(content.get("traceback", [])))
                )
            return

    def _process(self):
        return getattr(getattr(self.km, "provisioner", None), "process", None)

    def alive(self):
        p = self._process()
        return p is not None and p.poll() is None

    def begin(self, code, env):
        self.count = None
        self.env_set = False
        if env:
            self._silent("__import__('pandastack_kernel').set_env(%r)" % json.dumps(env), 30)
            self.env_set = True
        self.msg_id = self._execute(code, False)

    def poll(self, timeout):
        events = []
        try:
            msg = self.iopub.get(timeout=timeout)
        except queue.Empty:
            return events
        while msg is not None:
            self._event(msg, events)
            if events and events[-1]["type"] == "_done":
                break
            try:
                msg = self.iopub.get_nowait()
            except queue.Empty:
                msg = None
        return events

    def _event(self, msg, events):
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        t = msg.get("msg_type")
        c = msg.get("content", {})
        if t == "stream":
            events.append({"type": "stderr" if c.get("name") == "stderr" else "stdout", "text": str(c.get("text", ""))})
        elif t == "execute_input":
            self.count = c.get("execution_count")
        elif t in ("execute_result", "display_data", "update_display_data"):
            events.append(result_event(c.get("data", {}), t == "execute_result"))
        elif t == "error":
            events.append(
                {
                    "type": "error",
                    "name": str(c.get("ename", "")),
                    "value": str(c.get("evalue", "")),
                    "traceback": clean_traceback(c.get("traceback", [])),
                }
            )
        elif t == "status" and c.get("execution_state") == "idle":
            events.append({"type": "_done", "execution_count": self.count})

    def finish(self):
        # The cell's reply on the shell channel is not needed.
        while True:
            try:
                self.shell.get_nowait()
            except queue.Empty:
                break
        if self.env_set:
            self.env_set = False
            self._silent("__import__('pandastack_kernel').restore_env()", 30)

    def interrupt(self):
        try:
            jupyter().run(self.km.interrupt_kernel(), 30)
        except Exception as e:
            log("interrupt the Python kernel: %s", e)

    def kill(self):
        p = self._process()
        if p is not None:
            try:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            except OSError:
                pass

    def close(self):
        self.kill()

        async def shutdown():
            for t in self.reader or []:
                t.cancel()
            if self.kc is not None:
                self.kc.stop_channels()
            if self.km is not None:
                await self.km.shutdown_kernel(now=True)
                self.km.cleanup_resources()

        try:
            jupyter().run(shutdown(), 60)
        except Exception as e:
            log("close a Python kernel: %s", e)


class Channel:
    """Reads lines or chunks from a file descriptor into a queue, in a
    thread of its own."""

    @staticmethod
    def lines(sock, q, tag):
        f = sock.makefile("rb")

        def run():
            try:
                for line in f:
                    q.put((tag, line))
            except (OSError, ValueError):
                pass
            q.put((tag, None))

        threading.Thread(target=run, daemon=True).start()

    @staticmethod
    def chunks(fd, q, tag):
        def run():
            while True:
                try:
                    b = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    b = b""
                if not b:
                    break
                q.put((tag, b))
            q.put((tag, None))

        threading.Thread(target=run, daemon=True).start()


class ProcessBackend:
    """What the JavaScript and bash backends share: an interpreter that is
    one child process (self.proc), the leader of its own process group."""

    proc = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass


class NodeBackend(ProcessBackend):
    """A Node.js process running node_driver.js."""

    language = "javascript"

    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None
        self.sock = None
        self.q = queue.Queue()
        self.cell = 0
        self.running = False

    def start(self):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env.pop("PANDASTACK_CODE_PORT", None)
        env["PANDASTACK_DRIVER_FD"] = str(theirs.fileno())
        env["NODE_DISABLE_COLORS"] = "1"
        self.proc = subprocess.Popen(
            # --expose-internals: the REPL's top-level await rewriting.
            ["node", "--expose-internals", os.path.join(HERE, "node_driver.js")],
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[theirs.fileno()],
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        Channel.lines(ours, self.q, "chan")
        Channel.chunks(self.proc.stdout.fileno(), self.q, "stdout")
        Channel.chunks(self.proc.stderr.fileno(), self.q, "stderr")
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                tag, data = self.q.get(timeout=1)
            except queue.Empty:
                if not self.alive():
                    raise RuntimeError("node exited with status %s" % self.proc.returncode)
                continue
            if tag == "chan" and data is not None:
                try:
                    if json.loads(data).get("type") == "ready":
                        return
                except ValueError:
                    pass
            elif tag == "stderr" and data:
                log("node: %s", data.decode("utf-8", "replace").rstrip())
        raise RuntimeError("node did not start within %ds" % START_TIMEOUT)

    def begin(self, code, env):
        self.cell += 1
        self.running = True
        msg = json.dumps({"type": "execute", "id": self.cell, "code": code, "env": env or {}}) + "\n"
        self.sock.sendall(msg.encode())

    def poll(self, timeout):
        events = []
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            return events
        while item is not None:
            tag, data = item
            if data is not None:
                self._event(tag, data, events)
            if events and events[-1]["type"] == "_done":
                break
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                item = None
        return events

    def _event(self, tag, data, events):
        if tag in ("stdout", "stderr"):
            # Written to the process's own descriptors (child processes,
            # native code): the running cell's, if any.
            if self.running:
                events.append({"type": tag, "text": data.decode("utf-8", "replace")})
            return
        try:
            msg = json.loads(data)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        mid = msg.get("id")
        if mid is not None and mid != self.cell:
            return
        t = msg.get("type")
        if t in ("stdout", "stderr"):
            if self.running:
                events.append({"type": t, "text": str(msg.get("text", ""))})
        elif t == "result":
            events.append({"type": "result", "text": str(msg.get("text", "")), "is_main_result": True})
        elif t == "error":
            events.append(
                {
                    "type": "error",
                    "name": str(msg.get("name", "Error")),
                    "value": str(msg.get("value", "")),
                    "traceback": clean_traceback(msg.get("traceback", "")),
                }
            )
        elif t == "done":
            self.running = False
            events.append({"type": "_done", "execution_count": msg.get("execution_count")})

    def finish(self):
        self.running = False

    def interrupt(self):
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def close(self):
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (self.proc.stdout, self.proc.stderr):
                f.close()
        if self.sock is not None:
            self.sock.close()


class BashBackend(ProcessBackend):
    """An interactive bash on a pseudo-terminal, so that SIGINT (^C) stops
    the cell's foreground job, or bash's own loop, and bash goes back to its
    prompt with its state. Each cell is sourced from a file in the current
    shell with stdout and stderr to two named pipes (apart) and stdin from
    /dev/null; the prompt, printed on the terminal with a nonce, ends it
    with its status, and a marker written to both pipes after it says that
    all of its output was read."""

    language = "bash"

    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None
        self.master = None
        self.dir = None
        self.q = queue.Queue()
        self.nonce = secrets.token_hex(12)
        self.keep = []  # write ends held so that the pipes never report EOF
        self.reset()

    def reset(self):
        self.status = None
        self.pending = {"stdout": b"", "stderr": b""}
        self.marked = {"stdout": False, "stderr": False}
        self.term = b""

    def start(self):
        import pty

        self.dir = tempfile.mkdtemp(prefix="pandastack-bash-")
        fds = {}
        for name in ("stdout", "stderr"):
            p = os.path.join(self.dir, name)
            os.mkfifo(p, 0o600)
            fds[name] = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            self.keep.append(os.open(p, os.O_WRONLY))
            os.set_blocking(fds[name], True)
        self.master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~(termios.ECHO | termios.ECHONL)  # lflag: no echo of what we type
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        env = dict(os.environ)
        env.pop("PANDASTACK_CODE_PORT", None)
        env.update({"TERM": "dumb", "PS1": "", "PS2": "", "HISTFILE": "/dev/null"})
        # setsid --ctty: a session of its own whose controlling terminal is
        # the pty (job control, ^C); not a group leader, so no fork.
        self.proc = subprocess.Popen(
            ["setsid", "--ctty", "bash", "--norc", "--noprofile", "--noediting", "-i"],
            cwd=self.cwd,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        Channel.chunks(self.master, self.q, "term")
        Channel.chunks(fds["stdout"], self.q, "stdout")
        Channel.chunks(fds["stderr"], self.q, "stderr")
        d = self.dir
        init = (
            "__ps_dir=%s; __ps_nonce=%s; __ps_status=0\n"
            "__ps_cell() { if [ -f \"$__ps_dir/pre\" ]; then . \"$__ps_dir/pre\"; fi; "
            ". \"$__ps_dir/cell\" </dev/null >\"$__ps_dir/stdout\" 2>\"$__ps_dir/stderr\"; }\n"
            "__ps_prompt() { __ps_status=$?; if [ -f \"$__ps_dir/post\" ]; then . \"$__ps_dir/post\"; fi; "
            "rm -f \"$__ps_dir/pre\" \"$__ps_dir/post\"; "
            "printf '\\036%%s\\036' \"$__ps_nonce\" >\"$__ps_dir/stdout\"; "
            "printf '\\036%%s\\036' \"$__ps_nonce\" >\"$__ps_dir/stderr\"; }\n"
            "PROMPT_COMMAND=__ps_prompt; PS1='\\036${__ps_nonce}:${__ps_status}\\036'; PS2=''; "
            "unset HISTFILE; set +o history +H\n"
        ) % (shquote(d), self.nonce)
        os.write(self.master, init.encode())
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for e in self.poll(1.0):
                if e["type"] == "_done":
                    self.reset()
                    return
            if not self.alive():
                raise RuntimeError("bash exited with status %s" % self.proc.returncode)
        raise RuntimeError("bash did not start within %ds" % START_TIMEOUT)

    def begin(self, code, env):
        self.reset()
        pre, post = "", ""
        for k, v in (env or {}).items():
            pre += "if [ \"${%s+x}\" ]; then __ps_had_%s=1; __ps_old_%s=$%s; else __ps_had_%s=; fi; export %s=%s\n" % (
                k, k, k, k, k, k, shquote(v))
            post += "if [ -n \"$__ps_had_%s\" ]; then %s=$__ps_old_%s; else unset %s; fi; unset __ps_had_%s __ps_old_%s\n" % (
                k, k, k, k, k, k)
        self._write("cell", code)
        if pre:
            self._write("pre", pre)
            self._write("post", post)
        os.write(self.master, b"__ps_cell\n")

    def _write(self, name, text):
        p = os.path.join(self.dir, name)
        with open(p + ".new", "w") as f:
            f.write(text)
            if not text.endswith("\n"):
                f.write("\n")
        os.replace(p + ".new", p)

    def poll(self, timeout):
        events = []
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            return events
        while item is not None:
            tag, data = item
            if data is not None:
                self._event(tag, data, events)
            if self.status is not None and all(self.marked.values()):
                events.append({"type": "_done", "execution_count": None, "status": self.status})
                break
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                item = None
        return events

    def _event(self, tag, data, events):
        if tag == "term":
            self.term = (self.term + data)[-4096:]
            m = re.search(rb"\x1e" + self.nonce.encode() + rb":(\d+)\x1e", self.term)
            if m:
                self.status = int(m.group(1))
                self.term = self.term[m.end():]
            return
        if self.marked[tag]:
            return  # a background job's output after the cell's end: dropped
        buf = self.pending[tag] + data
        marker = b"\x1e" + self.nonce.encode() + b"\x1e"
        i = buf.find(marker)
        if i >= 0:
            self._emit(tag, buf[:i], events)
            self.pending[tag] = b""
            self.marked[tag] = True
            return
        # Hold back what may be the start of the marker, or of a character.
        keep = 0
        j = buf.rfind(b"\x1e", max(0, len(buf) - len(marker) + 1))
        if j >= 0:
            keep = len(buf) - j
        head = buf[: len(buf) - keep]
        cut = utf8_tail(head)
        self._emit(tag, head[: len(head) - cut], events)
        self.pending[tag] = buf[len(head) - cut:]

    def _emit(self, tag, data, events):
        if not data:
            return
        text = data.decode("utf-8", "replace")
        if tag == "stderr":
            text = text.replace(self.dir + "/cell: ", "")
        events.append({"type": tag, "text": text})

    def finish(self):
        pass

    def interrupt(self):
        # What ^C does, without relying on the terminal's modes: SIGINT to
        # the terminal's foreground process group (the cell's job, or
        # bash itself when the cell is a loop of builtins).
        try:
            os.killpg(os.tcgetpgrp(self.master), signal.SIGINT)
        except OSError as e:
            log("interrupt bash: %s", e)

    def close(self):
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for fd in self.keep + ([self.master] if self.master is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass
        self.keep = []
        self.master = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def utf8_tail(b):
    """How many bytes at the end of b are an incomplete UTF-8 character."""
    for k in range(1, min(3, len(b)) + 1):
        c = b[-k]
        if c & 0xC0 == 0x80:
            continue  # a continuation byte: look further back
        if c & 0xC0 != 0xC0:
            return 0  # ASCII
        need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
        return k if need > k else 0
    return 0


def shquote(s):
    return "'" + s.replace("'", "'\\''") + "'"


BACKENDS = {"python": PythonBackend, "javascript": NodeBackend, "bash": BashBackend}


STRING_KEYS = {"text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "javascript"}
BASE64_KEYS = {"png", "jpeg", "pdf"}
MIME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
BASE64_RE = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


def result_event(data, is_main):
    """A Jupyter MIME bundle as a result line: E2B's keys, anything else
    under "extra". A cell can display any bundle (display(..., raw=True)):
    what the protocol could not carry is dropped rather than sent — a
    string key's value that is not text becomes its JSON text, base64
    that is not, a chart or data that is not an object, an extra MIME
    type that is not one."""
    ev = {"type": "result"}
    extra = {}
    for mime, value in (data or {}).items():
        key = RESULT_KEYS.get(mime)
        if key is None:
            if isinstance(mime, str) and len(mime) <= 255 and MIME_RE.match(mime):
                extra[mime] = value
            continue
        if key in STRING_KEYS and not isinstance(value, str):
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = "".join(value)  # Jupyter's multi-line strings
            else:
                value = json.dumps(value, default=str)
        if key in BASE64_KEYS:
            value = "".join(value.split())  # without line breaks
            if len(value) % 4 != 0 or not BASE64_RE.match(value):
                continue
        if key in ("chart", "data") and not isinstance(value, dict):
            continue
        ev[key] = value
    if extra:
        ev["extra"] = extra
    ev["is_main_result"] = bool(is_main)
    return ev


# --- contexts ------------------------------------------------------------------


class Waiter:
    def __init__(self):
        self.ready = threading.Event()


class Fifo:
    """The queue of one context: who runs next. The head runs; leaving
    hands over to the next one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.q = deque()

    def enter(self, front=False):
        w = Waiter()
        with self.lock:
            if front and self.q:
                self.q.insert(1, w)  # right after the one running
            else:
                self.q.append(w)
            if self.q[0] is w:
                w.ready.set()
        return w

    def wait(self, w, timeout):
        return w.ready.wait(timeout)

    def leave(self, w):
        """Leaves the queue, running or waiting."""
        with self.lock:
            was_head = bool(self.q) and self.q[0] is w
            try:
                self.q.remove(w)
            except ValueError:
                return
            if was_head and self.q:
                self.q[0].ready.set()


class Context:
    def __init__(self, cid, language, cwd):
        self.id = cid
        self.language = language
        self.cwd = cwd
        self.backend = None
        self.fifo = Fifo()
        self.state = "idle"
        self.removed = False
        self.cell = None  # the running Cell
        self.lock = threading.Lock()  # backend and state changes

    def describe(self):
        with self.lock:
            state = self.state
            if state != "dead" and self.backend is not None and not self.backend.alive():
                state = "dead"
        return {"id": self.id, "language": self.language, "cwd": self.cwd, "state": state}

    def start(self):
        b = BACKENDS[self.language](self.cwd)
        t0 = time.monotonic()
        try:
            b.start()
        except BaseException:
            b.close()
            raise
        log("context %s (%s) started in %.1fs", self.id, self.language, time.monotonic() - t0)
        with self.lock:
            self.backend = b
            self.state = "idle"

    def close(self):
        with self.lock:
            b, self.backend = self.backend, None
            self.state = "dead"
        if b is not None:
            b.close()


class Cell:
    """One running cell; interrupt() may be called from any thread."""

    def __init__(self):
        self.reason = None  # why it was interrupted: timeout, gone, interrupt, moved, restart
        self.lock = threading.Lock()

    def interrupt(self, reason):
        with self.lock:
            if self.reason is None:
                self.reason = reason
                return True
            return False


class Server:
    def __init__(self):
        self.lock = threading.Lock()
        self.contexts = {}
        self.defaults = {lang: "default-" + lang for lang in DEFAULT_ORDER}
        self.default_locks = {lang: threading.Lock() for lang in DEFAULT_ORDER}
        self.ready = False
        self.failed = None

    def warm(self):
        """Starts the default contexts, in parallel; /health is ok once all
        are."""
        t0 = time.monotonic()
        errors = []

        def start(lang):
            try:
                self.default_context(lang)
            except Exception as e:
                errors.append("%s: %s" % (lang, e))
                log("the default %s context did not start: %s", lang, e)

        threads = [threading.Thread(target=start, args=(lang,)) for lang in DEFAULT_ORDER]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.failed = "; ".join(errors)
            return
        self.ready = True
        log("warm in %.1fs", time.monotonic() - t0)

    def get(self, cid):
        with self.lock:
            return self.contexts.get(cid)

    def default_context(self, lang):
        """The default context of lang, started first if there is none."""
        cid = self.defaults[lang]
        with self.default_locks[lang]:
            ctx = self.get(cid)
            if ctx is not None:
                return ctx
            ctx = Context(cid, lang, HOME)
            ctx.start()
            with self.lock:
                self.contexts[cid] = ctx
            return ctx

    def create(self, lang, cwd):
        cid = uuid.uuid4().hex
        ctx = Context(cid, lang, cwd)
        ctx.start()
        with self.lock:
            self.contexts[cid] = ctx
        return ctx

    def remove(self, cid):
        with self.lock:
            ctx = self.contexts.pop(cid, None)
        if ctx is None:
            return False
        ctx.removed = True
        cell = ctx.cell
        if cell is not None:
            cell.interrupt("removed")
        ctx.close()
        return True

    def restart(self, ctx):
        """A fresh interpreter in ctx: the running cell (if any) ends with
        KernelDied, queued cells run in the new one."""
        cell = ctx.cell
        if cell is not None:
            cell.interrupt("restart")
        with ctx.lock:
            b = ctx.backend
        if b is not None:
            b.kill()
        w = ctx.fifo.enter(front=True)
        try:
            while not ctx.fifo.wait(w, 1.0):
                pass
            ctx.close()
            if ctx.removed:
                return None
            with ctx.lock:
                ctx.state = "busy"
            try:
                ctx.start()
            except Exception:
                with ctx.lock:
                    ctx.state = "dead"
                raise
            return ctx
        finally:
            ctx.fifo.leave(w)

    def list(self):
        with self.lock:
            ctxs = list(self.contexts.values())
        return [c.describe() for c in ctxs]


# --- execution -------------------------------------------------------------------


class Stream:
    """The response of /execute: NDJSON lines in chunked encoding. send()
    returns False once the client is gone."""

    def __init__(self, handler):
        self.h = handler
        self.sock = handler.connection
        self.broken = False
        self.output = 0
        self.truncated = False

    def begin(self):
        self.h.send_response(200)
        self.h.send_header("Content-Type", "application/x-ndjson")
        self.h.send_header("Transfer-Encoding", "chunked")
        self.h.send_header("Cache-Control", "no-store")
        self.h.end_headers()
        self._flush()

    def _flush(self):
        try:
            self.h.wfile.flush()
        except OSError:
            self.broken = True

    def send(self, ev):
        if self.broken:
            return False
        if ev["type"] in ("stdout", "stderr") and len(ev["text"]) > OUTPUT_PIECE:
            # Lines stay small: the host bounds each one.
            t = ev["text"]
            for i in range(0, len(t), OUTPUT_PIECE):
                if not self.send({"type": ev["type"], "text": t[i : i + OUTPUT_PIECE]}):
                    return False
            return True
        if ev["type"] in ("stdout", "stderr"):
            n = len(ev["text"].encode("utf-8", "surrogatepass"))
            if self.truncated:
                return True
            if self.output + n > MAX_OUTPUT:
                self.truncated = True
                ev = {"type": "stderr", "text": TRUNCATED}
            else:
                self.output += n
            ev["timestamp"] = time.time_ns()
        try:
            line = json.dumps(ev, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
        except ValueError:
            line = json.dumps(finite(ev), ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
        data = line.encode("utf-8", "surrogatepass") + b"\n"
        if len(data) > MAX_RESULT_LINE:
            data = (
                json.dumps(
                    {"type": "stderr", "text": "[a result of %d MiB was dropped: more than the %d MiB a line may hold]\n"
                     % (len(data) >> 20, MAX_RESULT_LINE >> 20), "timestamp": time.time_ns()}
                ).encode()
                + b"\n"
            )
        try:
            self.h.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
        except OSError:
            self.broken = True
            return False
        return True

    def end(self):
        if self.broken:
            return
        try:
            self.h.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.broken = True

    def gone(self):
        """Whether the client closed or reset its connection (a readable
        socket with nothing to read)."""
        if self.broken:
            return True
        try:
            r, _, _ = select.select([self.sock], [], [], 0)
            if not r:
                return False
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.broken = True
            return True
        if data == b"":
            self.broken = True
            return True
        return False


def finite(v):
    """v with NaN and infinities (which JSON cannot hold) as None."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


ERROR_TEXT = {
    "timeout": ("TimeoutError", "the cell ran longer than its timeout of %d ms and was interrupted; the context keeps its state"),
    "interrupt": ("KeyboardInterrupt", "the cell was interrupted"),
    "gone": ("KeyboardInterrupt", "the cell was interrupted: its client left"),
}


def run_cell(server, ctx, w, code, env, timeout_ms, out, arrived, mid):
    """Runs code in ctx for the client of stream out, from waiting in the
    FIFO (w: its place, taken before the stream's headers were sent, so
    that a client that sees them knows its cell is queued) to
    end_of_execution. Leaves the FIFO. Raises Gone when nothing more is to
    be sent."""
    deadline = arrived + timeout_ms / 1000.0 if timeout_ms else None
    try:
        while not ctx.fifo.wait(w, POLL):
            if out.gone() or machine_id() != mid:
                raise Gone()
            if deadline is not None and time.monotonic() > deadline:
                out.send({"type": "error", "name": "TimeoutError",
                          "value": "the cell waited longer than its timeout of %d ms for the cells before it" % timeout_ms,
                          "traceback": ""})
                out.send({"type": "end_of_execution", "context_id": ctx.id,
                          "duration_ms": int((time.monotonic() - arrived) * 1000)})
                return
        if ctx.removed:
            out.send({"type": "error", "name": "ContextRemoved", "value": "context %s was removed" % ctx.id, "traceback": ""})
            out.send({"type": "end_of_execution", "context_id": ctx.id, "duration_ms": int((time.monotonic() - arrived) * 1000)})
            return
        execute(ctx, code, env, timeout_ms, out, arrived, deadline, mid)
    finally:
        ctx.fifo.leave(w)


def execute(ctx, code, env, timeout_ms, out, arrived, deadline, mid):
    with ctx.lock:
        b = ctx.backend
        dead = b is None or not b.alive() or ctx.state == "dead"
        if dead:
            ctx.state = "dead"
        else:
            ctx.state = "busy"
    if dead:
        out.send({"type": "error", "name": "KernelDied",
                  "value": "the %s interpreter of context %s is not running: restart the context" % (ctx.language, ctx.id),
                  "traceback": ""})
        out.send({"type": "end_of_execution", "context_id": ctx.id, "duration_ms": int((time.monotonic() - arrived) * 1000)})
        return
    cell = Cell()
    ctx.cell = cell
    count = None
    error = None
    status = None
    died = False
    first_sigint = last_sigint = None
    try:
        try:
            b.begin(code, env)
        except Exception as e:
            if b.alive():
                raise
            log("begin a cell in %s: %s", ctx.id, e)
            died = True
        while not died:
            events = b.poll(POLL)
            done = False
            for ev in events:
                if ev["type"] == "_done":
                    count = ev.get("execution_count")
                    status = ev.get("status")
                    done = True
                elif ev["type"] == "error":
                    error = ev  # sent last, after what the cell printed
                elif cell.reason != "moved":
                    out.send(ev)
            if done:
                break
            if not b.alive():
                died = True
                break
            now = time.monotonic()
            if cell.reason is None:
                if machine_id() != mid:
                    cell.interrupt("moved")
                elif out.gone():
                    cell.interrupt("gone")
                elif deadline is not None and now > deadline:
                    cell.interrupt("timeout")
            if cell.reason is not None:
                if cell.reason in ("restart", "removed"):
                    b.kill()
                elif first_sigint is None:
                    first_sigint = last_sigint = now
                    b.interrupt()
                elif now - first_sigint > INTERRUPT_GIVE_UP:
                    log("context %s: the cell went on %ds after SIGINT; killing its interpreter", ctx.id, INTERRUPT_GIVE_UP)
                    b.kill()
                elif now - last_sigint > INTERRUPT_AGAIN:
                    last_sigint = now
                    b.interrupt()
        if not died:
            try:
                b.finish()
            except Exception as e:
                log("finish a cell in %s: %s", ctx.id, e)
                died = not b.alive()
    finally:
        ctx.cell = None
        with ctx.lock:
            if ctx.backend is b:
                ctx.state = "dead" if (died or not b.alive()) else "idle"
    if cell.reason == "moved":
        raise Gone()
    if died:
        why = {
            "restart": "the context was restarted while the cell ran",
            "removed": "the context was removed while the cell ran",
        }.get(cell.reason, "the %s interpreter died while running the cell: restart the context" % ctx.language)
        error = {"type": "error", "name": "KernelDied", "value": why, "traceback": ""}
    elif cell.reason in ERROR_TEXT and (error is not None or (status not in (None, 0))):
        name, value = ERROR_TEXT[cell.reason]
        if "%d" in value:
            value = value % (timeout_ms or 0)
        error = {"type": "error", "name": name, "value": value, "traceback": error["traceback"] if error else ""}
    elif error is None and status not in (None, 0):
        error = {"type": "error", "name": "ExitError", "value": "exit status %d" % status, "traceback": ""}
    if error is not None:
        out.send(error)
    if count is not None:
        out.send({"type": "number_of_executions", "execution_count": count})
    out.send({"type": "end_of_execution", "context_id": ctx.id, "duration_ms": int((time.monotonic() - arrived) * 1000)})


# --- HTTP ------------------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status
        self.msg = msg


def canonical(language):
    if not isinstance(language, str) or language.lower() not in LANGUAGES:
        raise BadRequest(400, "unknown language %s: %s" % (json.dumps(language), LANGUAGE_LIST))
    return LANGUAGES[language.lower()]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pandastack-code/1"
    timeout = WRITE_TIMEOUT
    code_server = None  # the Server

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body=None, text=None):
        if text is not None:
            data = (text + "\n").encode()
            ctype = "text/plain; charset=utf-8"
        elif body is not None:
            data = json.dumps(body).encode()
            ctype = "application/json"
        else:
            data = b""
            ctype = None
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def body(self):
        """The request's JSON body ({} if empty)."""
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            data = b""
            while True:
                size_line = self.rfile.readline(100)
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    self.close_connection = True
                    raise BadRequest(400, "bad chunked body")
                if size == 0:
                    while self.rfile.readline(1000) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                if len(data) + size > MAX_BODY:
                    self.close_connection = True
                    raise BadRequest(413, "request body larger than %d MiB" % (MAX_BODY >> 20))
                data += self.rfile.read(size)
                self.rfile.readline(10)
        else:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                raise BadRequest(400, "bad Content-Length")
            if n < 0 or n > MAX_BODY:
                self.close_connection = True
                raise BadRequest(413, "request body larger than %d MiB" % (MAX_BODY >> 20))
            data = self.rfile.read(n) if n else b""
        if not data.strip():
            return {}
        try:
            v = json.loads(data)
        except ValueError as e:
            raise BadRequest(400, "bad JSON: %s" % e)
        if not isinstance(v, dict):
            raise BadRequest(400, "bad JSON: the body must be an object")
        return v

    def route(self, method):
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        srv = self.code_server
        try:
            if parts == ["health"]:
                self.need(method, "GET", "HEAD")
                if srv.ready:
                    return self.reply(200, {"status": "ok"})
                if srv.failed:
                    return self.reply(503, {"status": "failed", "error": srv.failed})
                return self.reply(503, {"status": "starting"})
            if parts == ["execute"]:
                self.need(method, "POST")
                return self.execute()
            if parts == ["contexts"]:
                self.need(method, "GET", "POST")
                if method == "GET":
                    return self.reply(200, srv.list())
                return self.create_context()
            if len(parts) >= 2 and parts[0] == "contexts":
                cid = parts[1]
                ctx = srv.get(cid) if ID_RE.match(cid) else None
                if len(parts) == 2:
                    self.need(method, "DELETE")
                    self.body()
                    if ctx is None or not srv.remove(cid):
                        raise BadRequest(404, "context %s not found" % cid)
                    return self.reply(204)
                if len(parts) == 3 and parts[2] in ("restart", "interrupt"):
                    self.need(method, "POST")
                    self.body()
                    if ctx is None:
                        raise BadRequest(404, "context %s not found" % cid)
                    if parts[2] == "interrupt":
                        cell = ctx.cell
                        return self.reply(200, {"interrupted": bool(cell is not None and cell.interrupt("interrupt"))})
                    try:
                        restarted = srv.restart(ctx)
                    except Exception as e:
                        return self.reply(500, text="restart context %s: %s" % (cid, e))
                    if restarted is None:
                        raise BadRequest(404, "context %s not found" % cid)
                    return self.reply(200, restarted.describe())
            raise BadRequest(404, "not found: %s" % path)
        except BadRequest as e:
            self.reply(e.status, text=e.msg)
        except Gone:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True

    def need(self, method, *allowed):
        if method not in allowed:
            raise BadRequest(405, "method %s not allowed here (want %s)" % (method, " or ".join(allowed)))

    def create_context(self):
        req = self.body()
        lang = req.get("language")
        lang = "python" if lang is None else canonical(lang)
        cwd = req.get("cwd")
        if cwd is None or cwd == "":
            cwd = HOME
        if not isinstance(cwd, str) or "\x00" in cwd:
            raise BadRequest(400, "cwd must be a string")
        cwd = os.path.normpath(os.path.join(HOME, cwd))
        if not os.path.isdir(cwd):
            raise BadRequest(400, "cwd %s is not an existing directory" % cwd)
        try:
            ctx = self.code_server.create(lang, cwd)
        except Exception as e:
            return self.reply(500, text="start a %s context: %s" % (lang, e))
        self.reply(200, ctx.describe())

    def execute(self):
        arrived = time.monotonic()
        mid = machine_id()
        req = self.body()
        code = req.get("code")
        if not isinstance(code, str):
            raise BadRequest(400, "code must be a string")
        cid, lang = req.get("context_id"), req.get("language")
        if cid is not None and lang is not None:
            raise BadRequest(400, "give context_id or language, not both")
        if cid is not None and not isinstance(cid, str):
            raise BadRequest(400, "context_id must be a string")
        env = req.get("env_vars")
        if env is None:
            env = {}
        if not isinstance(env, dict):
            raise BadRequest(400, "env_vars must be an object of strings")
        for k, v in env.items():
            if not ENV_NAME_RE.match(k):
                raise BadRequest(400, "env_vars: %s is not a valid variable name" % json.dumps(k))
            if not isinstance(v, str) or "\x00" in v:
                raise BadRequest(400, "env_vars: the value of %s must be a string without NUL" % k)
        timeout_ms = req.get("timeout_ms")
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0):
            raise BadRequest(400, "timeout_ms must be a non-negative integer")
        if cid is not None:
            ctx = self.code_server.get(cid) if ID_RE.match(cid) else None
            if ctx is None:
                raise BadRequest(404, "context %s not found" % cid)
        else:
            lang = "python" if lang is None else canonical(lang)
            ctx = self.code_server.get(self.code_server.defaults[lang])
            if ctx is None:
                try:
                    ctx = self.code_server.default_context(lang)
                except Exception as e:
                    return self.reply(500, text="start the default %s context: %s" % (lang, e))
        w = ctx.fifo.enter()
        out = Stream(self)
        try:
            out.begin()
        except BaseException:
            ctx.fifo.leave(w)
            raise
        try:
            run_cell(self.code_server, ctx, w, code, env, timeout_ms or 0, out, arrived, mid)
        except Gone:
            self.close_connection = True
            return
        out.end()
        if out.broken:
            self.close_connection = True

    def do_GET(self):
        self.route("GET")

    def do_HEAD(self):
        self.route("HEAD")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def do_PUT(self):
        self.route("PUT")

    def do_PATCH(self):
        self.route("PATCH")


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def main():
    # Started in the background by a shell, this process may have SIGINT
    # and SIGQUIT ignored, and an ignored signal stays ignored through
    # exec: every interpreter and command started from here would ignore
    # ^C. A handler of our own is reset to the default in them. (The
    # interpreters run in sessions of their own: their interrupts do not
    # reach this process.)
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, lambda *_: None)
    srv = Server()
    Handler.code_server = srv
    httpd = HTTPServer(("0.0.0.0", PORT), Handler)
    log("listening on :%d", PORT)
    threading.Thread(target=srv.warm, daemon=True).start()
    httpd.serve_forever()


if __name__ == "__main__":
    main()
