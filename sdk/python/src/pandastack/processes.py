"""Background processes and terminals: ``sb.commands`` and ``sb.pty``.

A background process runs in the sandbox on its own, whether or not anyone
follows its output (``/v1/sandboxes/{id}/processes``). The sandbox keeps the
last 1 MiB of each of its stdout and stderr, so :meth:`CommandHandle.output`
and :meth:`CommandHandle.wait` can start late, from another client, or from
another :class:`~pandastack.Sandbox` object (:meth:`Commands.connect`).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Union

from . import errors as _errors
from ._command import Output, command_body
from .errors import ConflictError, PandaConnectionError, PandaError, RequestTimeoutError
from .models import ExecResult, parse_time

if TYPE_CHECKING:  # pragma: no cover
    from .events import CommandRecord
    from .sandbox import Command, OutputCallback, Sandbox

__all__ = ["Commands", "CommandHandle", "OutputChunk", "OutputStream", "ProcessInfo", "Pty", "TerminalHandle"]

# The server takes at most this much stdin per request.
_STDIN_CHUNK = 1 << 20

# What sb.pty.create runs without cmd: what `panda shell` runs.
LOGIN_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -i; else exec /bin/sh -l; fi"


@dataclass(frozen=True)
class ProcessInfo:
    """A background process as the server describes it.

    Attributes:
        pid: Its process id in the sandbox.
        cmd: Its command line (argv joined for an argv command).
        state: ``"running"`` or ``"exited"``.
        started_at, ended_at: When it started and exited (``None`` while it runs).
        exit_code: ``None`` while it runs; 128+N when killed by signal N.
        signal: Name of the signal that killed it (``"SIGKILL"``), or ``None``.
        timed_out: It was killed because its ``timeout_seconds`` ran out.
        stdin_open: Its stdin pipe is open for :meth:`CommandHandle.send_stdin`.
        pty: ``{"rows": R, "cols": C}`` for a process on a terminal, else ``None``.
        stdout_bytes, stderr_bytes: Bytes written in all to each stream, of
            which the first ``stdout_dropped``/``stderr_dropped`` are no longer kept.
        raw: The JSON object as received.
    """

    pid: int
    cmd: str
    state: str
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    timed_out: bool = False
    stdin_open: bool = False
    pty: Optional[Dict[str, int]] = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        pty = d.get("pty")
        return cls(
            pid=int(d.get("pid") or 0),
            cmd=str(d.get("cmd") or ""),
            state=str(d.get("state") or ""),
            started_at=parse_time(d.get("started_at")),
            ended_at=parse_time(d.get("ended_at")),
            exit_code=None if d.get("exit_code") is None else int(d["exit_code"]),
            signal=d.get("signal") or None,
            timed_out=bool(d.get("timed_out", False)),
            stdin_open=bool(d.get("stdin_open", False)),
            pty=dict(pty) if isinstance(pty, Mapping) else None,
            stdout_bytes=int(d.get("stdout_bytes") or 0),
            stderr_bytes=int(d.get("stderr_bytes") or 0),
            stdout_dropped=int(d.get("stdout_dropped") or 0),
            stderr_dropped=int(d.get("stderr_dropped") or 0),
            raw=dict(d),
        )


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a background process's output.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"`` (a terminal's output is all stdout).
        data: The text (invalid UTF-8 replaced by U+FFFD); empty for a gap.
        offset: Byte offset of ``data`` in the stream's whole output.
        dropped: When positive, that many bytes before ``offset`` were asked
            for but are no longer kept (``data`` is then empty).
    """

    stream: str
    data: str
    offset: int = 0
    dropped: int = 0


