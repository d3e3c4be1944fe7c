"""Connection settings and the HTTP transport of the SDK.

A :class:`Client` holds the API URL, the API key and the timeout, and sends
requests with :mod:`http.client` (standard library only). It keeps one idle
keep-alive connection per thread, so a loop of ``exec`` calls does not
reconnect each time. Clients are cheap and thread-safe; ``close()`` (or
``with Client(...) as c:``) closes the idle connections.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import platform
import select
import socket
import stat
import threading
import urllib.parse
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generator,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import errors as _errors
from ._ndjson import NDJSONDecoder
from .errors import ConfigurationError, PandaConnectionError, PandaError, RequestTimeoutError
from .models import APIKey, Template
from ._buildcontext import ContextStats
from .templates import TemplateBuild, TemplateBuildError, multipart_build_body

if TYPE_CHECKING:  # pragma: no cover
    from .events import EventStream

__all__ = [
    "Client",
    "DEFAULT_API_URL",
    "ENV_API_KEY",
    "ENV_API_URL",
    "DEFAULT_TIMEOUT",
    "LONG_OPERATION_TIMEOUT",
    "default_client",
    "quote_query",
]

#: Where the SDK looks for the server when neither ``api_url=`` nor
#: ``PANDASTACK_API_URL`` say otherwise (what ``panda up`` listens on).
DEFAULT_API_URL = "http://127.0.0.1:7788"
#: Environment variable holding the API key.
ENV_API_KEY = "PANDASTACK_API_KEY"
#: Environment variable holding the API URL.
ENV_API_URL = "PANDASTACK_API_URL"
#: Default seconds to wait for the server (connect, and each read).
DEFAULT_TIMEOUT = 60.0
#: Operations that may bake a template or copy memory (create, fork,
#: snapshot, resume, bake) wait at least this long for their answer.
LONG_OPERATION_TIMEOUT = 600.0

__version__ = "0.1.0"

_IDEMPOTENT = frozenset(["GET", "HEAD", "PUT", "DELETE", "OPTIONS"])
_STALE_ERRORS = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)
_UPLOAD_CHUNK = 1 << 20

QueryValue = Union[str, int, float, bool]
Query = Union[Mapping[str, Optional[QueryValue]], Sequence[Tuple[str, QueryValue]], None]
Timeout = Optional[float]


def quote_query(query: Query) -> str:
    """Encode query parameters for a URL.

    Accepts a mapping (``None`` values are left out) or a sequence of
    ``(name, value)`` pairs (for repeated names). Booleans become
    ``true``/``false``. Every reserved character is percent-encoded
    (a space is ``%20``, never ``+``) except ``/``, so ``/work/a b&c`` is
    sent as ``/work/a%20b%26c``.
    """
    if not query:
        return ""
    items: Iterable[Tuple[str, Any]]
    if isinstance(query, Mapping):
        items = query.items()
    else:
        items = query
    pairs: List[Tuple[str, str]] = []
    for k, v in items:
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        pairs.append((k, str(v)))
    return urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote, safe="/")


def quote_segment(value: str) -> str:
    """Percent-encode one URL path segment (an id or a name): nothing is left unescaped but ``A-Za-z0-9_.-~``."""
    if not isinstance(value, str) or not value:
        raise ValueError("an id must be a non-empty string, got %r" % (value,))
    return urllib.parse.quote(value, safe="")


def _file_length(f: Any) -> Optional[int]:
    """Bytes left to read in binary file ``f``, or ``None`` when that cannot be known cheaply."""
    if isinstance(f, io.TextIOBase):
        return None  # str chunks: the byte count is only known after encoding
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        pos = int(f.tell())
        return max(0, st.st_size - pos)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        if f.seekable():
            pos = int(f.tell())
            end = int(f.seek(0, io.SEEK_END))
            f.seek(pos)
            return max(0, end - pos)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return None


def _iter_file(f: Any, chunk_size: int = _UPLOAD_CHUNK) -> Iterator[bytes]:
    """Read ``f`` in chunks; ``str`` chunks (text files) are encoded as UTF-8."""
    while True:
        chunk = f.read(chunk_size)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        elif not isinstance(chunk, bytes):
            chunk = bytes(chunk)
        yield chunk


class _Lines:
    """The items of an NDJSON stream, for one thread: ``parse`` turns each
    line into an item, or ``None`` to skip it. The iteration ends with the
    stream (which is then closed), or when :meth:`_stop` is called from any
    thread; a read that fails closes the stream and raises."""

    def __init__(self, resp: "StreamResponse", parse: Callable[[Any], Any]) -> None:
        self._resp = resp
        self._parse = parse
        self._stopped = threading.Event()
        self._lines: Iterator[Any] = resp.iter_ndjson()

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> Any:
        while True:
            try:
                d = next(self._lines)
            except StopIteration:
                self._resp.close()
                raise
            except Exception:
                if self._stopped.is_set():
                    raise StopIteration from None
                self._resp.close()
                raise
            item = self._parse(d)
            if item is not None:
                return item

    def _stop(self) -> None:
        self._stopped.set()
        self._resp.abort()


class _Body:
    """A request body: bytes (replayable) or a stream (sent once)."""

    def __init__(self, data: Union[bytes, Iterable[bytes], None], length: Optional[int], replayable: bool) -> None:
        self.data = data
        self.length = length
        self.replayable = replayable

    @classmethod
    def from_any(cls, data: Any) -> "_Body":
        if data is None:
            return cls(None, 0, True)
        if isinstance(data, str):
            b = data.encode("utf-8")
            return cls(b, len(b), True)
        if isinstance(data, (bytes, bytearray, memoryview)):
            b = bytes(data)
            return cls(b, len(b), True)
        if hasattr(data, "read"):
            return cls(_iter_file(data), _file_length(data), False)
        raise TypeError("a body must be str, bytes or a file-like object with read(), got %s" % type(data).__name__)


class StreamResponse:
    """A response whose body is read incrementally. Close it (or use ``with``).

    Closing before the body is fully read closes the connection, which tells
    the server to stop (for exec streams, to kill the command).
    """

    def __init__(self, client: "Client", conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._client = client
        self._conn: Optional[http.client.HTTPConnection] = conn
        self._resp = resp
        self.status: int = resp.status
        self.headers = resp.headers

    def read1(self, size: int = 65536) -> bytes:
        """Return what is available (up to ``size`` bytes, at least one unless the body ended)."""
        try:
            return self._resp.read1(size)
        except Exception as e:  # noqa: BLE001 - converted to SDK errors
            self.close()
            raise self._client._convert_exc(e) from e

    def iter_chunks(self, size: int = 65536) -> Iterator[bytes]:
        """Yield the body in chunks as they arrive."""
        while True:
            chunk = self.read1(size)
            if not chunk:
                return
            yield chunk

    def iter_ndjson(self) -> Iterator[Any]:
        """Yield the JSON values of an NDJSON body as their lines arrive."""
        dec = NDJSONDecoder()
        for chunk in self.iter_chunks():
            yield from dec.feed(chunk)
        yield from dec.close()

    def abort(self) -> None:
        """Close the connection from any thread, waking a read blocked on it."""
        conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        """Release the connection: back to the pool if the body was fully read, else closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._resp.isclosed() and not self._resp.will_close:
            self._client._release(conn)
        else:
            try:
                self._resp.close()
            finally:
                conn.close()

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Retry:
    """The rule both clients follow when a request meets a connection the
    server closed while it was idle: the request is sent again, once, on a
    fresh connection, when that is safe.

    A body sent as a stream (not replayable) goes once, on a fresh
    connection: if a reused one turned out to be stale there would be no way
    to send it again.
    """

    def __init__(self, method: str, body: _Body) -> None:
        self._method = method
        self._body = body
        #: How many times the request may go out.
        self.attempts = 2 if body.replayable else 1
        #: The request must not take a pooled connection.
        self.fresh = not body.replayable

    def again(self, attempt: int, reused: bool, sent: bool) -> bool:
        """After a stale-connection error on ``attempt`` (from 0): whether to
        send again. Only a reused connection is retried, and only when
        resending is safe (an idempotent method, or nothing sent yet)."""
        return reused and attempt + 1 < self.attempts and (self._method in _IDEMPOTENT or not sent)

    def early_answer(self, sent: bool) -> bool:
        """After a stale-connection error: whether the server may have answered
        before it stopped reading the body (unknown sandbox, upload too large);
        that answer says more than the broken pipe."""
        return not sent and self._body.data is not None


