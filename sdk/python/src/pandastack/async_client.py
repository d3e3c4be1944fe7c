"""The asyncio client: :class:`AsyncClient` and its HTTP/1.1 transport.

Design: real non-blocking I/O. Each request runs on an
:func:`asyncio.open_connection` stream (TLS through :mod:`ssl` for ``https``
URLs) with a small HTTP/1.1 client written here: request line and headers,
``Content-Length`` or chunked request bodies, ``Content-Length``, chunked or
read-to-close response bodies, and a pool of idle keep-alive connections. A
thousand concurrent calls are a thousand sockets on one event loop, not a
thousand threads. Only two things run in the loop's default executor: reading
the chunks of a file-like upload body (``filesystem.write(path, f)``, a
Dockerfile build context) and writing downloaded chunks to a local file,
since a local file cannot be read without blocking.

What is not written twice: the request (target, headers, body encoding) comes
from the same code as :class:`~pandastack.Client`'s (``_Settings._prepare``),
answers are decoded by the same models, errors are mapped by the same
:mod:`pandastack.errors` functions and transport errors by the same
``_convert_exc``, so the two clients put the same bytes on the wire and raise
the same exceptions. An answer read whole is handled by the same
``_Settings._answer``, and the same ``_Retry`` rule resends, once on a fresh
connection, a request that met a connection the server had closed while idle
when that is safe (idempotent method, or nothing sent yet).

Timeouts are the sync client's: connect and each read wait ``timeout``
seconds (longer for exec, create, fork, snapshot, resume, pause); a read that
waits longer raises :class:`RequestTimeoutError`.

Cancellation: cancelling a task awaiting a call closes that call's connection
(it never goes back to the pool) and re-raises :class:`asyncio.CancelledError`.
The server sees the connection close: an exec stream's command is killed, a
create still under way is abandoned by the server (its record removed). A
create whose answer was already on its way is not undone: that sandbox runs
until its TTL; find it with ``AsyncSandbox.list(metadata=...)`` (give creates
you may cancel a metadata label) and kill it.

An :class:`AsyncClient` may be used from several event loops (one after the
other, as successive ``asyncio.run`` calls do, or at once from several
threads): pooled connections belong to the loop that opened them.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import ssl
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Tuple

from . import errors as _errors
from .client import (
    DEFAULT_TIMEOUT,
    Query,
    Timeout,
    _bake_body,
    _bake_event,
    _Body,
    _Defaults,
    _dockerfile_request,
    _error_of,
    _image_build_body,
    _key_body,
    _log_event,
    _long,
    _Retry,
    _Settings,
    quote_segment,
)
from ._buildcontext import ContextStats
from ._ndjson import NDJSONDecoder
from .errors import PandaConnectionError, PandaError
from .models import APIKey, Template

if TYPE_CHECKING:  # pragma: no cover
    from .events import AsyncEventStream
from .templates import TemplateBuild, TemplateBuildError

__all__ = ["AsyncClient", "AsyncStreamResponse", "AsyncBuildLogs", "resolve_async_client", "default_async_client"]

# Idle keep-alive connections kept per client (more are closed when released).
_MAX_IDLE = 64
# Longest status or header line accepted, and most header lines.
_LINE_LIMIT = 64 << 10
_MAX_HEADERS = 200
_STALE = (
    http.client.RemoteDisconnected,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)
_END = object()


class _Conn:
    """One HTTP/1.1 connection on the event loop that opened it."""

    __slots__ = ("reader", "writer", "loop")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = loop

    def dropped(self) -> bool:
        """Report whether the server closed this idle connection (or sent something unasked)."""
        r = self.reader
        return self.writer.is_closing() or r.at_eof() or r.exception() is not None or bool(getattr(r, "_buffer", b""))

    def close(self) -> None:
        if self.loop.is_closed():
            # Its loop cannot run the transport's close any more: close the
            # socket under it (best effort; private to asyncio's transports).
            t = self.writer.transport
            sock = getattr(t, "_sock", None)
            if sock is not None:
                sock.close()
                t._sock = None  # type: ignore[attr-defined]
            return
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport
            pass


async def _wait(aw: Any, timeout: Timeout) -> Any:
    if timeout is None:
        return await aw
    if _timeout_cm is not None:
        async with _timeout_cm(timeout):
            return await aw
    # Python < 3.11. Not wait_for: it swallows a cancellation that races with
    # the read completing, and the task then reads on. asyncio.wait does not;
    # a read result lost to a cancellation does not matter, since a
    # cancelled call closes its connection.
    fut = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({fut}, timeout=timeout)
    except BaseException:
        fut.cancel()
        raise
    if not done:
        fut.cancel()
        raise asyncio.TimeoutError()
    return fut.result()


_timeout_cm = getattr(asyncio, "timeout", None)  # Python 3.11+


class _Response:
    """A response whose head was read; the body is read with :meth:`read1` / :meth:`read`."""

    def __init__(self, conn: _Conn, status: int, reason: str, headers: http.client.HTTPMessage, version: str, method: str, timeout: Timeout) -> None:
        self.conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.timeout = timeout
        conn_hdr = (headers.get("Connection") or "").lower()
        self.will_close = "close" in conn_hdr or (version == "HTTP/1.0" and "keep-alive" not in conn_hdr)
        te = (headers.get("Transfer-Encoding") or "").lower()
        self._chunked = "chunked" in te
        self._left: Optional[int] = None  # bytes left of the body (length mode) or of the current chunk (chunked)
        self.done = False
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self.done = True
        elif self._chunked:
            self._left = 0
        else:
            cl = headers.get("Content-Length")
            if cl is not None:
                try:
                    self._left = int(cl)
                except ValueError:
                    raise http.client.HTTPException("bad Content-Length %r" % cl) from None
                if self._left <= 0:
                    self.done = True
            else:
                self.will_close = True  # the body runs to the end of the connection

    async def read1(self, size: int = 65536) -> bytes:
        """Return what is available (up to ``size`` bytes; ``b""`` at the end of the body)."""
        r = self.conn.reader
        while not self.done:
            if self._chunked:
                if self._left == 0:
                    line = await _wait(r.readline(), self.timeout)
                    if not line:
                        raise http.client.IncompleteRead(b"")
                    try:
                        n = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise http.client.HTTPException("bad chunk size line %r" % line[:40]) from None
                    if n == 0:
                        while True:  # trailers, up to the blank line
                            t = await _wait(r.readline(), self.timeout)
                            if t in (b"\r\n", b"\n", b""):
                                break
                        self.done = True
                        return b""
                    self._left = n
                data = await _wait(r.read(min(size, self._left or 0)), self.timeout)
                if not data:
                    raise http.client.IncompleteRead(b"")
                self._left = (self._left or 0) - len(data)
                if self._left == 0:
                    crlf = await _wait(r.readline(), self.timeout)
                    if crlf not in (b"\r\n", b"\n"):
                        raise http.client.HTTPException("chunk not followed by CRLF")
                return data
            if self._left is None:  # read to close
                data = await _wait(r.read(size), self.timeout)
                if not data:
                    self.done = True
                return data
            data = await _wait(r.read(min(size, self._left)), self.timeout)
            if not data:
                raise http.client.IncompleteRead(b"", self._left)
            self._left -= len(data)
            if self._left <= 0:
                self.done = True
            return data
        return b""

    async def read(self) -> bytes:
        out = bytearray()
        while True:
            chunk = await self.read1(1 << 20)
            if not chunk:
                return bytes(out)
            out += chunk


async def _read_head(conn: _Conn, method: str, timeout: Timeout) -> _Response:
    r = conn.reader
    while True:
        try:
            line = await _wait(r.readline(), timeout)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise http.client.BadStatusLine(str(e)) from e
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        parts = line.decode("iso-8859-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise http.client.BadStatusLine(line[:100].decode("iso-8859-1"))
        version, status, reason = parts[0], int(parts[1]), (parts[2] if len(parts) > 2 else "")
        raw = bytearray()
        for _ in range(_MAX_HEADERS + 1):
            h = await _wait(r.readline(), timeout)
            if not h:
                raise http.client.RemoteDisconnected("Remote end closed connection in the middle of the headers")
            if h in (b"\r\n", b"\n"):
                break
            raw += h
        else:
            raise http.client.HTTPException("more than %d headers" % _MAX_HEADERS)
        headers = http.client.parse_headers(io.BytesIO(bytes(raw) + b"\r\n"))
        if status == 100 or (100 < status < 200 and status != 101):
            continue  # an interim answer; the real one follows
        return _Response(conn, status, reason, headers, version, method, timeout)


class AsyncStreamResponse:
    """A 2xx response whose body is read incrementally. Close it (``await resp.close()``, or ``async with``).

    Closing before the body is fully read closes the connection, which tells
    the server to stop (for exec streams, to kill the command).
    """

    def __init__(self, client: "AsyncClient", resp: _Response) -> None:
        self._client = client
        self._resp: Optional[_Response] = resp
        self.status: int = resp.status
        self.headers = resp.headers

    async def read1(self, size: int = 65536) -> bytes:
        """Return what is available (up to ``size`` bytes, at least one unless the body ended)."""
        resp = self._resp
        if resp is None:
            return b""
        try:
            return await resp.read1(size)
        except BaseException as e:
            await self.close()
            if isinstance(e, Exception):
                raise self._client._convert(e) from e
            raise

    async def iter_chunks(self, size: int = 65536) -> AsyncIterator[bytes]:
        """Yield the body in chunks as they arrive."""
        while True:
            chunk = await self.read1(size)
            if not chunk:
                return
            yield chunk

    async def iter_ndjson(self) -> AsyncIterator[Any]:
        """Yield the JSON values of an NDJSON body as their lines arrive."""
        dec = NDJSONDecoder()
        async for chunk in self.iter_chunks():
            for v in dec.feed(chunk):
                yield v
        for v in dec.close():
            yield v

    async def close(self) -> None:
        """Release the connection: back to the pool if the body was fully read, else closed."""
        resp, self._resp = self._resp, None
        if resp is None:
            return
        if resp.done and not resp.will_close:
            self._client._release(resp.conn)
        else:
            resp.conn.close()

    async def __aenter__(self) -> "AsyncStreamResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _AsyncLines:
    """The items of an NDJSON stream, asyncio flavour of :class:`~pandastack.client._Lines`."""

    def __init__(self, resp: AsyncStreamResponse, parse: Callable[[Any], Any]) -> None:
        self._resp = resp
        self._parse = parse
        self._stopped = False
        self._lines: AsyncIterator[Any] = resp.iter_ndjson()

    def __aiter__(self) -> "_AsyncLines":
        return self

    async def __anext__(self) -> Any:
        while True:
            if self._stopped:
                raise StopAsyncIteration
            try:
                d = await self._lines.__anext__()
            except StopAsyncIteration:
                await self._resp.close()
                raise
            except Exception:
                if self._stopped:
                    raise StopAsyncIteration from None
                await self._resp.close()
                raise
            item = self._parse(d)
            if item is not None:
                return item

    async def _stop(self) -> None:
        self._stopped = True
        await self._resp.close()


class AsyncBuildLogs:
    """The lines of a template build's log: ``async for line in logs``; then ``logs.build`` is the final build.

    (An async generator cannot return a value, so this is what
    :meth:`Client.template_build_logs`'s generator return value becomes.)
    Close it early with ``await logs.aclose()`` (or ``async with``): the build goes on.
    """

    def __init__(self, client: "AsyncClient", build_id: str) -> None:
        self._client = client
        self._build_id = build_id
        self._resp: Optional[AsyncStreamResponse] = None
        self._events: Optional[AsyncIterator[Any]] = None
        self._finished = False
        #: The final :class:`TemplateBuild`, once the iteration has ended.
        self.build: Optional[TemplateBuild] = None

    def __aiter__(self) -> "AsyncBuildLogs":
        return self

    async def __anext__(self) -> str:
        if self._finished:
            raise StopAsyncIteration
        if self._resp is None:
            path = "/v1/templates/builds/%s/logs" % quote_segment(self._build_id)
            self._resp = await self._client.stream("GET", path, headers={"Accept": "application/x-ndjson"}, timeout=_long(self._client.timeout))
            self._events = self._resp.iter_ndjson()
        assert self._events is not None
        try:
            while True:
                try:
                    ev = await self._events.__anext__()
                except StopAsyncIteration:
                    raise PandaConnectionError("the log stream of template build %s ended before the build did" % self._build_id) from None
                line, build = _log_event(ev)
                if line is not None:
                    return line
                if build is not None:
                    self.build = build
                    self._finished = True
                    await self.aclose()
                    raise StopAsyncIteration
        except BaseException:
            if not self._finished:
                self._finished = True
                await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the stream (the build goes on)."""
        self._finished = True
        resp, self._resp = self._resp, None
        if resp is not None:
            await resp.close()

    async def __aenter__(self) -> "AsyncBuildLogs":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncClient(_Settings):
    """The asyncio twin of :class:`~pandastack.Client`: the same arguments and
    methods, coroutines instead of blocking calls (see the module docs for the
    design, timeouts and cancellation).

    Example::

        async with AsyncClient(api_key="pk_...") as client:
            sb = await AsyncSandbox.create(template="tiny", client=client)
    """

    def __init__(self, api_key: Optional[str] = None, api_url: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        super().__init__(api_key, api_url, timeout)
        self._idle_lock = threading.Lock()
        self._idle: List[_Conn] = []
        self._ssl: Optional[ssl.SSLContext] = None

    def __repr__(self) -> str:
        return "AsyncClient(api_url=%r, api_key=%s)" % (self.api_url, "set" if self.api_key else "unset")

    # -- public API: server-level endpoints ---------------------------------

    async def health(self) -> Dict[str, Any]:
        """Return ``GET /healthz``; needs no API key. See :meth:`Client.health`."""
        body = await self.request_json("GET", "/healthz", auth=False)
        return dict(body) if isinstance(body, Mapping) else {}

    async def events(self) -> "AsyncEventStream":
        """Open the stream of changes of this key's sandboxes and snapshots; see :meth:`Client.events`.

        Example::

            async with await client.events() as stream:
                async for ev in stream:
                    print(ev.seq, ev.type, ev.id)
        """
        from .events import AsyncEventStream

        return await AsyncEventStream._open(self)

    async def list_templates(self) -> List[Template]:
        """List templates and the state of their baked snapshots."""
        body = await self.request_json("GET", "/v1/templates")
        return [Template.from_dict(t) for t in body.get("templates") or []]

    async def bake_template(
        self,
        name: str,
        *,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        on_progress: Optional[Callable[[str], Any]] = None,
    ) -> Template:
        """Bake (or re-bake) template ``name``; admin keys only. ``on_progress`` may be a plain or an async function."""
        body = _bake_body(memory_mib, vcpus)
        async with await self.stream("POST", "/v1/templates/%s/bake" % quote_segment(name), json_body=body, timeout=_long(self.timeout)) as resp:
            async for ev in resp.iter_ndjson():
                progress, done = _bake_event(ev)
                if progress is not None and on_progress is not None:
                    await _call(on_progress, progress)
                elif done is not None:
                    return done
        raise PandaConnectionError("the bake stream of template %r ended before a result" % name)

    async def start_template_build(
        self,
        name: str,
        from_image: str,
        *,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[int] = None,
    ) -> TemplateBuild:
        """Start building template ``name`` from container image ``from_image``. See :meth:`Client.start_template_build`."""
        body = _image_build_body(name, from_image, start_cmd, ready_cmd, ready_timeout_seconds)
        return TemplateBuild.from_dict(await self.request_json("POST", "/v1/templates", json_body=body) or {})

    async def start_dockerfile_build(
        self,
        name: str,
        dockerfile: Optional[str] = None,
        *,
        context: Optional[str] = None,
        dockerfile_path: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[int] = None,
        on_context: Optional[Callable[[ContextStats], None]] = None,
    ) -> TemplateBuild:
        """Start building template ``name`` from a Dockerfile. See :meth:`Client.start_dockerfile_build`.

        The context archive is made in the loop's default executor;
        ``on_context`` (a plain function) is called from that thread.
        """
        kw = _dockerfile_request(
            name, dockerfile, context, dockerfile_path, build_args, start_cmd, ready_cmd, ready_timeout_seconds, on_context, _long(self.timeout)
        )
        return TemplateBuild.from_dict(await self.request_json("POST", "/v1/templates", **kw) or {})

    async def get_template_build(self, build_id: str) -> TemplateBuild:
        """The status of a build. See :meth:`Client.get_template_build`."""
        return TemplateBuild.from_dict(await self.request_json("GET", "/v1/templates/builds/%s" % quote_segment(build_id)) or {})

    async def list_template_builds(self, name: Optional[str] = None) -> List[TemplateBuild]:
        """The builds the key may read, newest first. See :meth:`Client.list_template_builds`."""
        query = {"name": name} if name else None
        out = await self.request_json("GET", "/v1/templates/builds", query=query) or {}
        return [TemplateBuild.from_dict(b) for b in out.get("builds") or []]

    def template_build_logs(self, build_id: str) -> AsyncBuildLogs:
        """The lines of a build's log as they arrive: ``async for line in client.template_build_logs(id)``.

        When the iteration ends the build has ended; its final
        :class:`TemplateBuild` is then the iterator's ``build``. Raises
        :class:`PandaConnectionError` if the stream ends before the build does.
        """
        return AsyncBuildLogs(self, build_id)

    async def follow_template_build(self, build_id: str, *, on_log: Optional[Callable[[str], Any]] = None) -> TemplateBuild:
        """Wait for a build to end, calling ``on_log`` (plain or async) with each line of its log; return the build."""
        logs = self.template_build_logs(build_id)
        async with logs:
            async for line in logs:
                if on_log is not None:
                    await _call(on_log, line)
        assert logs.build is not None
        return logs.build

    async def build_template(
        self,
        name: str,
        from_image: str,
        *,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[int] = None,
        on_log: Optional[Callable[[str], Any]] = None,
    ) -> TemplateBuild:
        """Build template ``name`` from ``from_image`` and wait; raises :class:`TemplateBuildError` when it fails."""
        b = await self.start_template_build(name, from_image, start_cmd=start_cmd, ready_cmd=ready_cmd, ready_timeout_seconds=ready_timeout_seconds)
        b = await self.follow_template_build(b.build_id, on_log=on_log)
        if not b.succeeded:
            raise TemplateBuildError.from_build(b)
        return b

    async def delete_template(self, name: str, *, force: bool = False) -> None:
        """Delete user template ``name``. See :meth:`Client.delete_template`."""
        await self.request("DELETE", "/v1/templates/%s" % quote_segment(name), query={"force": True} if force else None)

    async def publish_template(self, name: str, public: bool = True) -> None:
        """Publish (or withdraw) versions of user template ``name``. See :meth:`Client.publish_template`."""
        verb = "publish" if public else "unpublish"
        await self.request("POST", "/v1/templates/%s/%s" % (quote_segment(name), verb))

    async def create_key(
        self,
        name: str,
        *,
        admin: bool = False,
        max_sandboxes: Optional[int] = None,
        max_memory_mib: Optional[int] = None,
        max_vcpus: Optional[int] = None,
        max_disk_mib: Optional[int] = None,
    ) -> APIKey:
        """Create an API key (admin only); the secret is in the result's ``key``, shown only this once."""
        body = _key_body(name, admin, max_sandboxes, max_memory_mib, max_vcpus, max_disk_mib)
        return APIKey.from_dict(await self.request_json("POST", "/v1/keys", json_body=body))

    async def list_keys(self) -> List[APIKey]:
        """List API keys, without their secrets (admin only)."""
        body = await self.request_json("GET", "/v1/keys")
        return [APIKey.from_dict(k) for k in body.get("keys") or []]

    async def revoke_key(self, key_id: str) -> None:
        """Revoke an API key (admin only); its sandboxes are killed."""
        await self.request("DELETE", "/v1/keys/%s" % quote_segment(key_id))

    async def close(self) -> None:
        """Close the idle connections. The client stays usable (it reconnects when needed)."""
        with self._idle_lock:
            conns, self._idle = self._idle, []
        for conn in conns:
            conn.close()

    def __del__(self) -> None:
        # Close what is idle (a sync close; a connection of a closed loop gets
        # its socket closed). ``await close()`` is the orderly way.
        try:
            conns, self._idle = self._idle, []
            for conn in conns:
                conn.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- transport -----------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = None,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Timeout = None,
        auth: bool = True,
    ) -> Tuple[int, http.client.HTTPMessage, bytes]:
        """Send a request and return ``(status, headers, body)`` of a 2xx answer. See :meth:`Client.request`."""
        resp = await self._send(method, path, query=query, json_body=json_body, body=body, headers=headers, timeout=timeout, auth=auth)
        try:
            data = await resp.read()
        except BaseException as e:
            resp.conn.close()
            if isinstance(e, Exception):
                raise self._convert(e) from e
            raise
        return self._answer(resp, resp.conn, data)

    async def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Like :meth:`request`, and decode the answer as JSON (``None`` for an empty body)."""
        status, _, data = await self.request(method, path, **kwargs)
        return self._decode_json(method, path, status, data)

    async def stream(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = None,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Timeout = None,
        auth: bool = True,
    ) -> AsyncStreamResponse:
        """Send a request and return its 2xx response unread (``async with await client.stream(...) as resp``)."""
        resp = await self._send(method, path, query=query, json_body=json_body, body=body, headers=headers, timeout=timeout, auth=auth)
        if not 200 <= resp.status < 300:
            try:
                data = await resp.read()
            except Exception:  # noqa: BLE001 - the status is what matters
                data = b""
            finally:
                resp.conn.close()
            raise _errors.error_from_response(resp.status, data, resp.reason)
        return AsyncStreamResponse(self, resp)

    # -- internals -------------------------------------------------------------

    def _convert(self, e: BaseException) -> PandaError:
        if isinstance(e, asyncio.TimeoutError) and not isinstance(e, OSError):
            e = TimeoutError(str(e))  # socket.timeout since Python 3.10; what _convert_exc expects
        elif isinstance(e, asyncio.IncompleteReadError):
            e = http.client.IncompleteRead(e.partial, e.expected)
        if isinstance(e, TimeoutError):
            import socket

            if not isinstance(e, socket.timeout):  # Python 3.9: socket.timeout is not TimeoutError
                e = socket.timeout(str(e))
        return self._convert_exc(e)

    async def _connect(self, timeout: Timeout) -> _Conn:
        loop = asyncio.get_running_loop()
        port = self._port or (443 if self._scheme == "https" else 80)
        ctx = None
        if self._scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        reader, writer = await _wait(asyncio.open_connection(self._host, port, ssl=ctx, limit=_LINE_LIMIT), timeout)
        return _Conn(reader, writer, loop)

    def _take(self) -> Optional[_Conn]:
        loop = asyncio.get_running_loop()
        stale: List[_Conn] = []
        found: Optional[_Conn] = None
        with self._idle_lock:
            for i in range(len(self._idle) - 1, -1, -1):
                c = self._idle[i]
                if c.loop is not loop:
                    if c.loop.is_closed():
                        stale.append(self._idle.pop(i))
                    continue
                self._idle.pop(i)
                if c.dropped():
                    stale.append(c)
                    continue
                found = c
                break
        for c in stale:
            c.close()
        return found

    def _release(self, conn: _Conn) -> None:
        if conn.dropped():
            conn.close()
            return
        with self._idle_lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Query,
        json_body: Any,
        body: Any,
        headers: Optional[Mapping[str, str]],
        timeout: Timeout,
        auth: bool,
    ) -> _Response:
        target, hdrs, b, chunked, timeout = self._prepare(method, path, query, json_body, body, headers, timeout, auth)
        hdrs = dict(hdrs)
        hdrs.setdefault("Host", self._netloc())
        hdrs.setdefault("Accept-Encoding", "identity")
        head = ("%s %s HTTP/1.1\r\n" % (method, target) + "".join("%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n").encode("latin-1")

        retry = _Retry(method, b)
        for attempt in range(retry.attempts):
            conn = None if retry.fresh else self._take()
            reused = conn is not None
            sent = False
            try:
                if conn is None:
                    conn = await self._connect(timeout)
                await self._write(conn, head, b, chunked, timeout)
                sent = True
                return await _read_head(conn, method, timeout)
            except _STALE as e:
                if retry.again(attempt, reused, sent):
                    assert conn is not None
                    conn.close()
                    continue
                if retry.early_answer(sent) and conn is not None:
                    early = await _early_response(conn, method)
                    if early is not None:
                        raise early from e
                if conn is not None:
                    conn.close()
                raise self._convert(e) from e
            except BaseException as e:
                # Cancellation too: the connection is in an unknown state.
                if conn is not None:
                    conn.close()
                if isinstance(e, Exception):
                    raise self._convert(e) from e
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _write(self, conn: _Conn, head: bytes, b: _Body, chunked: bool, timeout: Timeout) -> None:
        w = conn.writer
        if isinstance(b.data, bytes):
            w.write(head + b.data)
        elif b.data is None:
            w.write(head)
        else:
            w.write(head)
            loop = asyncio.get_running_loop()
            it = iter(b.data)
            while True:
                # A file is read in the executor: a local read can block.
                chunk = await loop.run_in_executor(None, next, it, _END)
                if chunk is _END:
                    break
                if not chunk:
                    continue
                if chunked:
                    w.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                else:
                    w.write(chunk)
                await _wait(w.drain(), timeout)
            if chunked:
                w.write(b"0\r\n\r\n")
        await _wait(w.drain(), timeout)


async def _early_response(conn: _Conn, method: str) -> Optional[PandaError]:
    """The error a server sent before it stopped reading our request body, if it can still be read."""
    try:
        if conn.reader.exception() is not None:
            # The failed write marked the stream broken; what the server sent
            # before that is still buffered: read it from a copy.
            r = asyncio.StreamReader(limit=_LINE_LIMIT)
            r.feed_data(bytes(getattr(conn.reader, "_buffer", b"")))
            r.feed_eof()
            conn = _Conn(r, conn.writer, conn.loop)
        resp = await _read_head(conn, method, 2.0)
        data = b""
        while len(data) < (64 << 10):
            chunk = await resp.read1(64 << 10)
            if not chunk:
                break
            data += chunk
    except Exception:  # noqa: BLE001 - best effort only
        return None
    finally:
        conn.close()
    return _error_of(resp, data)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a plain or an async callback."""
    r = fn(*args)
    if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
        r = await r
    return r


_defaults: "_Defaults[AsyncClient]" = _Defaults(AsyncClient)


def default_async_client() -> AsyncClient:
    """The async client built from ``PANDASTACK_API_KEY``/``PANDASTACK_API_URL`` (one per distinct pair)."""
    return _defaults.get()


def resolve_async_client(client: Optional[AsyncClient], api_key: Optional[str], api_url: Optional[str]) -> AsyncClient:
    """The client to use given the ``client=``, ``api_key=`` and ``api_url=`` arguments of a call."""
    c = _defaults.resolve(client, api_key, api_url)
    if not isinstance(c, AsyncClient):
        raise TypeError("client must be an AsyncClient, got %s (a Client is for the blocking API)" % type(c).__name__)
    return c
