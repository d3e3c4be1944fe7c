"""Build contexts of Dockerfile builds: a directory streamed as a gzip-compressed
tar archive, with its ``.dockerignore`` applied by Docker's rules.

The rules are those of Docker's CLI (github.com/moby/patternmatcher and its
``ignorefile``), carried over line by line so that a context sent from Python
holds what ``docker build`` (and ``panda template build -f``) would send:

- lines starting with ``#`` are comments; blank lines are skipped; a leading
  ``/`` is dropped and each pattern is cleaned (``a/./b`` is ``a/b``);
- ``*`` matches within one path element, ``?`` one character of it, ``**``
  any number of elements (``**/x``, ``x/**``), ``[...]`` a character class,
  ``\\`` escapes the next character;
- a pattern excludes the paths it matches *and everything under them*;
  ``!pattern`` takes paths back; the last matching line wins;
- an excluded directory is still walked if an exception names something
  under it (``build`` then ``!build/keep.txt``).

Symbolic links are stored as links, never followed; devices, sockets and
pipes are left out. Nothing is read into memory beyond one chunk at a time.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import tarfile
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["ContextStats", "read_dockerignore", "PatternMatcher", "context_files", "tar_gz_stream"]

_CHUNK = 256 << 10


@dataclass
class ContextStats:
    """What a build context sent holds so far: entries and bytes of file contents."""

    files: int = 0
    bytes: int = 0


def read_dockerignore(text: str) -> List[str]:
    """The patterns of a ``.dockerignore`` file's text (``ignorefile.ReadAll``)."""
    out: List[str] = []
    for i, line in enumerate(text.splitlines()):
        if i == 0:
            line = line.lstrip("\ufeff")
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern[0] == "!"
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = _clean(pattern)
            if len(pattern) > 1 and pattern[0] == "/":
                pattern = pattern[1:]
        out.append("!" + pattern if invert else pattern)
    return out


def _clean(p: str) -> str:
    """Go's path.Clean (posixpath.normpath keeps a leading "//")."""
    c = posixpath.normpath(p)
    if c.startswith("//"):
        c = "/" + c.lstrip("/")
    return c


_EXACT, _PREFIX, _SUFFIX, _REGEXP = range(4)
_ESCAPE = set(".+()|{}$")


class _Pattern:
    def __init__(self, cleaned: str, exclusion: bool) -> None:
        self.cleaned = cleaned
        self.exclusion = exclusion
        self.kind, self.regexp = self._compile(cleaned)

    @staticmethod
    def _compile(pattern: str) -> Tuple[int, Optional["re.Pattern[str]"]]:
        reg = "^"
        kind = _EXACT
        i, n = 0, len(pattern)
        first = True
        while i < n:
            ch = pattern[i]
            i += 1
            if ch == "*":
                if i < n and pattern[i] == "*":
                    i += 1
                    if i < n and pattern[i] == "/":
                        i += 1
                    if i >= n:
                        if kind == _EXACT:
                            kind = _PREFIX
                        else:
                            reg += ".*"
                            kind = _REGEXP
                    else:
                        reg += "(.*/)?"
                        kind = _REGEXP
                    if first:
                        kind = _SUFFIX
                else:
                    reg += "[^/]*"
                    kind = _REGEXP
            elif ch == "?":
                reg += "[^/]"
                kind = _REGEXP
            elif ch in _ESCAPE:
                reg += "\\" + ch
            elif ch == "\\":
                if i < n:
                    reg += "\\" + pattern[i]
                    i += 1
                    kind = _REGEXP
                else:
                    reg += "\\\\"
            elif ch in "[]":
                reg += ch
                kind = _REGEXP
            else:
                reg += re.escape(ch) if ch not in "^-!" else ch
            first = False
        if kind == _REGEXP:
            try:
                return kind, re.compile(reg + "$", re.DOTALL)
            except re.error as e:
                raise ValueError(".dockerignore: bad pattern %r: %s" % (pattern, e)) from None
        return kind, None

    def match(self, path: str) -> bool:
        p = self.cleaned
        if self.kind == _EXACT:
            return path == p
        if self.kind == _PREFIX:
            return path.startswith(p[:-2])
        if self.kind == _SUFFIX:
            suffix = p[2:]
            if path.endswith(suffix):
                return True
            return suffix.startswith("/") and path == suffix[1:]
        assert self.regexp is not None
        return self.regexp.match(path) is not None


