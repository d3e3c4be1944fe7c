"""A minimal PEP 517/660 build backend for the pandastack package (standard library only).

Why not setuptools: PandaStack hosts are often offline, and pip's isolated
build would have to download setuptools and wheel. This backend needs
nothing, so ``pip install ./sdk/python`` (and ``pip install -e``) works
without network access. It packs ``src/pandastack`` into a pure-Python
wheel; name, version and the rest come from ``pyproject.toml``'s
``[project]`` table.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "pandastack"


def _project() -> Dict[str, str]:
    """The simple string fields of pyproject.toml's [project] table (tomllib is 3.11+ only)."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if not m:
        raise RuntimeError("pyproject.toml has no [project] table")
    out = {}
    for k, v in re.findall(r'^([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"\s*$', m.group(1), re.M):
        out[k] = v
    for k in ("name", "version"):
        if k not in out:
            raise RuntimeError("pyproject.toml [project] lacks %s" % k)
    return out


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % p["name"],
        "Version: %s" % p["version"],
    ]
    if "description" in p:
        lines.append("Summary: %s" % p["description"])
    if "requires-python" in p:
        lines.append("Requires-Python: %s" % p["requires-python"])
    if "license" in p:
        lines.append("License: %s" % p["license"])
    lines.append("Classifier: Programming Language :: Python :: 3")
    lines.append("Classifier: Typing :: Typed")
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _dist_info_name() -> str:
    p = _project()
    return "%s-%s.dist-info" % (p["name"].replace("-", "_"), p["version"])


def _wheel_name() -> str:
    p = _project()
    return "%s-%s-py3-none-any.whl" % (p["name"].replace("-", "_"), p["version"])


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, path on disk) of every file of the package, sorted."""
    base = os.path.join(ROOT, "src")
    out = []
    for root, dirs, files in os.walk(os.path.join(base, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            full = os.path.join(root, name)
            out.append((os.path.relpath(full, base).replace(os.sep, "/"), full))
    return out


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(wheel_directory: str, entries: List[Tuple[str, bytes]]) -> str:
    di = _dist_info_name()
    entries = list(entries) + [
        (di + "/METADATA", _metadata().encode("utf-8")),
        (di + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: pandastack_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (di + "/top_level.txt", (PACKAGE + "\n").encode()),
    ]
    record = "".join("%s,%s,%d\n" % (name, _hash(data), len(data)) for name, data in entries)
    record += di + "/RECORD,,\n"
    entries.append((di + "/RECORD", record.encode()))
    path = os.path.join(wheel_directory, _wheel_name())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return os.path.basename(path)


# -- PEP 517 hooks ------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[dict] = None) -> str:
    di = os.path.join(metadata_directory, _dist_info_name())
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(di, "WHEEL"), "w") as f:
        f.write("Wheel-Version: 1.0\nGenerator: pandastack_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return os.path.basename(di)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    entries = []
    for name, full in _package_files():
        with open(full, "rb") as f:
            entries.append((name, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    """PEP 660: a wheel holding a .pth file that puts src/ on sys.path."""
    pth = (os.path.join(ROOT, "src") + "\n").encode()
    return _write_wheel(wheel_directory, [("__editable__.%s.pth" % PACKAGE, pth)])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    p = _project()
    base = "%s-%s" % (p["name"].replace("-", "_"), p["version"])
    path = os.path.join(sdist_directory, base + ".tar.gz")
    files = ["pyproject.toml", "README.md", "_build/pandastack_build.py"]
    files += ["src/" + name for name, _ in _package_files()]
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            full = os.path.join(ROOT, rel)
            if os.path.exists(full):
                tar.add(full, arcname=base + "/" + rel, recursive=False)
        info = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(info)
        ti.mtime = int(time.time())
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(info))
    return os.path.basename(path)