def _error_of(resp: Any, data: bytes) -> Optional[PandaError]:
    """The :class:`PandaError` of an answer (either client's response), or ``None`` for a 2xx one."""
    if 200 <= resp.status < 300:
        return None
    return _errors.error_from_response(resp.status, data, resp.reason)


class _Settings:
    """What :class:`Client` and :class:`~pandastack.AsyncClient` share: their settings, the
    request each sends (target, headers, body), the handling of an answer read whole
    and the mapping of transport errors."""

    def __init__(self, api_key: Optional[str] = None, api_url: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY) or None
        if api_url is None:
            api_url = os.environ.get(ENV_API_URL) or DEFAULT_API_URL
        if api_key is not None:
            if not isinstance(api_key, str):
                raise TypeError("api_key must be a string")
            api_key = api_key.strip() or None
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive or None (wait forever)")
        self.api_key: Optional[str] = api_key
        self.api_url: str = _normalize_url(api_url)
        self.timeout: Optional[float] = timeout
        parts = urllib.parse.urlsplit(self.api_url)
        self._scheme = parts.scheme
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._user_agent = "pandastack-python/%s Python/%s" % (__version__, platform.python_version())

    def url(self, path: str, query: Query = None) -> str:
        """Full URL of API ``path`` (e.g. ``/v1/sandboxes``) with ``query``."""
        return "%s://%s%s" % (self._scheme, self._netloc(), self._target(path, query))

    def _netloc(self) -> str:
        host = self._host
        if ":" in host:
            host = "[%s]" % host
        return host if self._port is None else "%s:%d" % (host, self._port)

    def _target(self, path: str, query: Query) -> str:
        qs = quote_query(query)
        return self._prefix + path + ("?" + qs if qs else "")

    def _prepare(
        self,
        method: str,
        path: str,
        query: Query,
        json_body: Any,
        body: Any,
        headers: Optional[Mapping[str, str]],
        timeout: Timeout,
        auth: bool,
    ) -> Tuple[str, Dict[str, str], "_Body", bool, Timeout]:
        """The request target, headers, body, whether to chunk it, and the socket timeout of a request.

        Shared by :class:`Client` and :class:`~pandastack.AsyncClient`, so both put the same bytes on the wire.
        """
        hdrs: Dict[str, str] = {"User-Agent": self._user_agent, "Accept": "application/json"}
        if auth:
            if not self.api_key:
                raise ConfigurationError(
                    "no PandaStack API key: set the %s environment variable or pass api_key= "
                    "(`panda up` prints the admin key and keeps it in <data-dir>/admin.key)" % ENV_API_KEY
                )
            hdrs["Authorization"] = "Bearer " + self.api_key
        if json_body is not None and body is not None:
            raise ValueError("pass json_body or body, not both")
        if json_body is not None:
            b = _Body.from_any(json.dumps(json_body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
            hdrs["Content-Type"] = "application/json"
        elif body is not None:
            b = _Body.from_any(body)
            hdrs["Content-Type"] = "application/octet-stream"
        else:
            b = _Body(None, None, True)
        if headers:
            hdrs.update(headers)
        encode_chunked = False
        if b.data is not None:
            if b.length is not None:
                hdrs["Content-Length"] = str(b.length)
            else:
                hdrs["Transfer-Encoding"] = "chunked"
                encode_chunked = True
        elif method in ("POST", "PUT", "PATCH"):
            hdrs["Content-Length"] = "0"
        target = self._target(path, query)
        if timeout is None:
            timeout = self.timeout
        elif timeout == float("inf"):
            timeout = None
        return target, hdrs, b, encode_chunked, timeout

    def _release(self, conn: Any) -> None:
        """Put ``conn``, its answer read whole, back in the pool."""
        raise NotImplementedError

    def _answer(self, resp: Any, conn: Any, data: bytes) -> Tuple[int, "http.client.HTTPMessage", bytes]:
        """``(status, headers, body)`` of an answer read whole, its connection
        pooled again unless the server closes it; a non-2xx answer raises."""
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)
        err = _error_of(resp, data)
        if err is not None:
            raise err
        return resp.status, resp.headers, data

    def _decode_json(self, method: str, path: str, status: int, data: bytes) -> Any:
        if not data.strip():
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise PandaError(
                "the server at %s answered %s %s with something that is not JSON: %r" % (self.api_url, method, path, data[:200]),
                status=status,
            ) from e

    def _convert_exc(self, e: BaseException) -> PandaError:
        """Turn a transport exception into the SDK error users see."""
        if isinstance(e, PandaError):
            return e
        if isinstance(e, socket.timeout):
            return RequestTimeoutError(
                "the PandaStack server at %s did not answer in time (Client timeout %ss; exec waits for its "
                "timeout_seconds plus 30 s): raise Client(timeout=...) for slow operations" % (self.api_url, _fmt_timeout(self.timeout))
            )
        if isinstance(e, (ConnectionRefusedError, socket.gaierror)) or (
            isinstance(e, OSError) and not isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError))
        ):
            return PandaConnectionError(
                "cannot connect to the PandaStack server at %s: %s. Is `panda up` running at %s? "
                "(set %s or pass api_url= to use another address)" % (self.api_url, e, self.api_url, ENV_API_URL)
            )
        if isinstance(e, (http.client.HTTPException, ConnectionError)):
            return PandaConnectionError(
                "the connection to the PandaStack server at %s broke: %s: %s. Is `panda up` still running?"
                % (self.api_url, type(e).__name__, e)
            )
        if isinstance(e, (TypeError, ValueError)):
            raise e
        return PandaConnectionError("request to %s failed: %s: %s" % (self.api_url, type(e).__name__, e))