class OutputStream:
    """Following a process's output (:meth:`CommandHandle.output`): an
    iterator of :class:`OutputChunk` for one thread, ending when the process
    exits; then :attr:`result` says how (an :class:`ExecResult` without
    output). :meth:`stop` (from any thread) stops following; the process runs on.
    """

    def __init__(self, resp: Any, pid: int) -> None:
        self._resp = resp
        self._pid = pid
        self._events = resp.iter_ndjson()
        self._stopped = threading.Event()
        self._done = False
        #: How the process ended, once the iteration reached its exit; else ``None``.
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> Iterator[OutputChunk]:
        return self

    def __next__(self) -> OutputChunk:
        while True:
            if self._done:
                raise StopIteration
            try:
                ev = next(self._events)
            except StopIteration:
                self._finish()
                if self._stopped.is_set():
                    raise
                raise PandaConnectionError(_cut_message(self._pid)) from None
            except Exception:
                self._finish()
                if self._stopped.is_set():
                    raise StopIteration from None
                raise
            try:
                got = _output_event(ev)
            except PandaError:
                self._finish()
                raise
            if isinstance(got, OutputChunk):
                return got
            if isinstance(got, ExecResult):
                self.result = got
                self._finish()
                raise StopIteration

    def _finish(self) -> None:
        self._done = True
        self._resp.close()

    def stop(self) -> None:
        """Stop following; a blocked iteration ends. The process runs on."""
        self._stopped.set()
        sock = _socket_of(self._resp)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read
            except OSError:
                pass
        self._resp.close()

    def __enter__(self) -> "OutputStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _cut_message(pid: int) -> str:
    return "the output stream of process %d ended before its exit (server restarted or connection cut)" % pid


def _output_event(ev: Any) -> Union[OutputChunk, ExecResult, None]:
    """Decode one event of a process's output stream: an :class:`OutputChunk`,
    the :class:`ExecResult` (without output) of the ``exit`` event, or ``None``
    for an event to skip; an ``error`` event is raised."""
    if not isinstance(ev, Mapping):
        return None
    t = ev.get("type")
    if t in ("stdout", "stderr"):
        return OutputChunk(t, str(ev.get("data") or ""), int(ev.get("offset") or 0))
    if t == "dropped":
        return OutputChunk(str(ev.get("stream") or "stdout"), "", int(ev.get("offset") or 0), int(ev.get("bytes") or 0))
    if t == "exit":
        return ExecResult.from_dict(ev, stdout="", stderr="")
    if t == "error":
        raise _errors.error_from_body(ev.get("error") or {})
    # "start" and event types added later are skipped.
    return None


def _output_request(from_: Union[str, int]) -> Dict[str, Any]:
    """The keyword arguments of the output stream request, past method and path."""
    return {"query": {"from": _from_query(from_)}, "headers": {"Accept": "application/x-ndjson"}, "timeout": None}


def _stdin_requests(data: Union[str, bytes], close: bool) -> List[Any]:
    """``(body, query)`` of each stdin request writing ``data`` (at least one)."""
    if isinstance(data, str):
        b = data.encode("utf-8")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        b = bytes(data)
    else:
        raise TypeError("stdin data must be str or bytes, not %s" % type(data).__name__)
    reqs = []
    first = True
    while first or b:
        first = False
        piece, b = b[:_STDIN_CHUNK], b[_STDIN_CHUNK:]
        reqs.append((piece, {"close": "true"} if close and not b else None))
    return reqs


def _resize_body(rows: int, cols: int) -> Dict[str, Any]:
    return {"rows": rows, "cols": cols}


