"""Asyncio sandboxes: :class:`AsyncSandbox` and :class:`AsyncFilesystem`, the twins of
:class:`~pandastack.Sandbox` and :class:`~pandastack.Filesystem`.

Every method has the sync one's name, arguments, return type and exceptions,
and is a coroutine. The request bodies and the decoding of answers are the
sync module's functions; only the awaiting differs. Output callbacks
(``on_stdout``...) may be plain or ``async`` functions. One addition with no
sync twin: :meth:`AsyncSandbox.exec_stream`, a command's output as an async
iterator.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import IO, Any, AsyncIterator, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, Union, overload

from ._command import Output
from .code_interpreter import (
    CodeContext,
    CodeRun,
    ContextArg,
    Execution,
    ResultCallback,
    code_body,
    code_context,
    code_contexts,
    code_wait,
    context_body,
    context_id,
    interrupt_body,
    interrupted,
)
from .async_client import AsyncClient, AsyncStreamResponse, _AsyncLines, _call, resolve_async_client
from .async_processes import AsyncCommands, AsyncPty
from .client import _create_event, _is_ndjson, _long, quote_segment
from .errors import NotFoundError, PandaConnectionError, PandaError
from .filesystem import WatchEvent, WriteData, _discard, _watch_event, _entries, _Files, _remove_query, _watch_request, _write_query
from .models import ExecResult, FileInfo, NetworkPolicy, Port, SandboxInfo, SignedURL
from .sandbox import (
    Command,
    NetworkArg,
    OutputCallback,
    PlacementArg,
    _create_body,
    _Described,
    _exec_body,
    _exec_cut_message,
    _exec_event,
    _exec_wait,
    _fork_body,
    _fork_count,
    _fork_result,
    _list_query,
    _resume_body,
    _sandboxes,
    _set_network_body,
    _signed_url,
    _snapshot_body,
    _url_body,
)
from .snapshot import AsyncSnapshot, Snapshot
from .volume import VolumesArg

__all__ = ["AsyncSandbox", "AsyncFilesystem", "AsyncExecStream"]

_COPY_CHUNK = 1 << 20


class _Creating:
    """What :meth:`AsyncSandbox.create` returns: await it for the sandbox, or
    use it in ``async with`` (the sandbox is killed at the end of the block)."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._sb: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._make().__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sb = await self._make()
        return self._sb

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(exc_type, exc, tb)