class Client(_Settings):
    """Connection settings for a PandaStack server.

    Args:
        api_key: API key sent as ``Authorization: Bearer``. Default: the
            ``PANDASTACK_API_KEY`` environment variable. Only requests that need
            one fail (with :class:`ConfigurationError`) when there is none.
        api_url: Base URL of the server (``http://host:7788``; a path prefix is
            kept). Default: ``PANDASTACK_API_URL``, else ``http://127.0.0.1:7788``.
        timeout: Seconds to wait to connect and for each read of an ordinary
            request. ``exec`` waits for its own ``timeout_seconds`` plus a margin;
            create, fork, snapshot and resume wait at least
            :data:`LONG_OPERATION_TIMEOUT`.

    Example::

        client = Client(api_key="pk_...", api_url="http://10.0.0.5:7788")
        sb = Sandbox.create(template="tiny", client=client)
    """

    def __init__(self, api_key: Optional[str] = None, api_url: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        super().__init__(api_key, api_url, timeout)
        # One idle keep-alive connection per thread, keyed by thread id, so
        # that close() can reach them all.
        self._idle_lock = threading.Lock()
        self._idle: Dict[int, http.client.HTTPConnection] = {}

    def __repr__(self) -> str:
        return "Client(api_url=%r, api_key=%s)" % (self.api_url, "set" if self.api_key else "unset")

    # -- public API: server-level endpoints ---------------------------------

    def health(self) -> Dict[str, Any]:
        """Return ``GET /healthz`` (``{"status": "ok", "version": ...}``); needs no API key.

        Raises :class:`PandaConnectionError` when the server is not reachable.
        """
        body = self.request_json("GET", "/healthz", auth=False)
        return dict(body) if isinstance(body, Mapping) else {}

    def events(self) -> "EventStream":
        """Open the stream of changes of this key's sandboxes and snapshots (``GET /v1/events``).

        Returns once the server has subscribed it: list after that
        (``Sandbox.list()``, ``Snapshot.list()``) and apply the events to
        the list, and nothing is missed. Iterate it for :class:`Event`
        objects; it ends when the key is revoked, the server shuts down, or
        after an ``"overflow"`` event (the reader fell behind: list again).
        A read raises :class:`PandaConnectionError` after
        :data:`EVENTS_IDLE_TIMEOUT` seconds of silence (the server pings
        every 15 s).

        Example::

            with client.events() as stream:
                for ev in stream:
                    print(ev.seq, ev.type, ev.id, ev.sandbox.state if ev.sandbox else "")
        """
        from .events import EventStream

        return EventStream(self)

    def list_templates(self) -> List[Template]:
        """List templates and the state of their baked snapshots."""
        body = self.request_json("GET", "/v1/templates")
        return [Template.from_dict(t) for t in body.get("templates") or []]

    def bake_template(
        self,
        name: str,
        *,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        on_progress: Optional[Callable[[str], None]] = None,
    ) -> Template:
        """Bake (or re-bake) template ``name``; admin keys only.

        ``on_progress`` is called with each progress message as it arrives.
        Returns the baked template; raises the error the server reports.
        """
        body = _bake_body(memory_mib, vcpus)
        with self.stream("POST", "/v1/templates/%s/bake" % quote_segment(name), json_body=body, timeout=_long(self.timeout)) as resp:
            for ev in resp.iter_ndjson():
                progress, done = _bake_event(ev)
                if progress is not None and on_progress is not None:
                    on_progress(progress)
                elif done is not None:
                    return done
        raise PandaConnectionError("the bake stream of template %r ended before a result" % name)

    def start_template_build(
        self,
        name: str,
        from_image: str,
        *,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[int] = None,
    ) -> TemplateBuild:
        """Start building template ``name`` (a new version of it) from container image ``from_image``.

        Any key may build; a new name is the key's own, private to it until
        an admin key publishes it (:meth:`publish_template`); another key's
        name raises :class:`ConflictError`.

        ``from_image`` is a registry reference (``registry.example.com/app:1.0``).
        Returns the build, queued, at once (``POST /v1/templates``, 202):
        follow it with :meth:`template_build_logs` or
        :meth:`follow_template_build`. ``start_cmd``, ``ready_cmd`` and
        ``ready_timeout_seconds`` are sent only when given.
        """
        body = _image_build_body(name, from_image, start_cmd, ready_cmd, ready_timeout_seconds)
        return TemplateBuild.from_dict(self.request_json("POST", "/v1/templates", json_body=body) or {})

    def start_dockerfile_build(
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
        """Start building template ``name`` from a Dockerfile (any key: the template is its own, private until an admin key publishes it).

        ``dockerfile`` is the Dockerfile's text; ``None`` to use the one in
        ``context`` (``dockerfile_path``, default ``Dockerfile`` at its
        root). ``context`` is a directory sent as the build context: a
        gzip-compressed tar archive streamed from disk, with its
        ``.dockerignore`` applied by Docker's rules and symlinks not
        followed; ``on_context`` is called after each file sent with the
        counts so far. Without ``context`` the Dockerfile alone is sent (as
        JSON). ``build_args`` set the Dockerfile's ARGs. Returns the build,
        queued (``POST /v1/templates``, 202). A server that does not run
        Dockerfile builds answers 501 (:class:`PandaError` with ``code``
        ``not_implemented``); a context over the server's limit is
        :class:`PayloadTooLargeError`.
        """
        kw = _dockerfile_request(
            name, dockerfile, context, dockerfile_path, build_args, start_cmd, ready_cmd, ready_timeout_seconds, on_context, _long(self.timeout)
        )
        return TemplateBuild.from_dict(self.request_json("POST", "/v1/templates", **kw) or {})

    def get_template_build(self, build_id: str) -> TemplateBuild:
        """The status of a build (``GET /v1/templates/builds/{id}``); the key that started it, or an admin key.

        Builds are kept in the server's memory for an hour after they end
        (and not across restarts): older ones are :class:`NotFoundError`.
        """
        return TemplateBuild.from_dict(self.request_json("GET", "/v1/templates/builds/%s" % quote_segment(build_id)) or {})

    def list_template_builds(self, name: Optional[str] = None) -> List[TemplateBuild]:
        """The builds the key may read (``GET /v1/templates/builds``): its own, every build for an admin key; newest first.

        ``name`` keeps one template's builds only. Builds are forgotten an
        hour after they end.
        """
        query = {"name": name} if name else None
        out = self.request_json("GET", "/v1/templates/builds", query=query) or {}
        return [TemplateBuild.from_dict(b) for b in out.get("builds") or []]

    def template_build_logs(self, build_id: str) -> Generator[str, None, TemplateBuild]:
        """Yield the lines of a build's log, from the first, as they arrive, until the build ends.

        A generator: ``for line in client.template_build_logs(b.build_id): ...``.
        When it is exhausted the build has ended; its final
        :class:`TemplateBuild` is the generator's return value (``yield from``)
        and what :meth:`get_template_build` answers. It does not raise for a
        failed build; it raises :class:`PandaConnectionError` if the stream
        ends before the build does. Closing it early closes the stream; the
        build goes on. Each read waits at least
        :data:`LONG_OPERATION_TIMEOUT` (pulling a large layer may be quiet).
        """
        path = "/v1/templates/builds/%s/logs" % quote_segment(build_id)
        with self.stream("GET", path, headers={"Accept": "application/x-ndjson"}, timeout=_long(self.timeout)) as resp:
            for ev in resp.iter_ndjson():
                line, build = _log_event(ev)
                if line is not None:
                    yield line
                elif build is not None:
                    return build
        raise PandaConnectionError("the log stream of template build %s ended before the build did" % build_id)

    def follow_template_build(self, build_id: str, *, on_log: Optional[Callable[[str], None]] = None) -> TemplateBuild:
        """Wait for a build to end, calling ``on_log`` with each line of its log; return the build.

        Does not raise for a failed build: see its ``status``, ``code`` and
        ``error`` (:meth:`build_template` raises instead).
        """
        gen = self.template_build_logs(build_id)
        while True:
            try:
                line = next(gen)
            except StopIteration as stop:
                return stop.value
            if on_log is not None:
                on_log(line)

    def build_template(
        self,
        name: str,
        from_image: str,
        *,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[int] = None,
        on_log: Optional[Callable[[str], None]] = None,
    ) -> TemplateBuild:
        """Build template ``name`` (a new version of it) from ``from_image`` and wait for it.

        :meth:`start_template_build` then :meth:`follow_template_build`.
        Returns the succeeded build; raises :class:`TemplateBuildError` (its
        ``code`` is ``image_not_found``, ``build_failed`` or ``canceled``,
        its ``build`` the failed build) when the build fails. See also
        ``Template.from_image(ref).build(name)``.
        """
        b = self.start_template_build(name, from_image, start_cmd=start_cmd, ready_cmd=ready_cmd, ready_timeout_seconds=ready_timeout_seconds)
        b = self.follow_template_build(b.build_id, on_log=on_log)
        if not b.succeeded:
            raise TemplateBuildError.from_build(b)
        return b

    def delete_template(self, name: str, *, force: bool = False) -> None:
        """Delete user template ``name``: ``"NAME"`` every version (and every shape baked from them), ``"NAME:3"`` version 3 only.

        Its owner or an admin key only. The latest version cannot be deleted
        on its own (:class:`ConflictError`). Without ``force`` it is refused
        (:class:`ConflictError`) while sandboxes of it are not stopped or
        snapshots of it exist; with it they keep working from their own
        files. Built-in templates cannot be deleted
        (:class:`InvalidArgumentError`); an unknown name, or another key's
        private template, is :class:`NotFoundError`.
        """
        self.request("DELETE", "/v1/templates/%s" % quote_segment(name), query={"force": True} if force else None)

    def publish_template(self, name: str, public: bool = True) -> None:
        """Publish a version of user template ``name`` for every key; admin keys only.

        Publishing is per version: ``"NAME"`` publishes its latest version
        (as it is now), ``"NAME:N"`` version N. Other keys' ``"NAME"`` then
        means the latest published version; a version built later is its
        owner's alone until it is published in turn. ``public=False``
        withdraws ``"NAME:N"``, or every version of ``"NAME"``.
        """
        verb = "publish" if public else "unpublish"
        self.request("POST", "/v1/templates/%s/%s" % (quote_segment(name), verb))

    def create_key(
        self,
        name: str,
        *,
        admin: bool = False,
        max_sandboxes: Optional[int] = None,
        max_memory_mib: Optional[int] = None,
        max_vcpus: Optional[int] = None,
        max_disk_mib: Optional[int] = None,
    ) -> APIKey:
        """Create an API key (admin only). The secret is in the result's ``key``, shown only this once.

        Quotas left out (or 0) are the server's defaults; disk counts the key's
        sandbox disks, paused sandboxes and snapshots.
        """
        body = _key_body(name, admin, max_sandboxes, max_memory_mib, max_vcpus, max_disk_mib)
        return APIKey.from_dict(self.request_json("POST", "/v1/keys", json_body=body))

    def list_keys(self) -> List[APIKey]:
        """List API keys, without their secrets (admin only)."""
        body = self.request_json("GET", "/v1/keys")
        return [APIKey.from_dict(k) for k in body.get("keys") or []]

    def revoke_key(self, key_id: str) -> None:
        """Revoke an API key (admin only); its sandboxes are killed."""
        self.request("DELETE", "/v1/keys/%s" % quote_segment(key_id))

    def close(self) -> None:
        """Close the idle connections. The client stays usable (it reconnects when needed)."""
        with self._idle_lock:
            conns, self._idle = list(self._idle.values()), {}
        for conn in conns:
            conn.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- transport -----------------------------------------------------------

    def request(
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
    ) -> Tuple[int, "http.client.HTTPMessage", bytes]:
        """Send a request and return ``(status, headers, body)`` of a 2xx answer.

        A non-2xx answer raises the :class:`PandaError` subclass for its error
        code. ``json_body`` is encoded as JSON; ``body`` (str, bytes or a
        file-like object, streamed) is sent as ``application/octet-stream``.
        ``timeout`` defaults to the client's.
        """
        resp, conn = self._send(method, path, query=query, json_body=json_body, body=body, headers=headers, timeout=timeout, auth=auth)
        try:
            data = resp.read()
        except Exception as e:  # noqa: BLE001
            conn.close()
            raise self._convert_exc(e) from e
        return self._answer(resp, conn, data)

    def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Like :meth:`request`, and decode the answer as JSON (``None`` for an empty body)."""
        status, _, data = self.request(method, path, **kwargs)
        return self._decode_json(method, path, status, data)

    def stream(
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
    ) -> StreamResponse:
        """Send a request and return its 2xx response unread, to be consumed incrementally.

        A non-2xx answer is read and raised as a :class:`PandaError` subclass.
        """
        resp, conn = self._send(method, path, query=query, json_body=json_body, body=body, headers=headers, timeout=timeout, auth=auth)
        if not 200 <= resp.status < 300:
            try:
                data = resp.read()
            except Exception:  # noqa: BLE001 - the status is what matters
                data = b""
            conn.close()
            raise _errors.error_from_response(resp.status, data, resp.reason)
        return StreamResponse(self, conn, resp)

    # -- internals -------------------------------------------------------------

    def _new_conn(self, timeout: Timeout) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _take(self, fresh: bool, timeout: Timeout) -> Tuple[http.client.HTTPConnection, bool]:
        with self._idle_lock:
            conn = self._idle.pop(threading.get_ident(), None)
        if conn is not None and (fresh or _dropped(conn)):
            conn.close()
            conn = None
        if conn is None:
            return self._new_conn(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _release(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is None:
            return
        with self._idle_lock:
            old = self._idle.get(threading.get_ident())
            self._idle[threading.get_ident()] = conn
        if old is not None and old is not conn:
            old.close()

    def _send(
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
    ) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        target, hdrs, b, encode_chunked, timeout = self._prepare(method, path, query, json_body, body, headers, timeout, auth)
        retry = _Retry(method, b)
        for attempt in range(retry.attempts):
            conn, reused = self._take(fresh=retry.fresh, timeout=timeout)
            sent = False
            try:
                conn.request(method, target, body=b.data, headers=hdrs, encode_chunked=encode_chunked)
                sent = True
                resp = conn.getresponse()
                return resp, conn
            except _STALE_ERRORS as e:
                if retry.again(attempt, reused, sent):
                    conn.close()
                    continue
                if retry.early_answer(sent):
                    early = _early_response(conn)
                    if early is not None:
                        raise early from e
                conn.close()
                raise self._convert_exc(e) from e
            except Exception as e:  # noqa: BLE001
                conn.close()
                raise self._convert_exc(e) from e
        raise AssertionError("unreachable")  # pragma: no cover



# -- pure request and answer helpers shared with the asyncio client ------------


def _bake_body(memory_mib: Optional[int], vcpus: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if memory_mib is not None:
        body["memory_mib"] = memory_mib
    if vcpus is not None:
        body["vcpus"] = vcpus
    return body


def _progress_event(ev: Any, result: str) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """One event of a progress stream (a bake's, a create's): ``(progress message, None)``, ``(None, the done event's
    ``result`` object)``, or ``(None, None)`` to ignore; an error event raises."""
    if not isinstance(ev, Mapping):
        return None, None
    t = ev.get("type")
    if t == "progress":
        return str(ev.get("message", "")), None
    if t == "done":
        return None, dict(ev.get(result) or {})
    if t == "error":
        raise _errors.error_from_body(ev.get("error") or {})
    return None, None


def _create_event(ev: Any) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """One event of a create's progress stream; the done event gives the sandbox's JSON."""
    return _progress_event(ev, "sandbox")


def _is_ndjson(headers: Any) -> bool:
    """Whether a response's Content-Type is NDJSON (a server that does not stream a create's progress answers JSON)."""
    return str(headers.get("Content-Type") or "").startswith("application/x-ndjson")


def _bake_event(ev: Any) -> Tuple[Optional[str], Optional[Template]]:
    """One event of a bake stream: ``(progress message, None)``, ``(None, baked template)``, or ``(None, None)`` to ignore; an error event raises."""
    progress, done = _progress_event(ev, "template")
    return progress, (Template.from_dict(done) if done is not None else None)
    t = ev.get("type")
    if t == "progress":
        return str(ev.get("message", "")), None
    if t == "done":
        return None, Template.from_dict(ev.get("template") or {})
    if t == "error":
        raise _errors.error_from_body(ev.get("error") or {})
    return None, None


def _image_build_body(
    name: str, from_image: str, start_cmd: Optional[str], ready_cmd: Optional[str], ready_timeout_seconds: Optional[int]
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name, "from_image": from_image}
    for k, v in (("start_cmd", start_cmd), ("ready_cmd", ready_cmd), ("ready_timeout_seconds", ready_timeout_seconds)):
        if v is not None:
            body[k] = v
    return body


def _dockerfile_request(
    name: str,
    dockerfile: Optional[str],
    context: Optional[str],
    dockerfile_path: Optional[str],
    build_args: Optional[Mapping[str, str]],
    start_cmd: Optional[str],
    ready_cmd: Optional[str],
    ready_timeout_seconds: Optional[int],
    on_context: Optional[Callable[[ContextStats], None]],
    long_timeout: Timeout,
) -> Dict[str, Any]:
    """The keyword arguments of ``request_json("POST", "/v1/templates", ...)`` for a Dockerfile build."""
    spec: Dict[str, Any] = {"name": name}
    if build_args:
        spec["build_args"] = dict(build_args)
    if dockerfile_path is not None:
        spec["dockerfile_path"] = dockerfile_path
    for k, v in (("start_cmd", start_cmd), ("ready_cmd", ready_cmd), ("ready_timeout_seconds", ready_timeout_seconds)):
        if v is not None:
            spec[k] = v
    if context is None:
        if dockerfile is None:
            raise ValueError("a Dockerfile build needs the Dockerfile's text or a context directory holding it")
        if dockerfile_path is not None:
            raise ValueError("dockerfile_path names a file of the context, and there is no context directory")
        spec["dockerfile"] = dockerfile
        return {"json_body": spec}
    if not os.path.isdir(context):
        raise NotADirectoryError("build context %s is not a directory" % context)
    body, content_type = multipart_build_body(spec, dockerfile, context, on_context)
    return {"body": body, "headers": {"Content-Type": content_type}, "timeout": long_timeout}



def _log_event(ev: Any) -> Tuple[Optional[str], Optional[TemplateBuild]]:
    """One event of a build's log stream: ``(line, None)``, ``(None, final build)``, or ``(None, None)`` to ignore."""
    if not isinstance(ev, Mapping):
        return None, None
    line = ev.get("line")
    if isinstance(line, str):
        return line, None
    if isinstance(ev.get("status"), str) and ev.get("status"):
        return None, TemplateBuild.from_dict(ev)
    return None, None


def _key_body(
    name: str,
    admin: bool,
    max_sandboxes: Optional[int],
    max_memory_mib: Optional[int],
    max_vcpus: Optional[int],
    max_disk_mib: Optional[int],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name, "admin": admin}
    for k, v in (
        ("max_sandboxes", max_sandboxes),
        ("max_memory_mib", max_memory_mib),
        ("max_vcpus", max_vcpus),
        ("max_disk_mib", max_disk_mib),
    ):
        if v is not None:
            body[k] = v
    return body


def _early_response(conn: http.client.HTTPConnection) -> Optional[PandaError]:
    """The error a server sent before it stopped reading our request body, if it can still be read."""
    try:
        if conn.sock is None:
            return None
        conn.sock.settimeout(2.0)
        resp = conn.getresponse()
        data = resp.read(64 << 10)
    except Exception:  # noqa: BLE001 - best effort only
        return None
    finally:
        conn.close()
    return _error_of(resp, data)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Report whether an idle connection was closed by the server (readable at EOF)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _normalize_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("the PandaStack API URL is empty (set %s or pass api_url=)" % ENV_API_URL)
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError("bad PandaStack API URL %r: want http(s)://host[:port]" % url)
    try:
        parts.port
    except ValueError as e:
        raise ConfigurationError("bad PandaStack API URL %r: %s" % (url, e)) from e
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _long(timeout: Timeout) -> Timeout:
    if timeout is None:
        return float("inf")
    return max(timeout, LONG_OPERATION_TIMEOUT)


def _fmt_timeout(t: Timeout) -> str:
    return "∞" if t is None else ("%g" % t)


_C = TypeVar("_C", bound=_Settings)


class _Defaults(Generic[_C]):
    """The clients of one class built from ``PANDASTACK_API_KEY``/``PANDASTACK_API_URL``:
    one per distinct pair of values, so connections are reused, and a change
    of the environment variables takes effect."""

    def __init__(self, make: Callable[..., _C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._clients: Dict[Tuple[Optional[str], Optional[str]], _C] = {}

    def get(self) -> _C:
        k = (os.environ.get(ENV_API_KEY) or None, os.environ.get(ENV_API_URL) or None)
        with self._lock:
            c = self._clients.get(k)
            if c is None:
                c = self._make()
                self._clients[k] = c
            return c

    def resolve(self, client: Optional[_C], api_key: Optional[str], api_url: Optional[str]) -> _C:
        """The client to use given the ``client=``, ``api_key=`` and ``api_url=`` arguments of a call."""
        if client is not None:
            if api_key is not None or api_url is not None:
                raise ValueError("pass either client= or api_key=/api_url=, not both")
            return client
        if api_key is None and api_url is None:
            return self.get()
        return self._make(api_key=api_key, api_url=api_url)


_defaults: "_Defaults[Client]" = _Defaults(Client)


def default_client() -> Client:
    """The client built from ``PANDASTACK_API_KEY``/``PANDASTACK_API_URL``.

    One client per distinct pair of values is kept, so connections are
    reused, and a change of the environment variables takes effect.
    """
    return _defaults.get()


def resolve_client(client: Optional[Client], api_key: Optional[str], api_url: Optional[str]) -> Client:
    """The client to use given the ``client=``, ``api_key=`` and ``api_url=`` arguments of a call."""
    return _defaults.resolve(client, api_key, api_url)
