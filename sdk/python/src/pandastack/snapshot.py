"""Snapshots: saved sandboxes that new sandboxes can be created from."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from .client import Client, quote_segment, resolve_client
from .models import _int, _opt_int, _opt_str, _str, parse_time

if TYPE_CHECKING:  # pragma: no cover
    from .async_client import AsyncClient

__all__ = ["Snapshot", "AsyncSnapshot"]


class Snapshot:
    """A named, saved copy of a sandbox (memory, device state and disk).

    Get one from :meth:`Sandbox.snapshot`, :meth:`Snapshot.get` or
    :meth:`Snapshot.list`; start a sandbox from it with
    ``Sandbox.create(snapshot=snap.id)`` (or ``snapshot=snap``).

    Attributes:
        id: Snapshot id (lowercase letters and digits).
        name: Name given when it was taken, or ``None``.
        sandbox_id: The sandbox it was taken from.
        template: Template of that sandbox.
        memory_mib: Guest memory in MiB.
        vcpus: Guest vCPUs.
        created_at: When it was taken.
        size_bytes: Storage it uses, if the server reports it.
        stored: Where it is kept: ``"local"`` (only on its host's disk),
            ``"uploading"`` (being uploaded to the object store) or
            ``"durable"`` (in the object store); ``None`` if the server
            cannot tell. Call :meth:`refresh` to see it change.
        store_error: Why the last upload attempt failed, while uploading.
        raw: The JSON object as received.
    """

    def __init__(self, data: Mapping[str, Any], client: Client) -> None:
        self._client = client
        self._set(data)

    def _set(self, d: Mapping[str, Any]) -> None:
        self.id: str = _str(d.get("id"))
        self.name: Optional[str] = _opt_str(d.get("name"))
        self.sandbox_id: Optional[str] = _opt_str(d.get("sandbox_id"))
        self.template: str = _str(d.get("template"))
        self.memory_mib: int = _int(d.get("memory_mib"))
        self.vcpus: int = _int(d.get("vcpus"))
        self.created_at: Optional[datetime] = parse_time(d.get("created_at"))
        self.size_bytes: Optional[int] = _opt_int(d.get("size_bytes"))
        self.stored: Optional[str] = _opt_str(d.get("stored"))
        self.store_error: Optional[str] = _opt_str(d.get("store_error"))
        self.raw: Dict[str, Any] = dict(d)

    @property
    def client(self) -> Client:
        """The client this snapshot's requests go through."""
        return self._client

    @classmethod
    def get(
        cls,
        snapshot_id: str,
        *,
        client: Optional[Client] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "Snapshot":
        """Fetch a snapshot by id; raises :class:`NotFoundError` if it does not exist or is not yours.

        Example::

            snap = Snapshot.get("q8x2m4k9v1c7")
        """
        c = resolve_client(client, api_key, api_url)
        return cls(c.request_json("GET", "/v1/snapshots/%s" % quote_segment(snapshot_id)) or {}, c)

    @classmethod
    def list(
        cls,
        *,
        client: Optional[Client] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "List[Snapshot]":
        """List your snapshots.

        Example::

            for snap in Snapshot.list():
                print(snap.id, snap.name, snap.size_bytes)
        """
        c = resolve_client(client, api_key, api_url)
        body = c.request_json("GET", "/v1/snapshots") or {}
        return [cls(s, c) for s in body.get("snapshots") or []]

    def refresh(self) -> "Snapshot":
        """Re-read this snapshot from the server; return ``self``."""
        self._set(self._client.request_json("GET", "/v1/snapshots/%s" % quote_segment(self.id)) or {})
        return self

    def delete(self) -> None:
        """Delete this snapshot. Sandboxes created from it keep running.

        Raises :class:`NotFoundError` if it is already gone.
        """
        self._client.request("DELETE", "/v1/snapshots/%s" % quote_segment(self.id))

    def __repr__(self) -> str:
        return "Snapshot(id=%r, name=%r, sandbox_id=%r, template=%r, memory_mib=%r)" % (
            self.id,
            self.name,
            self.sandbox_id,
            self.template,
            self.memory_mib,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Snapshot", self.id))


class AsyncSnapshot:
    """The asyncio twin of :class:`Snapshot`: the same attributes; ``get``,
    ``list``, ``refresh`` and ``delete`` are coroutines.

    Example::

        snap = await sb.snapshot(name="after-setup")
        other = await AsyncSandbox.create(snapshot=snap)
    """

    _set = Snapshot._set
    __repr__ = Snapshot.__repr__

    def __init__(self, data: Mapping[str, Any], client: "AsyncClient") -> None:
        self._client = client
        self._set(data)

    @property
    def client(self) -> "AsyncClient":
        """The client this snapshot's requests go through."""
        return self._client

    @classmethod
    async def get(
        cls,
        snapshot_id: str,
        *,
        client: "Optional[AsyncClient]" = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "AsyncSnapshot":
        """Fetch a snapshot by id; raises :class:`NotFoundError` if it does not exist or is not yours."""
        from .async_client import resolve_async_client

        c = resolve_async_client(client, api_key, api_url)
        return cls(await c.request_json("GET", "/v1/snapshots/%s" % quote_segment(snapshot_id)) or {}, c)

    @classmethod
    async def list(
        cls,
        *,
        client: "Optional[AsyncClient]" = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "List[AsyncSnapshot]":
        """List your snapshots."""
        from .async_client import resolve_async_client

        c = resolve_async_client(client, api_key, api_url)
        body = await c.request_json("GET", "/v1/snapshots") or {}
        return [cls(s, c) for s in body.get("snapshots") or []]

    async def refresh(self) -> "AsyncSnapshot":
        """Re-read this snapshot from the server; return ``self``."""
        self._set(await self._client.request_json("GET", "/v1/snapshots/%s" % quote_segment(self.id)) or {})
        return self

    async def delete(self) -> None:
        """Delete this snapshot. Sandboxes created from it keep running. Raises :class:`NotFoundError` if it is already gone."""
        await self._client.request("DELETE", "/v1/snapshots/%s" % quote_segment(self.id))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (Snapshot, AsyncSnapshot)) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Snapshot", self.id))