class PatternMatcher:
    """Docker's ``PatternMatcher``: which paths of a context a ``.dockerignore`` excludes."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns: List[_Pattern] = []
        self.exclusions = False
        for p in patterns:
            p = p.strip()
            if not p:
                continue
            p = _clean(p)
            exclusion = p[0] == "!"
            if exclusion:
                if len(p) == 1:
                    raise ValueError('.dockerignore: illegal exclusion pattern: "!"')
                p = p[1:]
                self.exclusions = True
            self.patterns.append(_Pattern(p, exclusion))

    def matches(self, path: str, parent: Optional[List[bool]] = None) -> Tuple[bool, List[bool]]:
        """Whether slash-separated ``path`` is excluded, given its parent
        directory's result (``MatchesUsingParentResults``); returns it with
        this path's result, for its children."""
        matched = False
        info = [False] * len(self.patterns)
        for i, pat in enumerate(self.patterns):
            match = bool(parent) and parent[i]  # type: ignore[index]
            if not match:
                if pat.exclusion != matched:
                    continue
                match = pat.match(path)
                if not match and not parent:
                    parts = posixpath.dirname(path).split("/") if "/" in path else []
                    for j in range(len(parts)):
                        if pat.match("/".join(parts[: j + 1])):
                            match = True
                            break
            info[i] = match
            if match:
                matched = not pat.exclusion
        return matched, info

    def may_reinclude(self, dir_path: str) -> bool:
        """Whether an exception may take back something under excluded directory ``dir_path``."""
        if not self.exclusions:
            return False
        prefix = dir_path + "/"
        return any(p.exclusion and (p.cleaned + "/").startswith(prefix) for p in self.patterns)


def _matcher(root: str) -> Optional[PatternMatcher]:
    try:
        with open(os.path.join(root, ".dockerignore"), encoding="utf-8", errors="surrogateescape") as f:
            patterns = read_dockerignore(f.read())
    except FileNotFoundError:
        return None
    return PatternMatcher(patterns) if patterns else None


def context_files(root: str) -> Iterator[Tuple[str, str, os.stat_result]]:
    """The entries of context directory ``root`` that its ``.dockerignore``
    leaves in, in walk order: ``(relative slash path, full path, lstat)``.
    Directories come before what they hold; symlinks are not followed."""
    if not os.path.isdir(root):
        raise NotADirectoryError("build context %s is not a directory" % root)
    pm = _matcher(root)
    parents = {"": None}  # type: dict

    def walk(rel_dir: str) -> Iterator[Tuple[str, str, os.stat_result]]:
        full_dir = os.path.join(root, rel_dir) if rel_dir else root
        with os.scandir(full_dir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = rel_dir + "/" + e.name if rel_dir else e.name
            st = os.lstat(e.path)
            is_dir = stat.S_ISDIR(st.st_mode)
            if pm is not None:
                skip, info = pm.matches(rel, parents.get(rel_dir))
                if is_dir:
                    parents[rel] = info
                if skip:
                    if is_dir and pm.may_reinclude(rel):
                        yield from walk(rel)
                    continue
            yield rel, e.path, st
            if is_dir:
                yield from walk(rel)

    yield from walk("")


def _tar_entries(root: str, stats: ContextStats, progress: Optional[Callable[[ContextStats], None]]) -> Iterator[bytes]:
    """The uncompressed tar archive of ``root``'s context, in pieces."""
    for rel, full, st in context_files(root):
        ti = tarfile.TarInfo(rel)
        ti.mode = stat.S_IMODE(st.st_mode)
        ti.mtime = int(st.st_mtime)
        size = 0
        if stat.S_ISDIR(st.st_mode):
            ti.type = tarfile.DIRTYPE
        elif stat.S_ISLNK(st.st_mode):
            ti.type = tarfile.SYMTYPE
            ti.linkname = os.readlink(full)
        elif stat.S_ISREG(st.st_mode):
            ti.type = tarfile.REGTYPE
            size = ti.size = st.st_size
        else:
            continue  # devices, sockets, pipes
        yield ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if size:
            left = size
            with open(full, "rb") as f:
                while left > 0:
                    chunk = f.read(min(_CHUNK, left))
                    if not chunk:  # it shrank: keep the header's size
                        chunk = b"\0" * min(_CHUNK, left)
                    left -= len(chunk)
                    stats.bytes += len(chunk)
                    yield chunk
            if size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
        stats.files += 1
        if progress is not None:
            progress(ContextStats(stats.files, stats.bytes))
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def tar_gz_stream(root: str, progress: Optional[Callable[[ContextStats], None]] = None, stats: Optional[ContextStats] = None) -> Iterator[bytes]:
    """Stream context directory ``root`` as a gzip-compressed tar archive.

    ``progress`` is called after each entry with the counts so far;
    ``stats``, if given, is updated as the archive is produced.
    """
    st = stats if stats is not None else ContextStats()
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    for piece in _tar_entries(root, st, progress):
        out = z.compress(piece)
        if out:
            yield out
    yield z.flush()
