"""Test support: import path and a stub HTTP server for unit tests of pure client logic.

The stub only checks what the SDK puts on the wire (headers, URL, body
encoding) and how it maps answers (errors, streams); everything about real
behaviour is tested against a real `panda up` in test_integration.py.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


@dataclass
class Recorded:
    method: str
    target: str  # raw request target: path and query as sent
    headers: Dict[str, str]
    body: bytes
    chunked: bool
    chunk_sizes: List[int] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.split("?", 1)[1] if "?" in self.target else ""

    def json(self):
        return json.loads(self.body.decode("utf-8"))


# A route answers a request: it gets the recorded request and the handler,
# and writes the response itself.
Route = Callable[[Recorded, http.server.BaseHTTPRequestHandler], None]


class StubServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 with routes keyed by (method, path)."""

    def __init__(self) -> None:
        self.requests: List[Recorded] = []
        self.routes: Dict[Tuple[str, str], Route] = {}
        self.early_routes: Dict[Tuple[str, str], Route] = {}
        self.connections = 0
        self.closed = 0  # connections the server has closed (see wait_closed)
        self._closed_cond = threading.Condition()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                stub.connections += 1

            def _body(self) -> Tuple[bytes, bool, List[int]]:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    sizes = []
                    while True:
                        line = self.rfile.readline()
                        size = int(line.split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out), True, sizes
                        sizes.append(size)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n), False, []

            def _handle(self) -> None:
                early = stub.early_routes.get((self.command, self.path.split("?", 1)[0]))
                if early is not None:
                    # Answer without reading the body, then hang up, like a
                    # server rejecting an upload up front.
                    stub.requests.append(Recorded(self.command, self.path, dict(self.headers.items()), b"", False))
                    early(stub.requests[-1], self)
                    self.close_connection = True
                    return
                body, chunked, sizes = self._body()
                rec = Recorded(self.command, self.path, {k: v for k, v in self.headers.items()}, body, chunked, sizes)
                stub.requests.append(rec)
                route = stub.routes.get((self.command, rec.path))
                if route is None:
                    send_json(self, 404, {"error": {"code": "not_found", "message": "no stub route for %s %s" % (self.command, rec.path)}})
                    return
                route(rec, self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 256  # the asyncio tests connect 100 at once (the default backlog is 5)

            def shutdown_request(self, request) -> None:
                super().shutdown_request(request)
                with stub._closed_cond:
                    stub.closed += 1
                    stub._closed_cond.notify_all()

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def start(self) -> "StubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_closed(self, n: int, timeout: float = 30) -> None:
        """Wait until the server has closed n connections (a test's event
        to go on from, instead of a sleep); fail after timeout."""
        with self._closed_cond:
            if not self._closed_cond.wait_for(lambda: self.closed >= n, timeout):
                raise AssertionError("the stub closed %d connections in %d s, want %d" % (self.closed, timeout, n))

    def route(self, method: str, path: str, fn: Route) -> None:
        self.routes[(method, path)] = fn

    def json_route(self, method: str, path: str, status: int, obj) -> None:
        self.route(method, path, lambda rec, h: send_json(h, status, obj))

    @property
    def last(self) -> Recorded:
        return self.requests[-1]


def send_json(h: http.server.BaseHTTPRequestHandler, status: int, obj, close: bool = False, silent_close: bool = False) -> None:
    """Send ``obj`` as JSON. ``close`` announces ``Connection: close``;
    ``silent_close`` closes the connection after the answer without saying so
    (like a server's idle timeout firing right after)."""
    data = b"" if obj is None else json.dumps(obj).encode("utf-8")
    h.send_response(status)
    if obj is not None:
        h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    if close:
        h.send_header("Connection", "close")
        h.close_connection = True
    if silent_close:
        h.close_connection = True
    h.end_headers()
    h.wfile.write(data)
    h.wfile.flush()


def send_chunked(h: http.server.BaseHTTPRequestHandler, status: int, pieces: List[bytes], content_type: str = "application/x-ndjson", end: bool = True) -> None:
    """Send ``pieces`` as separate HTTP chunks, flushing each (so the client sees them split)."""
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Transfer-Encoding", "chunked")
    if not end:
        h.send_header("Connection", "close")
        h.close_connection = True
    h.end_headers()
    for p in pieces:
        if not p:
            continue
        h.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
        h.wfile.flush()
    if end:
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


SANDBOX = {
    "id": "abc123",
    "template": "tiny",
    "state": "running",
    "memory_mib": 256,
    "vcpus": 1,
    "created_at": "2025-01-02T03:04:05.123456789Z",
    "expires_at": "2025-01-02T04:04:05Z",
    "ttl_seconds": 3600,
    "metadata": {"a": "b"},
    "host_id": "local",
}