def _socket_of(resp: Any) -> Any:
    """The socket a StreamResponse reads from: its connection's, or, once the
    connection let go of it (an answer with ``Connection: close``), the response's own."""
    sock = getattr(getattr(resp, "_conn", None), "sock", None)
    if sock is None:
        raw = getattr(getattr(getattr(resp, "_resp", None), "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
    return sock


def _from_query(from_: Union[str, int]) -> str:
    if isinstance(from_, bool):
        raise TypeError("from_ must be 'start', 'now' or a byte offset, got %r" % (from_,))
    if isinstance(from_, int):
        if from_ < 0:
            raise ValueError("from_ must be a byte offset >= 0, got %d" % from_)
        return str(from_)
    if from_ in ("start", "now"):
        return from_
    raise ValueError("from_ must be 'start', 'now' or a byte offset, got %r" % (from_,))


class _Handle:
    """What :class:`CommandHandle` and its asyncio twin share: the address of
    a process (its sandbox and pid) and the last description of it."""

    _sb: Any

    def __init__(self, sandbox: Any, pid: int, info: Optional[ProcessInfo] = None) -> None:
        self._sb = sandbox
        self.pid = pid
        self._info = info

    def _path(self, suffix: str = "") -> str:
        return self._sb._path("/processes/%d%s" % (self.pid, suffix))

    @property
    def last_info(self) -> Optional[ProcessInfo]:
        """The process as of the last call that described it (not refreshed)."""
        return self._info

    def __repr__(self) -> str:
        return "%s(sandbox=%r, pid=%d)" % (type(self).__name__, self._sb.id, self.pid)


class CommandHandle(_Handle):
    """A background process in a sandbox (:meth:`Commands.run` with
    ``background=True``, :meth:`Commands.connect`). The handle is only an
    address: the process runs on whether it is kept, dropped or used from
    several threads or clients at once.
    """

    _sb: "Sandbox"

    def info(self) -> ProcessInfo:
        """The process as it is now. Raises :class:`NotFoundError` for an unknown (or forgotten) pid."""
        self._info = ProcessInfo.from_dict(self._sb._client.request_json("GET", self._path()) or {})
        return self._info

    def output(self, from_: Union[str, int] = "start") -> OutputStream:
        """Follow the output, from ``"start"`` (the earliest byte kept), ``"now"``
        or a byte offset, until the process exits (see :class:`OutputStream`).

        Example::

            for chunk in handle.output():
                print(chunk.stream, chunk.data, end="")
        """
        resp = self._sb._client.stream("GET", self._path("/output"), **_output_request(from_))
        return OutputStream(resp, self.pid)

    def wait(
        self,
        timeout: Optional[float] = None,
        on_stdout: Optional["OutputCallback"] = None,
        on_stderr: Optional["OutputCallback"] = None,
    ) -> ExecResult:
        """Wait until the process exits; return how, with its output kept from the start.

        Like :meth:`Sandbox.exec`, a non-zero exit, a signal or the
        process's own ``timeout_seconds`` running out is not an exception:
        check ``exit_code``, ``signal``, ``timed_out``. ``truncated`` is true
        when output older than the last 1 MiB of a stream was dropped.

        Args:
            timeout: Give up waiting after this many seconds, raising
                :class:`RequestTimeoutError` (the process runs on). ``None``: wait as long as it takes.
            on_stdout, on_stderr: Called with each chunk as it comes (``str``).
        """
        got = Output(on_stdout, on_stderr)
        stream = self.output("start")
        timer: Optional[threading.Timer] = None
        expired = threading.Event()
        if timeout is not None:

            def expire() -> None:
                expired.set()
                stream.stop()

            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()
        try:
            for c in stream:
                cb = got.add(c.stream, c.data, c.dropped)
                if cb is not None:
                    cb(c.data)
        finally:
            if timer is not None:
                timer.cancel()
            stream.stop()
        if stream.result is None and expired.is_set():
            raise _wait_timed_out(self, timeout)  # type: ignore[arg-type]
        return _waited(self, got, stream.result)

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> None:
        """Write ``data`` (str as UTF-8) to the process's stdin; ``close`` closes it after.

        Raises:
            ConflictError: the process has exited or its stdin is closed.
            InvalidArgumentError: it was started without ``stdin=True``.
        """
        for piece, query in _stdin_requests(data, close):
            self._sb._client.request("POST", self._path("/stdin"), query=query, body=piece)

    def close_stdin(self) -> None:
        """Close the process's stdin (it reads end of file)."""
        self.send_stdin(b"", close=True)

    def signal(self, name: str) -> None:
        """Send a signal by name (``"TERM"``, ``"INT"``, ``"KILL"``, ``"HUP"``...) to the process's group.

        Raises:
            ConflictError: the process has exited.
            InvalidArgumentError: an unknown signal.
        """
        self._sb._client.request("POST", self._path("/signal"), json_body={"signal": name})

    def kill(self) -> bool:
        """SIGKILL the process's group. ``True`` if it was running, ``False`` if it had exited.

        The process stays listed with its output (``wait`` shows ``signal ==
        "SIGKILL"``) until :meth:`remove`.
        """
        try:
            self.signal("KILL")
        except ConflictError:
            return False
        return True

    def remove(self) -> None:
        """SIGKILL the process if it runs and make the server forget it and its output."""
        self._sb._client.request("DELETE", self._path())


class TerminalHandle(CommandHandle):
    """A process on a pseudo-terminal (:meth:`Pty.create`). Its output, with
    the terminal's echo and CRLFs, is all ``stdout``."""

    def send_input(self, data: Union[str, bytes]) -> None:
        """Send keystrokes (``"ls\\r"``; ``"\\x03"`` is Ctrl-C, ``"\\x04"`` end of file)."""
        self.send_stdin(data)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (1 to 1000 each; the process gets SIGWINCH)."""
        self._sb._client.request("POST", self._path("/resize"), json_body=_resize_body(rows, cols))


def _wait_timed_out(h: _Handle, timeout: float) -> RequestTimeoutError:
    return RequestTimeoutError("process %d in sandbox %s did not exit within %gs" % (h.pid, h._sb.id, timeout))


def _waited(h: _Handle, got: Output, end: Optional[ExecResult]) -> ExecResult:
    """What ``wait`` returns once the output stream of ``h`` ended: ``end`` with the output ``got``."""
    if end is None:
        raise PandaConnectionError("the output stream of process %d ended before its exit" % h.pid)
    return got.result(end)


def _run_args(
    background: bool,
    cmd: "Command",
    stdin: Union[bool, str, bytes, None],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    timeout_seconds: Optional[float],
    on_stdout: Any,
    on_stderr: Any,
) -> Any:
    """What ``run`` sends: ``(keyword arguments of the exec, None)`` for the
    foreground; ``(body of POST /processes, stdin data to write and close or
    None)`` for the background."""
    if not background:
        if stdin is True:
            raise ValueError("stdin=True (an open stdin pipe) needs background=True")
        stdin = None if stdin is False else stdin
        return dict(cmd=cmd, timeout_seconds=timeout_seconds, env=env, cwd=cwd, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr, user=user), None
    if on_stdout is not None or on_stderr is not None:
        raise ValueError("on_stdout/on_stderr are for the foreground; follow a background command with handle.output() or handle.wait(on_stdout=...)")
    body = command_body(cmd, env, cwd, user, timeout_seconds)
    data: Optional[Union[str, bytes]] = None
    if stdin is True or isinstance(stdin, (str, bytes, bytearray)):
        body["stdin"] = True
        if stdin is not True:
            data = stdin  # type: ignore[assignment]
    elif stdin not in (None, False):
        raise TypeError("stdin must be a bool, str or bytes, not %s" % type(stdin).__name__)
    return body, data


def _pty_body(
    rows: int,
    cols: int,
    cmd: Optional["Command"],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    timeout_seconds: Optional[float],
) -> Dict[str, Any]:
    for n, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1000:
            raise ValueError("%s must be an integer from 1 to 1000, got %r" % (n, v))
    body = command_body(LOGIN_SHELL if cmd is None else cmd, env, cwd, user, timeout_seconds)
    body["pty"] = {"rows": rows, "cols": cols}
    return body


def _started(d: Any) -> ProcessInfo:
    """The started process of a ``POST /processes`` answer."""
    info = ProcessInfo.from_dict(d or {})
    if not info.pid:
        raise PandaError("the server's answer has no pid: %r" % (d,))
    return info


def _process_list(d: Any) -> List[ProcessInfo]:
    return [ProcessInfo.from_dict(p) for p in (d or {}).get("processes") or [] if isinstance(p, Mapping)]


def _check_pid(pid: Any) -> None:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError("pid must be an int, got %r" % (pid,))


class Commands:
    """Commands in a sandbox, in the foreground or the background (``sb.commands``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def run(
        self,
        cmd: "Command",
        background: bool = False,
        stdin: Union[bool, str, bytes, None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout_seconds: Optional[float] = None,
        on_stdout: Optional["OutputCallback"] = None,
        on_stderr: Optional["OutputCallback"] = None,
    ) -> Any:
        """Run a command: in the foreground (the default, :meth:`Sandbox.exec`,
        returning an :class:`ExecResult`) or in the background, returning a
        :class:`CommandHandle` once it runs.

        Args:
            cmd: A shell command line or an argv list, as for :meth:`Sandbox.exec`.
            background: Start it and return a handle at once.
            stdin: Foreground: text fed to stdin. Background: ``True`` keeps a
                stdin pipe open for :meth:`CommandHandle.send_stdin`; text or
                bytes are written and stdin closed; ``None``/``False``: no stdin.
            env, cwd, user: As for :meth:`Sandbox.exec`.
            timeout_seconds: Kill it after this long (``timed_out`` is then
                true). Foreground ``None``: the server's default, 60 s; background ``None`` or ``0``: no timeout.
            on_stdout, on_stderr: Foreground only: called with output as it comes.

        Example::

            h = sb.commands.run("python3 -m http.server 8000", background=True)
            print(h.pid, h.info().state)
        """
        args, data = _run_args(background, cmd, stdin, env, cwd, user, timeout_seconds, on_stdout, on_stderr)
        if not background:
            return self._sb.exec(**args)
        h = self._start(args, CommandHandle)
        if data is not None:
            h.send_stdin(data, close=True)
        return h

    def _start(self, body: Dict[str, Any], cls: type) -> Any:
        info = _started(self._sb._client.request_json("POST", self._sb._path("/processes"), json_body=body))
        return cls(self._sb, info.pid, info)

    def list(self) -> List[ProcessInfo]:
        """The sandbox's background processes, running and exited (the last 64 that exited are kept)."""
        return _process_list(self._sb._client.request_json("GET", self._sb._path("/processes")))

    def connect(self, pid: int) -> CommandHandle:
        """A handle on the background process ``pid`` (:class:`NotFoundError` if there is none).

        A process on a terminal gets a :class:`TerminalHandle`.
        """
        _check_pid(pid)
        h = CommandHandle(self._sb, pid)
        info = h.info()
        if info.pty is not None:
            return TerminalHandle(self._sb, pid, info)
        return h

    def kill(self, pid: int) -> bool:
        """SIGKILL the background process ``pid`` (see :meth:`CommandHandle.kill`)."""
        return CommandHandle(self._sb, pid).kill()

    def history(self) -> "List[CommandRecord]":
        """The last 100 commands run in the sandbox through the API (exec, background, terminals), oldest first.

        Also ``sb.commands()``. The server keeps them in memory: they are gone
        after it restarts and when the sandbox stops; a fork starts with none.
        Neither stdin nor env values are kept.
        """
        from .events import _command_records

        return _command_records(self._sb._client.request_json("GET", self._sb._path("/commands")))

    __call__ = history


class Pty:
    """Terminals in a sandbox (``sb.pty``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def create(
        self,
        rows: int = 24,
        cols: int = 80,
        cmd: Optional["Command"] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout_seconds: Optional[float] = None,
    ) -> TerminalHandle:
        """Start ``cmd`` (default an interactive bash after the login
        profiles, in which the sandbox's and ``env``'s variables win over the
        profiles; ``sh -l`` without bash) on a new ``rows`` x ``cols`` terminal.

        Example::

            term = sb.pty.create()
            term.send_input("echo hi; exit 3\\r")
            print(term.wait().exit_code)  # 3
        """
        body = _pty_body(rows, cols, cmd, env, cwd, user, timeout_seconds)
        return Commands(self._sb)._start(body, TerminalHandle)
