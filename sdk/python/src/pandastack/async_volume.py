"""Asyncio volumes: :class:`AsyncVolume` and :class:`AsyncVolumeFiles`, the
twins of :class:`~pandastack.Volume` and :class:`~pandastack.VolumeFiles`:
the same attributes, and every call a coroutine."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from .async_client import AsyncClient, resolve_async_client
from .async_sandbox import AsyncFilesystem
from .filesystem import _Files
from .volume import DEFAULT_SIZE_MIB, Volume, _size_body, _volume_list, _volumes_path

__all__ = ["AsyncVolume", "AsyncVolumeFiles"]


class AsyncVolume:
    """A persistent volume, asyncio flavour. See :class:`~pandastack.Volume`.

    Example::

        vol = await AsyncVolume.create("data")
        await vol.files.write("/in.txt", "hello")
        sb = await AsyncSandbox.create(volumes={"/mnt/data": vol})
    """

    _set = Volume._set
    _path = Volume._path
    __repr__ = Volume.__repr__

    def __init__(self, data: Mapping[str, Any], client: AsyncClient) -> None:
        self._client = client
        self._set(data)
        self._files = AsyncVolumeFiles(self)

    @property
    def client(self) -> AsyncClient:
        """The client this volume's requests go through."""
        return self._client

    @property
    def files(self) -> "AsyncVolumeFiles":
        """The volume's files (:class:`AsyncVolumeFiles`)."""
        return self._files

    @classmethod
    async def create(
        cls,
        name: str,
        size_mib: int = DEFAULT_SIZE_MIB,
        *,
        client: Optional[AsyncClient] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "AsyncVolume":
        """Create an empty volume (see :meth:`Volume.create`)."""
        c = resolve_async_client(client, api_key, api_url)
        body = dict(_size_body(size_mib), name=name)
        return cls(await c.request_json("POST", _volumes_path(), json_body=body) or {}, c)

    @classmethod
    async def get(
        cls,
        name: str,
        *,
        client: Optional[AsyncClient] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "AsyncVolume":
        """Fetch a volume by name or id; :class:`NotFoundError` if there is none of yours."""
        c = resolve_async_client(client, api_key, api_url)
        return cls(await c.request_json("GET", _volumes_path(name)) or {}, c)

    @classmethod
    async def list(
        cls,
        *,
        client: Optional[AsyncClient] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "List[AsyncVolume]":
        """List your volumes."""
        c = resolve_async_client(client, api_key, api_url)
        return _volume_list(cls, c, await c.request_json("GET", _volumes_path()))

    async def refresh(self) -> "AsyncVolume":
        """Re-read this volume from the server; return ``self``."""
        self._set(await self._client.request_json("GET", self._path()) or {})
        return self

    async def resize(self, size_mib: int) -> "AsyncVolume":
        """Grow the volume's size limit (see :meth:`Volume.resize`); return ``self``."""
        self._set(await self._client.request_json("PATCH", self._path(), json_body=_size_body(size_mib)) or {})
        return self

    async def delete(self, force: bool = False) -> None:
        """Delete the volume (see :meth:`Volume.delete`)."""
        await self._client.request("DELETE", self._path(), query={"force": "true"} if force else None)

    async def promote(self) -> "AsyncVolume":
        """Make this branch's files its parent's and delete it; return the parent (see :meth:`Volume.promote`)."""
        return type(self)(await self._client.request_json("POST", self._path("/promote")) or {}, self._client)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (Volume, AsyncVolume)) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Volume", self.id))


class AsyncVolumeFiles(_Files):
    """The files of a volume, asyncio flavour: ``vol.files``. See :class:`~pandastack.VolumeFiles`."""

    _sb: AsyncVolume

    def _path(self, suffix: str = "") -> str:
        return self._sb._path("/files" + suffix)

    write = AsyncFilesystem.write
    read = AsyncFilesystem.read
    read_text = AsyncFilesystem.read_text
    download = AsyncFilesystem.download
    list = AsyncFilesystem.list
    stat = AsyncFilesystem.stat
    exists = AsyncFilesystem.exists
    mkdir = AsyncFilesystem.mkdir
    remove = AsyncFilesystem.remove
