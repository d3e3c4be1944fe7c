"""Volumes: named, persistent directories that sandboxes mount.

A volume outlives every sandbox that mounts it: create it once, mount it
at a path of as many sandboxes as you like (``Sandbox.create(volumes=
{"/mnt/data": vol})``), and read or write its files through the API even
while no sandbox runs. See docs/volumes.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from .client import Client, quote_segment, resolve_client
from .filesystem import Filesystem, _Files
from .models import _int, _opt_str, _str, _str_list, parse_time

if TYPE_CHECKING:  # pragma: no cover
    from .async_client import AsyncClient
    from .async_volume import AsyncVolume

__all__ = ["Volume", "VolumeFiles", "VolumesArg", "DEFAULT_SIZE_MIB"]

#: The size a volume gets when :meth:`Volume.create` is not told one.
DEFAULT_SIZE_MIB = 1024

#: The volumes of :meth:`Sandbox.create`: a dict from the path the sandbox
#: sees to the volume (a :class:`Volume`, an :class:`AsyncVolume`, or its
#: name or id), e.g. ``{"/mnt/data": vol}``; or a list of dicts with
#: ``name`` (or ``volume``), ``path`` and optional ``read_only``.
VolumesArg = Union[Mapping[str, Any], Sequence[Mapping[str, Any]]]

_MOUNT_KEYS = ("name", "volume", "path", "read_only")


def _volume_name(v: Any, where: str) -> str:
    """The name (or id) a mount entry refers to: a volume object's id, or a non-empty str."""
    if isinstance(v, str):
        if not v:
            raise ValueError("%s: the volume name is empty" % where)
        return v
    vid = getattr(v, "id", None)
    if isinstance(vid, str) and vid and hasattr(v, "size_mib"):
        return vid
    raise ValueError("%s: a volume must be a Volume or its name, got %r" % (where, v))


def _mount_path(p: Any, where: str) -> str:
    if not isinstance(p, str) or not p.startswith("/"):
        raise ValueError("%s: the path must be an absolute path such as '/mnt/data', got %r" % (where, p))
    return p


def _volumes_body(volumes: Optional[VolumesArg]) -> Optional[List[Dict[str, Any]]]:
    """The ``volumes`` of a create body, or ``None`` to leave it out; ValueError on a malformed entry.

    The server checks the rest (at most 8, clean paths, no overlap, known
    volumes) and its message names the entry.
    """
    if volumes is None:
        return None
    out: List[Dict[str, Any]] = []
    if isinstance(volumes, Mapping):
        for path, v in volumes.items():
            where = "volumes[%r]" % (path,)
            out.append({"name": _volume_name(v, where), "path": _mount_path(path, where)})
        return out
    if isinstance(volumes, (str, bytes)) or not isinstance(volumes, Sequence):
        raise ValueError('volumes must be a dict such as {"/mnt/data": "data"} or a list of dicts, got %r' % (volumes,))
    for i, m in enumerate(volumes):
        where = "volumes[%d]" % i
        if not isinstance(m, Mapping):
            raise ValueError("%s: expected a dict with name, path and read_only, got %r" % (where, m))
        unknown = sorted(str(k) for k in m if k not in _MOUNT_KEYS)
        if unknown:
            raise ValueError("%s: unknown keys %s (known: name, path, read_only)" % (where, ", ".join(unknown)))
        if ("name" in m) == ("volume" in m):
            raise ValueError("%s: give the volume as name (or volume), once" % where)
        entry: Dict[str, Any] = {"name": _volume_name(m.get("name", m.get("volume")), where), "path": _mount_path(m.get("path"), where)}
        ro = m.get("read_only", False)
        if not isinstance(ro, bool):
            raise ValueError("%s: read_only must be True or False, got %r" % (where, ro))
        if ro:
            entry["read_only"] = True
        out.append(entry)
    return out


