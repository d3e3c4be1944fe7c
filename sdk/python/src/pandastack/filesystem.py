"""Files of a sandbox: ``sandbox.filesystem``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from .client import _Lines
from .errors import NotFoundError
from .models import FileInfo

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Filesystem", "WriteData"]

#: What :meth:`Filesystem.write` accepts: text (written as UTF-8), bytes, a
#: binary or text file-like object (streamed), or the path of a local file
#: (an :class:`os.PathLike`, streamed; a plain ``str`` is always content).
WriteData = Union[str, bytes, bytearray, memoryview, IO[bytes], IO[str], "os.PathLike[str]"]

_COPY_CHUNK = 1 << 20


def _mode_param(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, bool):
        raise TypeError("mode must be an int such as 0o755 or an octal string such as '755'")
    if isinstance(mode, int):
        if not 0 <= mode <= 0o7777:
            raise ValueError("mode %r is out of range (0 to 0o7777)" % mode)
        return format(mode, "o")
    if isinstance(mode, str):
        s = mode[2:] if mode.lower().startswith("0o") else mode
        try:
            v = int(s, 8)
        except ValueError:
            raise ValueError("mode %r is not an octal number such as '755'" % mode) from None
        return format(v, "o")
    raise TypeError("mode must be an int such as 0o755 or an octal string such as '755'")


def _write_query(path: str, mode: Union[int, str, None]) -> List[Tuple[str, str]]:
    query = [("path", path)]
    m = _mode_param(mode)
    if m is not None:
        query.append(("mode", m))
    return query


def _remove_query(path: str, recursive: bool) -> List[Tuple[str, Any]]:
    query: List[Tuple[str, Any]] = [("path", path)]
    if recursive:
        query.append(("recursive", True))
    return query


def _watch_request(path: str, recursive: bool) -> Dict[str, Any]:
    """The keyword arguments of the watch stream request, past method and path."""
    return {"query": {"path": path, "recursive": "true" if recursive else "false"}, "headers": {"Accept": "application/x-ndjson"}, "timeout": None}


def _discard(part: str) -> None:
    """Remove the ``.part`` file of a download that failed, if it is there."""
    try:
        os.unlink(part)
    except OSError:
        pass


def _entries(body: Any) -> List[FileInfo]:
    """The entries of a ``GET .../files/list`` answer."""
    return [FileInfo.from_dict(e) for e in (body or {}).get("entries") or []]


class _Files:
    """What :class:`Filesystem` and :class:`~pandastack.AsyncFilesystem` share: their sandbox and the paths of its file API."""

    _sb: Any

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _path(self, suffix: str = "") -> str:
        return self._sb._path("/files" + suffix)


class Filesystem(_Files):
    """Read and write files in a sandbox. Get it as ``sandbox.filesystem``.

    Every path is absolute inside the sandbox (a relative path raises
    :class:`InvalidArgumentError`). A missing file raises :class:`NotFoundError`.
    """

    _sb: "Sandbox"

    def write(self, path: str, data: WriteData, mode: Union[int, str, None] = None) -> FileInfo:
        """Write a file, replacing it if it exists; parent directories are created.

        ``data`` may be ``str`` (UTF-8), ``bytes``, a file-like object (read in
        1 MiB chunks and streamed, never read whole into memory; a text file is
        encoded as UTF-8), or an :class:`os.PathLike` naming a local file to
        upload. ``mode`` is the permission bits: ``0o755`` or ``"755"``
        (default 644). The server writes to a temporary name and renames it
        into place, so a failed upload never leaves a partial file.

        Returns the written file's :class:`FileInfo`.

        Example::

            sb.filesystem.write("/work/hello.py", "print('hi')\\n")
            with open("dataset.bin", "rb") as f:
                sb.filesystem.write("/work/dataset.bin", f)
        """
        query = _write_query(path, mode)
        if isinstance(data, os.PathLike):
            with open(os.fspath(data), "rb") as f:
                body = self._sb._client.request_json("PUT", self._path(), query=query, body=f)
        else:
            body = self._sb._client.request_json("PUT", self._path(), query=query, body=data)
        return FileInfo.from_dict(body or {})

    def read(self, path: str) -> bytes:
        """Return the contents of a file as bytes (in memory; use :meth:`download` for big files)."""
        _, _, data = self._sb._client.request("GET", self._path(), query={"path": path})
        return data

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Return the contents of a file decoded as text (UTF-8 by default)."""
        return self.read(path).decode(encoding, errors)

    def download(self, path: str, dest: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Stream a file to ``dest`` without holding it in memory; return the number of bytes.

        ``dest`` is a local path or a binary file-like object with ``write``.
        A local path is written as ``<dest>.part`` and renamed when complete,
        so a broken download leaves no truncated file behind.

        Example::

            n = sb.filesystem.download("/work/out.tar", "out.tar")
        """
        client = self._sb._client
        with client.stream("GET", self._path(), query={"path": path}) as resp:
            if hasattr(dest, "write"):
                return _copy(resp, dest)  # type: ignore[arg-type]
            target = os.fspath(dest)
            part = target + ".part"
            try:
                with open(part, "wb") as f:
                    n = _copy(resp, f)
                os.replace(part, target)
                return n
            except BaseException:
                _discard(part)
                raise

    def watch_dir(self, path: str, recursive: bool = False) -> "DirWatch":
        """Watch a directory: returns once the watch is in place.

        Iterate the handle for :class:`WatchEvent` objects, in order, as
        they happen; iteration ends when :meth:`DirWatch.stop` is called
        (from any thread) or the directory is removed. ``recursive`` covers
        the directories under it too (at most 8192). Events a slow reader
        does not take in time are dropped in the sandbox, and an event of
        type ``"overflow"`` says so.

        Example::

            with sb.filesystem.watch_dir("/work", recursive=True) as w:
                for ev in w:
                    print(ev.type, ev.path)

        Raises:
            NotFoundError: no such directory.
            InvalidArgumentError: not a directory, or too many directories.
        """
        return DirWatch(self._sb._client.stream("GET", self._sb._path("/watch"), **_watch_request(path, recursive)))

    def list(self, path: str) -> List[FileInfo]:
        """List a directory's entries, sorted by name."""
        return _entries(self._sb._client.request_json("GET", self._path("/list"), query={"path": path}))

    def stat(self, path: str) -> FileInfo:
        """Describe a file or directory (a final symlink is not followed)."""
        return FileInfo.from_dict(self._sb._client.request_json("GET", self._path("/stat"), query={"path": path}) or {})

    def exists(self, path: str) -> bool:
        """Report whether ``path`` exists (a dangling symlink exists)."""
        try:
            self.stat(path)
            return True
        except NotFoundError:
            # An unknown sandbox is an error, not a missing file: the sandbox
            # lookup raises NotFoundError itself if it is the sandbox that is gone.
            self._sb._client.request("GET", self._sb._path(""))
            return False

    def mkdir(self, path: str) -> FileInfo:
        """Create a directory and its missing parents (like ``mkdir -p``); an existing directory is fine."""
        return FileInfo.from_dict(self._sb._client.request_json("POST", self._path("/mkdir"), json_body={"path": path}) or {})

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file or an empty directory; ``recursive=True`` removes a directory and everything in it.

        A non-empty directory without ``recursive`` raises :class:`ConflictError`.
        """
        self._sb._client.request("DELETE", self._path(), query=_remove_query(path, recursive))

    def rename(self, src: str, dst: str) -> FileInfo:
        """Rename or move ``src`` to ``dst``; return the file at its new path."""
        body = self._sb._client.request_json("POST", self._path("/rename"), json_body={"from": src, "to": dst})
        return FileInfo.from_dict(body or {})


def _copy(resp: Any, out: IO[bytes]) -> int:
    n = 0
    for chunk in resp.iter_chunks(_COPY_CHUNK):
        out.write(chunk)
        n += len(chunk)
    return n



@dataclass(frozen=True)
class WatchEvent:
    """One change in a watched directory.

    Attributes:
        type: ``"create"``, ``"write"``, ``"remove"``, ``"rename"``,
            ``"chmod"``, or ``"overflow"`` (events were lost; no path).
        path: The file or directory (for a rename, its new path).
        old_path: A rename's old path.
        is_dir: Whether ``path`` is a directory.
    """

    type: str
    path: str = ""
    old_path: str = ""
    is_dir: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WatchEvent":
        return cls(
            type=str(d.get("type") or ""),
            path=str(d.get("path") or ""),
            old_path=str(d.get("old_path") or ""),
            is_dir=bool(d.get("is_dir")),
        )


def _watch_event(d: Any) -> Optional[WatchEvent]:
    return WatchEvent.from_dict(d) if isinstance(d, Mapping) else None


class DirWatch(_Lines):
    """A running directory watch (:meth:`Filesystem.watch_dir`): an iterator
    of :class:`WatchEvent`, for one thread; :meth:`stop` from any thread."""

    def __init__(self, resp: Any) -> None:
        super().__init__(resp, _watch_event)

    def __next__(self) -> WatchEvent:
        return super().__next__()

    def stop(self) -> None:
        """End the watch; a blocked iteration ends too."""
        self._stop()

    def __enter__(self) -> "DirWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
