"""A real `panda up` for integration tests.

Starts ``bin/panda up --data-dir <tmp> --listen 127.0.0.1:<free port>
--images ${PANDA_TEST_IMAGES:-/var/lib/pandastack/images} --accel tcg`` from
the repository root, waits for ``GET /healthz``, reads the admin key from
``<tmp>/admin.key``, and stops it with SIGTERM (then waits) at teardown.
Also what the integration modules share: ``start_module_server`` for their
``setUpModule``, ``create_tiny`` and ``tag``.

Environment:
    PANDA_BIN                 the binary (default <repo>/bin/panda)
    PANDA_TEST_IMAGES         guest images (default /var/lib/pandastack/images)
    PANDA_TEST_ACCEL          accelerator (default tcg)
    PANDA_TEST_TMPDIR         where to make the data directory (default: the system temp dir)
    PANDA_TEST_START_TIMEOUT  seconds to wait for /healthz (default 120)
    PANDA_TEST_KEEP=1         keep the data directory and server log
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from typing import Optional, Tuple

import _helpers  # noqa: F401  (import path)
from pandastack import Client, Sandbox

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PandaServer:
    """One `panda up` process with its own data directory."""

    def __init__(self) -> None:
        self.bin = os.environ.get("PANDA_BIN") or os.path.join(REPO, "bin", "panda")
        self.images = os.environ.get("PANDA_TEST_IMAGES") or "/var/lib/pandastack/images"
        self.accel = os.environ.get("PANDA_TEST_ACCEL") or "tcg"
        self.data_dir: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self.admin_key = ""
        self.log_path = ""
        self._log = None

    def start(self) -> "PandaServer":
        if not os.access(self.bin, os.X_OK):
            raise RuntimeError(
                "integration tests need the server binary at %s (build it with `make build` "
                "in %s, or set PANDA_BIN)" % (self.bin, REPO)
            )
        self.data_dir = tempfile.mkdtemp(prefix="panda-sdk-test-", dir=os.environ.get("PANDA_TEST_TMPDIR") or None)
        port = free_port()
        self.url = "http://127.0.0.1:%d" % port
        self.log_path = os.path.join(self.data_dir, "server.log")
        self._log = open(self.log_path, "wb")
        argv = [
            self.bin, "up",
            "--data-dir", self.data_dir,
            "--listen", "127.0.0.1:%d" % port,
            "--images", self.images,
            "--accel", self.accel,
            # Sandboxes of tests never reach the machine's uplink.
            "--network", "off",
            # The template tests' registries listen on loopback, which
            # builds may pull from only when the operator allows it.
            "--registry-allow-net", "127.0.0.1",
        ]  # fmt: skip
        env = dict(os.environ)
        for k in ("PANDA_DATA_DIR", "PANDASTACK_API_KEY", "PANDASTACK_API_URL"):
            env.pop(k, None)
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready(float(os.environ.get("PANDA_TEST_START_TIMEOUT") or 120))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("`panda up` exited with status %s before answering /healthz:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read().decode()).get("status") == "ok":
                        key_file = os.path.join(self.data_dir or "", "admin.key")
                        if os.path.exists(key_file):
                            with open(key_file) as f:
                                self.admin_key = f.read().strip()
                            if self.admin_key:
                                return
                        last = "no admin key in %s yet" % key_file
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError("`panda up` did not become ready within %gs (last: %s):\n%s" % (timeout, last, self.log_tail()))

    def log_tail(self, n: int = 60) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join("    | " + line for line in lines[-n:])

    def stop(self) -> None:
        """SIGTERM the server and wait for it (SIGKILL after 60 s); remove the data directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.data_dir and os.environ.get("PANDA_TEST_KEEP") != "1":
            self._remove_data_dir(self.data_dir)
            self.data_dir = None

    @staticmethod
    def _remove_data_dir(d: str) -> None:
        # The server loop-mounts an XFS image under the data directory when
        # it cannot reflink; it unmounts it on exit, but never delete through a
        # mount that was left behind.
        for root, dirs, _ in os.walk(d):
            for name in list(dirs):
                p = os.path.join(root, name)
                if os.path.ismount(p):
                    subprocess.run(["umount", p], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    if os.path.ismount(p):
                        print("warning: %s is still mounted; leaving %s in place" % (p, d))
                        return
        shutil.rmtree(d, ignore_errors=True)


def start_module_server() -> Tuple[PandaServer, Client]:
    """Start a server for a test module (call it from ``setUpModule``).

    Returns the server and an admin client (timeout 120 s); module cleanups
    close both, and run even if the start or a test fails.
    """
    srv = PandaServer()
    unittest.addModuleCleanup(srv.stop)
    srv.start()
    admin = Client(api_key=srv.admin_key, api_url=srv.url, timeout=120)
    unittest.addModuleCleanup(admin.close)
    return srv, admin


def create_tiny(client: Client, **kw) -> Sandbox:
    """A tiny sandbox (256 MiB, 10 min TTL) unless told otherwise."""
    kw.setdefault("template", "tiny")
    kw.setdefault("memory_mib", 256)
    kw.setdefault("ttl_seconds", 600)
    return Sandbox.create(client=client, **kw)


def tag() -> str:
    """A short random string that tells this run's names apart."""
    return secrets.token_hex(4)