def _volume_mode(volumes: Optional[str]) -> Optional[str]:
    """The ``volume_mode`` of a fork body, or ``None`` to leave it out."""
    if volumes is None:
        return None
    if volumes in ("share", "branch"):
        return volumes
    raise ValueError('volumes must be "share" or "branch", got %r' % (volumes,))


def _size_body(size_mib: Any) -> Dict[str, Any]:
    if isinstance(size_mib, bool) or not isinstance(size_mib, int) or size_mib < 1:
        raise ValueError("size_mib must be a positive integer (MiB), got %r" % (size_mib,))
    return {"size_mib": size_mib}


def _volumes_path(name: str = "", suffix: str = "") -> str:
    if not name:
        return "/v1/volumes"
    return "/v1/volumes/%s%s" % (quote_segment(name), suffix)


def _volume_list(cls: Any, client: Any, data: Any) -> List[Any]:
    return [cls(v, client) for v in (data or {}).get("volumes") or [] if isinstance(v, Mapping)]


class Volume:
    """A persistent volume: a directory tree of its own, with a size limit,
    that sandboxes mount and the API reads and writes.

    Get one from :meth:`create`, :meth:`get` or :meth:`list`; mount it with
    ``Sandbox.create(volumes={"/mnt/data": vol})``.

    Attributes:
        id: Volume id (``vol_`` and 16 lowercase letters and digits).
        name: Its name, unique among your volumes.
        size_mib: Its size limit in MiB: writes beyond it fail (``ENOSPC``
            in a sandbox, :class:`InsufficientStorageError` through the API).
        used_bytes: Bytes its files take, as of the last call that returned it.
        created_at: When it was created.
        parent: The name of the volume it was branched from (a fork with
            ``volumes="branch"``), or ``None``.
        mounted_by: Ids of the sandboxes (not stopped) that mount it.
        files: Its files (:class:`VolumeFiles`).
        raw: The JSON object as received.

    Example::

        from pandastack import Sandbox, Volume

        vol = Volume.create("data", size_mib=2048)
        vol.files.write("/input.csv", "a,b\\n1,2\\n")
        with Sandbox.create(template="base", volumes={"/mnt/data": vol}) as sb:
            sb.exec("wc -l /mnt/data/input.csv")
    """

    def __init__(self, data: Mapping[str, Any], client: Client) -> None:
        self._client = client
        self._set(data)
        self._files = VolumeFiles(self)

    def _set(self, d: Mapping[str, Any]) -> None:
        self.id: str = _str(d.get("id"))
        self.name: str = _str(d.get("name"))
        self.size_mib: int = _int(d.get("size_mib"))
        self.used_bytes: int = _int(d.get("used_bytes"))
        self.created_at: Optional[datetime] = parse_time(d.get("created_at"))
        self.parent: Optional[str] = _opt_str(d.get("parent"))
        self.mounted_by: List[str] = _str_list(d.get("mounted_by"))
        self.raw: Dict[str, Any] = dict(d)

    def _path(self, suffix: str = "") -> str:
        return _volumes_path(self.id or self.name, suffix)

    @property
    def client(self) -> Client:
        """The client this volume's requests go through."""
        return self._client

    @property
    def files(self) -> "VolumeFiles":
        """The volume's files (:class:`VolumeFiles`)."""
        return self._files

    @classmethod
    def create(
        cls,
        name: str,
        size_mib: int = DEFAULT_SIZE_MIB,
        *,
        client: Optional[Client] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "Volume":
        """Create an empty volume of ``size_mib`` MiB (default 1024).

        ``name`` is 1 to 63 of lowercase letters, digits, ``.``, ``_`` and
        ``-``, starting with a letter or digit, unique among your volumes.

        Raises:
            ValueError: ``size_mib`` is not a positive integer.
            InvalidArgumentError: a bad name.
            ConflictError: you have a volume of that name.
            QuotaExceededError: over your key's volume count or disk quota.

        Example::

            vol = Volume.create("datasets", size_mib=10240)
        """
        c = resolve_client(client, api_key, api_url)
        body = dict(_size_body(size_mib), name=name)
        return cls(c.request_json("POST", _volumes_path(), json_body=body) or {}, c)

    @classmethod
    def get(
        cls,
        name: str,
        *,
        client: Optional[Client] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "Volume":
        """Fetch a volume by name or id; :class:`NotFoundError` if there is none of yours."""
        c = resolve_client(client, api_key, api_url)
        return cls(c.request_json("GET", _volumes_path(name)) or {}, c)

    @classmethod
    def list(
        cls,
        *,
        client: Optional[Client] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
    ) -> "List[Volume]":
        """List your volumes.

        Example::

            for v in Volume.list():
                print(v.name, v.used_bytes, "of", v.size_mib, "MiB")
        """
        c = resolve_client(client, api_key, api_url)
        return _volume_list(cls, c, c.request_json("GET", _volumes_path()))

    def refresh(self) -> "Volume":
        """Re-read this volume from the server (``used_bytes``, ``mounted_by``); return ``self``."""
        self._set(self._client.request_json("GET", self._path()) or {})
        return self

    def resize(self, size_mib: int) -> "Volume":
        """Grow the volume's size limit to ``size_mib`` MiB; return ``self``.

        Raises:
            InvalidArgumentError: ``size_mib`` is smaller than the volume's size
                (volumes only grow).
            QuotaExceededError: over your key's disk quota.
        """
        self._set(self._client.request_json("PATCH", self._path(), json_body=_size_body(size_mib)) or {})
        return self

    def delete(self, force: bool = False) -> None:
        """Delete the volume and its files.

        A volume that a sandbox (running or paused) mounts is not deleted
        (:class:`ConflictError`) unless ``force=True``; those sandboxes then
        see its files vanish. :class:`NotFoundError` if it is already gone.
        """
        self._client.request("DELETE", self._path(), query={"force": "true"} if force else None)

    def promote(self) -> "Volume":
        """Make this branch's files its parent's: the parent volume (the
        one this was branched from by a fork with ``volumes="branch"``) now
        holds this volume's tree, and this volume is deleted.

        Returns the parent :class:`Volume`. :class:`InvalidArgumentError` if
        this volume has no parent.

        Example::

            child = sb.fork(volumes="branch")
            child.exec("make -C /mnt/data")
            Volume.get(child.volumes[0].name).promote()
        """
        return type(self)(self._client.request_json("POST", self._path("/promote")) or {}, self._client)

    def __repr__(self) -> str:
        return "Volume(id=%r, name=%r, size_mib=%r, used_bytes=%r)" % (self.id, self.name, self.size_mib, self.used_bytes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Volume) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Volume", self.id))


class VolumeFiles(_Files):
    """The files of a volume: ``vol.files``. The same calls as a sandbox's
    :class:`Filesystem` (less ``watch_dir`` and ``rename``), served from
    the volume's own storage whether or not a sandbox mounts it.

    Paths are relative to the volume's root: ``"/a/b.txt"`` and
    ``"a/b.txt"`` are the same file, ``"/"`` is the root; no path leaves
    the volume (``..`` and symlinks pointing out are refused). A write that
    would take the volume over its size raises
    :class:`InsufficientStorageError` before anything is written.

    A write returns once the data is on the host's disk: a sandbox that
    opens the file afterwards sees it.

    Example::

        vol.files.write("/config/app.toml", "debug = true\\n")
        print([e.name for e in vol.files.list("/config")])
    """

    _sb: Volume

    def _path(self, suffix: str = "") -> str:
        return self._sb._path("/files" + suffix)

    write = Filesystem.write
    read = Filesystem.read
    read_text = Filesystem.read_text
    download = Filesystem.download
    list = Filesystem.list
    stat = Filesystem.stat
    exists = Filesystem.exists
    mkdir = Filesystem.mkdir
    remove = Filesystem.remove
