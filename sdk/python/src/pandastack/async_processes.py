"""Background processes and terminals, asyncio flavour: ``sb.commands`` and
``sb.pty`` of an :class:`~pandastack.AsyncSandbox`.

The twins of :mod:`pandastack.processes`: same names, arguments, return
types and exceptions, as coroutines. The request bodies and the decoding of
the output stream are that module's functions. Following output is
``async for chunk in handle.output()``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Mapping, Optional, Union

from ._command import Output
from .async_client import AsyncStreamResponse, _call
from .errors import ConflictError, PandaConnectionError, PandaError
from .models import ExecResult
from .processes import (
    OutputChunk,
    ProcessInfo,
    _check_pid,
    _cut_message,
    _from_query,
    _Handle,
    _output_event,
    _output_request,
    _process_list,
    _pty_body,
    _resize_body,
    _run_args,
    _started,
    _stdin_requests,
    _wait_timed_out,
    _waited,
)

if TYPE_CHECKING:  # pragma: no cover
    from .events import CommandRecord
    from .async_sandbox import AsyncSandbox
    from .sandbox import Command, OutputCallback

__all__ = ["AsyncCommands", "AsyncCommandHandle", "AsyncOutputStream", "AsyncPty", "AsyncTerminalHandle"]


class AsyncOutputStream:
    """Following a process's output (:meth:`AsyncCommandHandle.output`): an
    async iterator of :class:`OutputChunk`, ending when the process exits;
    then :attr:`result` says how (an :class:`ExecResult` without output).

    The request is sent on the first iteration. ``await stop()`` (or leaving
    ``async with``) stops following; the process runs on.
    """

    def __init__(self, handle: "AsyncCommandHandle", from_: Union[str, int]) -> None:
        self._handle = handle
        self._from = from_
        self._resp: Optional[AsyncStreamResponse] = None
        self._events: Optional[AsyncIterator[Any]] = None
        self._done = False
        self._stopped = False
        #: How the process ended, once the iteration reached its exit; else ``None``.
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "AsyncOutputStream":
        return self

    async def __anext__(self) -> OutputChunk:
        while True:
            if self._done:
                raise StopAsyncIteration
            try:
                if self._resp is None:
                    h = self._handle
                    self._resp = await h._sb._client.stream("GET", h._path("/output"), **_output_request(self._from))
                    self._events = self._resp.iter_ndjson()
                    if self._stopped:  # stopped while connecting
                        await self._finish()
                        raise StopAsyncIteration
                assert self._events is not None
                ev = await self._events.__anext__()
            except StopAsyncIteration:
                await self._finish()
                if self._stopped:
                    raise
                raise PandaConnectionError(_cut_message(self._handle.pid)) from None
            except Exception:
                await self._finish()
                if self._stopped:
                    raise StopAsyncIteration from None
                raise
            except BaseException:  # cancelled
                await self._finish()
                raise
            try:
                got = _output_event(ev)
            except PandaError:
                await self._finish()
                raise
            if isinstance(got, OutputChunk):
                return got
            if isinstance(got, ExecResult):
                self.result = got
                await self._finish()
                raise StopAsyncIteration

    async def _finish(self) -> None:
        self._done = True
        resp, self._resp = self._resp, None
        self._events = None
        if resp is not None:
            await resp.close()

    async def stop(self) -> None:
        """Stop following (an iteration waiting in another task ends). The process runs on."""
        self._stopped = True
        await self._finish()

    async def aclose(self) -> None:
        """Same as :meth:`stop`."""
        await self.stop()

    async def __aenter__(self) -> "AsyncOutputStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __del__(self) -> None:
        # An abandoned iteration: close the socket rather than leave it to the pool.
        resp = self._resp
        if resp is not None and resp._resp is not None:
            resp._resp.conn.close()


class AsyncCommandHandle(_Handle):
    """A background process in a sandbox, asyncio flavour (see :class:`~pandastack.CommandHandle`)."""

    _sb: "AsyncSandbox"

    async def info(self) -> ProcessInfo:
        """The process as it is now. Raises :class:`NotFoundError` for an unknown (or forgotten) pid."""
        self._info = ProcessInfo.from_dict(await self._sb._client.request_json("GET", self._path()) or {})
        return self._info

    def output(self, from_: Union[str, int] = "start") -> AsyncOutputStream:
        """Follow the output, from ``"start"``, ``"now"`` or a byte offset, until
        the process exits (see :class:`AsyncOutputStream`). Not a coroutine:
        the request goes out on the first iteration.

        Example::

            async for chunk in handle.output():
                print(chunk.stream, chunk.data, end="")
        """
        _from_query(from_)  # checked now
        return AsyncOutputStream(self, from_)

    async def wait(
        self,
        timeout: Optional[float] = None,
        on_stdout: Optional["OutputCallback"] = None,
        on_stderr: Optional["OutputCallback"] = None,
    ) -> ExecResult:
        """Wait until the process exits; return how, with its output kept from the start
        (see :meth:`CommandHandle.wait`). Callbacks may be plain or async.

        Raises:
            RequestTimeoutError: ``timeout`` seconds passed (the process runs on).
        """
        got = Output(on_stdout, on_stderr)
        stream = self.output("start")

        async def follow() -> None:
            async for c in stream:
                cb = got.add(c.stream, c.data, c.dropped)
                if cb is not None:
                    await _call(cb, c.data)

        try:
            if timeout is None:
                await follow()
            else:
                try:
                    await asyncio.wait_for(follow(), timeout)
                except asyncio.TimeoutError as e:
                    if isinstance(e, PandaError):
                        raise
                    raise _wait_timed_out(self, timeout) from None
        finally:
            await stream.stop()
        return _waited(self, got, stream.result)

    async def send_stdin(self, data: Union[str, bytes], close: bool = False) -> None:
        """Write ``data`` (str as UTF-8) to the process's stdin; ``close`` closes it after (see :meth:`CommandHandle.send_stdin`)."""
        for piece, query in _stdin_requests(data, close):
            await self._sb._client.request("POST", self._path("/stdin"), query=query, body=piece)

    async def close_stdin(self) -> None:
        """Close the process's stdin (it reads end of file)."""
        await self.send_stdin(b"", close=True)

    async def signal(self, name: str) -> None:
        """Send a signal by name (``"TERM"``, ``"KILL"``...) to the process's group."""
        await self._sb._client.request("POST", self._path("/signal"), json_body={"signal": name})

    async def kill(self) -> bool:
        """SIGKILL the process's group. ``True`` if it was running, ``False`` if it had exited."""
        try:
            await self.signal("KILL")
        except ConflictError:
            return False
        return True

    async def remove(self) -> None:
        """SIGKILL the process if it runs and make the server forget it and its output."""
        await self._sb._client.request("DELETE", self._path())