class AsyncSandbox(_Described):
    """A microVM sandbox, asyncio flavour. Get one from :meth:`create`, :meth:`connect` or :meth:`list`.

    Example::

        from pandastack import AsyncSandbox

        async with AsyncSandbox.create(template="tiny", ttl_seconds=600) as sb:
            print((await sb.exec("uname -a")).stdout)
    """

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        self._info = info
        self._client = client
        self.filesystem: AsyncFilesystem = AsyncFilesystem(self)
        self.commands: AsyncCommands = AsyncCommands(self)
        self.pty: AsyncPty = AsyncPty(self)

    # -- constructors ------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        ttl_seconds: Optional[int] = 3600,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        snapshot: Union[str, Snapshot, AsyncSnapshot, None] = None,
        network: Optional[NetworkArg] = None,
        on_expire: Optional[str] = None,
        placement: PlacementArg = None,
        volumes: Optional[VolumesArg] = None,
        client: Optional[AsyncClient] = None,
        on_progress: Optional[Callable[[str], Any]] = None,
    ) -> _Creating:
        """Create a sandbox: ``sb = await AsyncSandbox.create(...)``, or ``async with AsyncSandbox.create(...) as sb:``.

        Arguments and errors are :meth:`Sandbox.create`'s (``on_progress`` may
        be a plain or an async function). The arguments are
        checked when the call is awaited (or the block entered). Cancelling
        the awaiting task closes the connection; the server abandons a create
        still under way, but one that had just finished leaves a running
        sandbox, found with :meth:`list` (``metadata``) and expiring at its TTL.
        """

        async def make() -> "AsyncSandbox":
            c = resolve_async_client(client, api_key, api_url)
            body = _create_body(template, snapshot, ttl_seconds, memory_mib, vcpus, metadata, env, network, on_expire, placement, volumes)
            if on_progress is None:
                data = await c.request_json("POST", "/v1/sandboxes", json_body=body, timeout=_long(c.timeout))
                return cls(SandboxInfo.from_dict(data or {}), c)
            async with await c.stream("POST", "/v1/sandboxes", query={"progress": "1"}, json_body=body, timeout=_long(c.timeout)) as resp:
                if not _is_ndjson(resp.headers):
                    return cls(SandboxInfo.from_dict(json.loads(b"".join([ch async for ch in resp.iter_chunks()]) or b"{}")), c)
                async for ev in resp.iter_ndjson():
                    progress, done = _create_event(ev)
                    if progress is not None:
                        await _call(on_progress, progress)
                    elif done is not None:
                        return cls(SandboxInfo.from_dict(done), c)
            raise PandaConnectionError("the create stream ended before the sandbox was created")

        return _Creating(make)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSandbox":
        """Attach to an existing sandbox by id; :class:`NotFoundError` if it does not exist or is another key's."""
        c = resolve_async_client(client, api_key, api_url)
        data = await c.request_json("GET", "/v1/sandboxes/%s" % quote_segment(sandbox_id))
        return cls(SandboxInfo.from_dict(data or {}), c)

    @classmethod
    async def list(
        cls,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        client: Optional[AsyncClient] = None,
    ) -> "List[AsyncSandbox]":
        """List your sandboxes, oldest first (see :meth:`Sandbox.list`)."""
        c = resolve_async_client(client, api_key, api_url)
        return _sandboxes(cls, c, await c.request_json("GET", "/v1/sandboxes", query=_list_query(state, metadata)))

    # -- properties (id, info, state and network: _Described's) ---------------

    @property
    def client(self) -> AsyncClient:
        """The client this sandbox's requests go through."""
        return self._client

    # -- lifecycle -------------------------------------------------------------

    async def refresh(self) -> SandboxInfo:
        """Re-read the sandbox from the server, update :attr:`info` and return it."""
        return self._update(await self._client.request_json("GET", self._path("")))

    async def set_ttl(self, seconds: int) -> SandboxInfo:
        """Set the time to live to ``seconds`` from now; updates and returns :attr:`info`."""
        return self._update(await self._client.request_json("PUT", self._path("/ttl"), json_body={"ttl_seconds": seconds}))

    async def set_network(
        self,
        *,
        internet: Optional[bool] = None,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
    ) -> Optional[NetworkPolicy]:
        """Change the sandbox's egress policy (see :meth:`Sandbox.set_network`)."""
        body = _set_network_body(internet, allow_out, deny_out)
        self._update(await self._client.request_json("PATCH", self._path("/network"), json_body=body))
        return self._info.network

    async def kill(self) -> None:
        """Kill the sandbox. Killing an already killed or expired sandbox is not an error."""
        try:
            await self._client.request("DELETE", self._path(""))
        except NotFoundError:
            pass

    async def pause(self) -> SandboxInfo:
        """Pause the sandbox to the server's disk (see :meth:`Sandbox.pause`)."""
        return self._update(await self._client.request_json("POST", self._path("/pause"), json_body={}, timeout=_long(self._client.timeout)))

    async def resume(self, *, placement: PlacementArg = None) -> SandboxInfo:
        """Resume a paused sandbox where it was (see :meth:`Sandbox.resume`)."""
        return self._update(
            await self._client.request_json("POST", self._path("/resume"), json_body=_resume_body(placement), timeout=_long(self._client.timeout))
        )

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.kill()
            return
        # Do not hide the exception that ended the block behind a kill failure.
        try:
            await self.kill()
        except PandaError:
            pass

    # -- fork and snapshot ---------------------------------------------------

    @overload
    async def fork(self, count: None = None, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "AsyncSandbox": ...

    @overload
    async def fork(self, count: int, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "List[AsyncSandbox]": ...

    async def fork(self, count: Optional[int] = None, placement: PlacementArg = None, *, volumes: Optional[str] = None) -> "Union[AsyncSandbox, List[AsyncSandbox]]":
        """Fork this running sandbox into live copies (see :meth:`Sandbox.fork`): one without ``count``, else a list; :class:`ForkError` on partial failure."""
        n = _fork_count(count)
        body = _fork_body(n, placement, volumes)
        data = await self._client.request_json("POST", self._path("/fork"), json_body=body, timeout=_long(self._client.timeout))
        return _fork_result(self.id, AsyncSandbox, self._client, data, count, n)  # type: ignore[no-any-return]

    async def snapshot(self, name: Optional[str] = None) -> AsyncSnapshot:
        """Save this sandbox as an :class:`AsyncSnapshot`; the sandbox keeps running."""
        data = await self._client.request_json("POST", self._path("/snapshots"), json_body=_snapshot_body(name), timeout=_long(self._client.timeout))
        return AsyncSnapshot(data or {}, self._client)

    # -- exec ----------------------------------------------------------------

    async def exec(
        self,
        cmd: Command,
        timeout_seconds: Optional[float] = 60,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        user: Optional[str] = None,
    ) -> ExecResult:
        """Run a command and wait for it to end (see :meth:`Sandbox.exec`); callbacks may be plain or async.

        Cancelling the awaiting task closes the connection, and the server
        kills the command.
        """
        body = _exec_body(cmd, timeout_seconds, env, cwd, stdin, user)
        wait = _exec_wait(self._client.timeout, timeout_seconds)
        if on_stdout is None and on_stderr is None:
            data = await self._client.request_json("POST", self._path("/exec"), json_body=body, timeout=wait)
            return ExecResult.from_dict(data or {})
        stream = AsyncExecStream(self, body, wait)
        async with stream:
            async for kind, text in stream:
                cb = on_stdout if kind == "stdout" else on_stderr
                if cb is not None and text:
                    await _call(cb, text)
        assert stream.result is not None
        return stream.result

    def exec_stream(
        self,
        cmd: Command,
        timeout_seconds: Optional[float] = 60,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        user: Optional[str] = None,
    ) -> "AsyncExecStream":
        """Run a command and iterate over its output as it is produced (no sync twin).

        ``async for kind, text in sb.exec_stream(cmd)`` yields
        ``("stdout", text)`` and ``("stderr", text)``; when the loop ends the
        command has exited and the stream's ``result`` is its
        :class:`ExecResult` (with the whole output). Leaving the loop early
        (``break``, an exception, cancellation) closes the stream, which kills
        the command; use ``async with sb.exec_stream(...) as s:`` to make that
        immediate. Arguments as :meth:`exec`.

        Example::

            s = sb.exec_stream("pip install -r requirements.txt", timeout_seconds=600)
            async for kind, text in s:
                print(kind, text, end="")
            print("exit", s.result.exit_code)
        """
        body = _exec_body(cmd, timeout_seconds, env, cwd, stdin, user)
        return AsyncExecStream(self, body, _exec_wait(self._client.timeout, timeout_seconds))

    # -- code interpreter ----------------------------------------------------

    async def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: Optional[ContextArg] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_result: Optional[ResultCallback] = None,
        envs: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Execution:
        """Run a cell of code in a live interpreter of the sandbox (see :meth:`Sandbox.run_code`); callbacks may be plain or async.

        Cancelling the awaiting task closes the connection, which interrupts the cell.
        """
        body = code_body(code, language, context, envs, timeout)
        run = CodeRun(self.id, on_stdout, on_stderr, on_result)
        wait = code_wait(self._client.timeout, body)
        async with await self._client.stream("POST", self._path("/code"), json_body=body, timeout=wait, headers={"Accept": "application/x-ndjson"}) as resp:
            events = resp.iter_ndjson()
            try:
                while True:
                    try:
                        ev = await events.__anext__()
                    except StopAsyncIteration:
                        break
                    except ValueError as e:
                        raise run.malformed_line(e) from e
                    call = run.add(ev)
                    if call is not None:
                        await _call(call[0], call[1])
                    if run.done:
                        return run.execution()
            finally:
                await events.aclose()  # type: ignore[attr-defined]
        return run.unfinished()

    async def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> CodeContext:
        """Start a new interpreter (context) with its own state (see :meth:`Sandbox.create_code_context`)."""
        body = context_body(language, cwd)
        return code_context(await self._client.request_json("POST", self._path("/code/contexts"), json_body=body, timeout=_long(self._client.timeout)))

    async def list_code_contexts(self) -> List[CodeContext]:
        """The sandbox's contexts, the default ones included."""
        return code_contexts(await self._client.request_json("GET", self._path("/code/contexts")))

    async def restart_code_context(self, context: ContextArg) -> CodeContext:
        """Replace the context's interpreter with a fresh one (see :meth:`Sandbox.restart_code_context`)."""
        path = self._path("/code/contexts/%s/restart" % quote_segment(context_id(context)))
        return code_context(await self._client.request_json("POST", path, timeout=_long(self._client.timeout)))

    async def remove_code_context(self, context: ContextArg) -> None:
        """Stop the context's interpreter and forget it (see :meth:`Sandbox.remove_code_context`)."""
        await self._client.request("DELETE", self._path("/code/contexts/%s" % quote_segment(context_id(context))))

    async def interrupt_code(self, context: Optional[ContextArg] = None) -> bool:
        """Interrupt the cell running in ``context`` (default: Python's default context); whether one was running."""
        return interrupted(await self._client.request_json("POST", self._path("/code/interrupt"), json_body=interrupt_body(context)))

    # -- ports -----------------------------------------------------------------

    async def ports(self) -> "List[Port]":
        """List the TCP ports listening in the running sandbox, sorted by port."""
        data = await self._client.request_json("GET", self._path("/ports")) or {}
        return [Port.from_dict(p) for p in data.get("ports") or [] if isinstance(p, Mapping)]

    async def get_url(self, port: int, ttl_seconds: Optional[int] = None) -> SignedURL:
        """Sign a URL that reaches ``port`` of this sandbox without an API key (see :meth:`Sandbox.get_url`)."""
        body = _url_body(port, ttl_seconds)
        data = await self._client.request_json("POST", self._path("/ports/%d/url" % port), json_body=body) or {}
        return _signed_url(data)

    # -- misc ------------------------------------------------------------------

    def __repr__(self) -> str:
        return "AsyncSandbox(id=%r, template=%r, state=%r)" % (self.id, self._info.template, self._info.state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncSandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Sandbox", self.id))


class AsyncExecStream:
    """The output of a running command (:meth:`AsyncSandbox.exec_stream`): an async iterator of ``(kind, text)``.

    After the iteration ends, :attr:`result` is the command's :class:`ExecResult`.
    The request is sent on the first iteration.
    """

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], wait: float) -> None:
        self._sb = sandbox
        self._body = body
        self._wait = wait
        self._resp: Optional[AsyncStreamResponse] = None
        self._events: Optional[AsyncIterator[Any]] = None
        self._got = Output()
        self._finished = False
        #: The command's :class:`ExecResult` once the iteration has ended.
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> Tuple[str, str]:
        if self._finished:
            raise StopAsyncIteration
        try:
            if self._resp is None:
                self._resp = await self._sb._client.stream(
                    "POST", self._sb._path("/exec/stream"), json_body=self._body, timeout=self._wait, headers={"Accept": "application/x-ndjson"}
                )
                self._events = self._resp.iter_ndjson()
            assert self._events is not None
            while True:
                try:
                    ev = await self._events.__anext__()
                except StopAsyncIteration:
                    raise PandaConnectionError(_exec_cut_message(self._sb.id)) from None
                kind, text = _exec_event(ev)
                if kind == "exit":
                    self.result = self._got.result(ExecResult.from_dict(ev))
                    await self.aclose()
                    raise StopAsyncIteration
                if kind is not None:
                    self._got.add(kind, text)
                    return kind, text
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the stream; a command still running is killed."""
        self._finished = True
        resp, self._resp = self._resp, None
        self._events = None
        if resp is not None:
            await resp.close()

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # An abandoned iteration: close the socket so the server kills the command.
        resp = self._resp
        if resp is not None and resp._resp is not None:
            resp._resp.conn.close()


class AsyncFilesystem(_Files):
    """Files of a sandbox, asyncio flavour: ``sandbox.filesystem``. See :class:`~pandastack.Filesystem`.

    Local files (a file-like or path to upload, a path to download to) are
    read and written in the event loop's default executor.
    """

    _sb: AsyncSandbox

    async def write(self, path: str, data: WriteData, mode: Union[int, str, None] = None) -> FileInfo:
        """Write a file, replacing it; parent directories are created. See :meth:`Filesystem.write`."""
        query = _write_query(path, mode)
        client = self._sb._client
        if isinstance(data, os.PathLike):
            loop = asyncio.get_running_loop()
            f = await loop.run_in_executor(None, open, os.fspath(data), "rb")
            try:
                body = await client.request_json("PUT", self._path(), query=query, body=f)
            finally:
                f.close()
        else:
            body = await client.request_json("PUT", self._path(), query=query, body=data)
        return FileInfo.from_dict(body or {})

    async def read(self, path: str) -> bytes:
        """Return the contents of a file as bytes."""
        _, _, data = await self._sb._client.request("GET", self._path(), query={"path": path})
        return data

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Return the contents of a file decoded as text (UTF-8 by default)."""
        return (await self.read(path)).decode(encoding, errors)

    async def download(self, path: str, dest: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Stream a file to ``dest`` (a local path, written as ``<dest>.part`` then renamed, or a binary file-like object); return the number of bytes."""
        client = self._sb._client
        loop = asyncio.get_running_loop()
        async with await client.stream("GET", self._path(), query={"path": path}) as resp:
            if hasattr(dest, "write"):
                n = 0
                async for chunk in resp.iter_chunks(_COPY_CHUNK):
                    dest.write(chunk)  # type: ignore[union-attr]
                    n += len(chunk)
                return n
            target = os.fspath(dest)  # type: ignore[arg-type]
            part = target + ".part"
            try:
                f = await loop.run_in_executor(None, open, part, "wb")
                try:
                    n = 0
                    async for chunk in resp.iter_chunks(_COPY_CHUNK):
                        await loop.run_in_executor(None, f.write, chunk)
                        n += len(chunk)
                finally:
                    f.close()
                await loop.run_in_executor(None, os.replace, part, target)
                return n
            except BaseException:
                _discard(part)
                raise

    async def watch_dir(self, path: str, recursive: bool = False) -> "AsyncDirWatch":
        """Watch a directory (see :meth:`Filesystem.watch_dir`): returns once
        the watch is in place; ``async for ev in w`` yields :class:`WatchEvent`
        objects until ``await w.stop()`` or the directory is removed."""
        return AsyncDirWatch(await self._sb._client.stream("GET", self._sb._path("/watch"), **_watch_request(path, recursive)))

    async def list(self, path: str) -> List[FileInfo]:
        """List a directory's entries, sorted by name."""
        return _entries(await self._sb._client.request_json("GET", self._path("/list"), query={"path": path}))

    async def stat(self, path: str) -> FileInfo:
        """Describe a file or directory (a final symlink is not followed)."""
        return FileInfo.from_dict(await self._sb._client.request_json("GET", self._path("/stat"), query={"path": path}) or {})

    async def exists(self, path: str) -> bool:
        """Report whether ``path`` exists (a dangling symlink exists); an unknown sandbox raises :class:`NotFoundError`."""
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            await self._sb._client.request("GET", self._sb._path(""))
            return False

    async def mkdir(self, path: str) -> FileInfo:
        """Create a directory and its missing parents (like ``mkdir -p``)."""
        return FileInfo.from_dict(await self._sb._client.request_json("POST", self._path("/mkdir"), json_body={"path": path}) or {})

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file or an empty directory; ``recursive=True`` removes a directory and everything in it."""
        await self._sb._client.request("DELETE", self._path(), query=_remove_query(path, recursive))

    async def rename(self, src: str, dst: str) -> FileInfo:
        """Rename or move ``src`` to ``dst``; return the file at its new path."""
        body = await self._sb._client.request_json("POST", self._path("/rename"), json_body={"from": src, "to": dst})
        return FileInfo.from_dict(body or {})


class AsyncDirWatch(_AsyncLines):
    """A running directory watch (:meth:`AsyncFilesystem.watch_dir`): an
    async iterator of :class:`WatchEvent`; ``await stop()`` ends it (also
    ``async with``)."""

    def __init__(self, resp: AsyncStreamResponse) -> None:
        super().__init__(resp, _watch_event)

    async def __anext__(self) -> WatchEvent:
        return await super().__anext__()

    async def stop(self) -> None:
        """End the watch (closes its connection; the sandbox stops watching)."""
        await self._stop()

    async def __aenter__(self) -> "AsyncDirWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
