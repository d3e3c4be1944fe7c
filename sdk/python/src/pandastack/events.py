"""The event stream of a key's sandboxes and snapshots (``client.events()``)
and a sandbox's command history (``sb.commands()``), blocking and asyncio.

The parsing of lines and entries is shared and pure (:func:`_event`,
:func:`_hello_seq`, :func:`_command_records`); the two stream classes only
read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

from .async_client import _AsyncLines
from .client import _Lines
from .errors import PandaConnectionError
from .models import SandboxInfo, _int, _opt_int, _opt_str, _str, parse_time

if TYPE_CHECKING:  # pragma: no cover
    from .async_client import AsyncClient
    from .client import Client

__all__ = ["Event", "EventStream", "AsyncEventStream", "CommandRecord", "EVENTS_IDLE_TIMEOUT"]

#: Seconds a stream may carry nothing, not even the server's ping (every
#: 15 s), before a read gives up (:class:`PandaConnectionError`).
EVENTS_IDLE_TIMEOUT = 45.0

_STREAM = {"headers": {"Accept": "application/x-ndjson"}, "timeout": EVENTS_IDLE_TIMEOUT}


@dataclass(frozen=True)
class Event:
    """A change of one of the key's sandboxes or snapshots.

    Attributes:
        type: ``"sandbox"`` (a sandbox's record changed: :attr:`sandbox`),
            ``"sandbox_deleted"`` (it stopped, :attr:`stop_reason` says why, or a
            failed create's record went), ``"snapshot"`` (:attr:`snapshot`),
            ``"snapshot_deleted"``, or ``"overflow"`` (the reader fell behind:
            the stream ends after it; list again and open a new one).
        seq: Increases by one per event of the server process (0 on overflow).
        time: When the server published it.
        id: The sandbox's or snapshot's id.
        sandbox: A ``"sandbox"`` event's :class:`SandboxInfo` (without ``memory``,
            ``stored`` and ``store_error``).
        snapshot: A ``"snapshot"`` event's :class:`Snapshot` (:class:`AsyncSnapshot`
            from an :class:`AsyncClient`), without ``stored`` and ``store_error``.
        stop_reason: A ``"sandbox_deleted"`` event's: why it stopped.
        raw: The JSON object as received.
    """

    type: str
    seq: int
    time: Optional[datetime]
    id: str = ""
    sandbox: Optional[SandboxInfo] = None
    snapshot: Any = None
    stop_reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _event(d: Any, snapshot: Callable[[Mapping[str, Any]], Any]) -> Optional[Event]:
    """A line of the stream as an :class:`Event`; ``None`` for a ping (or anything but an object)."""
    if not isinstance(d, Mapping) or d.get("type") == "ping":
        return None
    sb, sn = d.get("sandbox"), d.get("snapshot")
    return Event(
        type=_str(d.get("type")),
        seq=_int(d.get("seq")),
        time=parse_time(d.get("time")),
        id=_str(d.get("id")),
        sandbox=SandboxInfo.from_dict(sb) if isinstance(sb, Mapping) else None,
        snapshot=snapshot(sn) if isinstance(sn, Mapping) else None,
        stop_reason=_opt_str(d.get("stop_reason")),
        raw=dict(d),
    )


def _hello_seq(d: Any) -> int:
    """The ``seq`` of the stream's first line, which must be its hello."""
    if not isinstance(d, Mapping) or d.get("type") != "hello":
        raise PandaConnectionError("the event stream did not start with hello: %r" % (d,))
    return _int(d.get("seq"))


class EventStream(_Lines):
    """An open event stream (:meth:`Client.events`): an iterator of
    :class:`Event` for one thread; :meth:`close` from any thread (also
    ``with``). Iteration ends when the server ends the stream (the key was
    revoked, the server shut down, or after an ``"overflow"`` event)."""

    def __init__(self, client: "Client") -> None:
        from .snapshot import Snapshot

        super().__init__(client.stream("GET", "/v1/events", **_STREAM), lambda d: _event(d, lambda sn: Snapshot(sn, client)))
        try:
            #: The number of the last event before the stream began: the
            #: events it yields are the later ones.
            self.seq: int = _hello_seq(next(self._lines, None))
        except BaseException:
            self.close()
            raise

    def __next__(self) -> Event:
        return super().__next__()

    def close(self) -> None:
        """End the stream; a blocked iteration ends too."""
        self._stop()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncEventStream(_AsyncLines):
    """An open event stream, asyncio flavour (``await client.events()``):
    ``async for ev in stream``; ``await stream.close()`` (also ``async with``)."""

    #: The number of the last event before the stream began.
    seq: int = 0

    @classmethod
    async def _open(cls, client: "AsyncClient") -> "AsyncEventStream":
        from .snapshot import AsyncSnapshot

        s = cls(await client.stream("GET", "/v1/events", **_STREAM), lambda d: _event(d, lambda sn: AsyncSnapshot(sn, client)))
        try:
            s.seq = _hello_seq(await s._lines.__anext__())
        except StopAsyncIteration:
            await s.close()
            raise PandaConnectionError("the event stream ended before its hello") from None
        except BaseException:
            await s.close()
            raise
        return s

    async def __anext__(self) -> Event:
        return await super().__anext__()

    async def close(self) -> None:
        """End the stream."""
        await self._stop()

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


@dataclass(frozen=True)
class CommandRecord:
    """One command of a sandbox's history (``sb.commands()``).

    Attributes:
        n: Its number in the sandbox's history, from 1.
        kind: ``"exec"``, ``"process"`` (background) or ``"pty"``.
        command: The shell command as given, or argv joined by spaces (at most 1 KiB).
        pid: A process's or terminal's pid, else ``None``.
        started_at: When it started.
        finished_at, exit_code, duration_ms: ``None`` while it runs, or when its end is unknown.
        signal: The signal that ended it, if one did.
    """

    n: int
    kind: str
    command: str
    started_at: Optional[datetime]
    finished_at: Optional[datetime] = None
    exit_code: Optional[int] = None
    duration_ms: Optional[int] = None
    pid: Optional[int] = None
    signal: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CommandRecord":
        return cls(
            n=_int(d.get("n")),
            kind=_str(d.get("kind")),
            command=_str(d.get("command")),
            started_at=parse_time(d.get("started_at")),
            finished_at=parse_time(d.get("finished_at")),
            exit_code=_opt_int(d.get("exit_code")),
            duration_ms=_opt_int(d.get("duration_ms")),
            pid=_opt_int(d.get("pid")) or None,
            signal=_opt_str(d.get("signal")),
        )


def _command_records(body: Any) -> List[CommandRecord]:
    """The answer of ``GET /v1/sandboxes/{id}/commands``, oldest first."""
    items = body.get("commands") if isinstance(body, Mapping) else None
    return [CommandRecord.from_dict(c) for c in items or [] if isinstance(c, Mapping)]