class AsyncTerminalHandle(AsyncCommandHandle):
    """A process on a pseudo-terminal (:meth:`AsyncPty.create`); its output is all ``stdout``."""

    async def send_input(self, data: Union[str, bytes]) -> None:
        """Send keystrokes (``"ls\\r"``; ``"\\x03"`` is Ctrl-C, ``"\\x04"`` end of file)."""
        await self.send_stdin(data)

    async def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (1 to 1000 each; the process gets SIGWINCH)."""
        await self._sb._client.request("POST", self._path("/resize"), json_body=_resize_body(rows, cols))


class AsyncCommands:
    """Commands in a sandbox, asyncio flavour (``sb.commands``; see :class:`~pandastack.Commands`)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def run(
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
        """Run a command in the foreground (:meth:`AsyncSandbox.exec`, an
        :class:`ExecResult`) or, with ``background=True``, start it and return
        an :class:`AsyncCommandHandle`. Arguments as :meth:`Commands.run`.

        Example::

            h = await sb.commands.run("python3 -m http.server 8000", background=True)
            print(h.pid, (await h.info()).state)
        """
        args, data = _run_args(background, cmd, stdin, env, cwd, user, timeout_seconds, on_stdout, on_stderr)
        if not background:
            return await self._sb.exec(**args)
        h = await self._start(args, AsyncCommandHandle)
        if data is not None:
            await h.send_stdin(data, close=True)
        return h

    async def _start(self, body: Dict[str, Any], cls: type) -> Any:
        info = _started(await self._sb._client.request_json("POST", self._sb._path("/processes"), json_body=body))
        return cls(self._sb, info.pid, info)

    async def list(self) -> List[ProcessInfo]:
        """The sandbox's background processes, running and exited."""
        return _process_list(await self._sb._client.request_json("GET", self._sb._path("/processes")))

    async def connect(self, pid: int) -> AsyncCommandHandle:
        """A handle on the background process ``pid`` (:class:`NotFoundError` if
        there is none); a process on a terminal gets an :class:`AsyncTerminalHandle`."""
        _check_pid(pid)
        h = AsyncCommandHandle(self._sb, pid)
        info = await h.info()
        if info.pty is not None:
            return AsyncTerminalHandle(self._sb, pid, info)
        return h

    async def kill(self, pid: int) -> bool:
        """SIGKILL the background process ``pid`` (see :meth:`AsyncCommandHandle.kill`)."""
        return await AsyncCommandHandle(self._sb, pid).kill()

    async def history(self) -> "List[CommandRecord]":
        """The sandbox's command history, oldest first (also ``await sb.commands()``); see :meth:`Commands.history`."""
        from .events import _command_records

        return _command_records(await self._sb._client.request_json("GET", self._sb._path("/commands")))

    __call__ = history


class AsyncPty:
    """Terminals in a sandbox, asyncio flavour (``sb.pty``; see :class:`~pandastack.Pty`)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def create(
        self,
        rows: int = 24,
        cols: int = 80,
        cmd: Optional["Command"] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout_seconds: Optional[float] = None,
    ) -> AsyncTerminalHandle:
        """Start ``cmd`` (default a login shell) on a new ``rows`` x ``cols`` terminal.

        Example::

            term = await sb.pty.create()
            await term.send_input("echo hi; exit 3\\r")
            print((await term.wait()).exit_code)  # 3
        """
        body = _pty_body(rows, cols, cmd, env, cwd, user, timeout_seconds)
        return await AsyncCommands(self._sb)._start(body, AsyncTerminalHandle)  # type: ignore[no-any-return]
