"""Incremental decoding of newline-delimited JSON (NDJSON) streams."""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, List


class NDJSONDecoder:
    """Split a byte stream into JSON values, one per line.

    Feed it chunks as they arrive with :meth:`feed`; a line split across
    chunks (even inside a multi-byte UTF-8 character) is kept until its end
    arrives. Blank lines and ``\\r\\n`` endings are accepted.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> List[Any]:
        """Add ``chunk`` and return the values of the lines it completed."""
        self._buf.extend(chunk)
        out: List[Any] = []
        start = 0
        while True:
            nl = self._buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(self._buf[start:nl])
            start = nl + 1
            value = _decode_line(line)
            if value is not None:
                out.append(value)
        if start:
            del self._buf[:start]
        return out

    def close(self) -> List[Any]:
        """Finish the stream: return the value of a last line without a newline, if any."""
        line = bytes(self._buf)
        self._buf.clear()
        value = _decode_line(line)
        return [] if value is None else [value]

    @property
    def pending(self) -> int:
        """Number of bytes buffered waiting for the end of their line."""
        return len(self._buf)


def _decode_line(line: bytes) -> Any:
    line = line.strip()
    if not line:
        return None
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("malformed NDJSON line from the server: %r" % line[:200]) from e


def iter_ndjson(chunks: Iterable[bytes]) -> Iterator[Any]:
    """Yield the JSON values of a stream given as an iterable of byte chunks."""
    dec = NDJSONDecoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.close()
