"""Integration tests of templates built from images and Dockerfiles, against a real `panda up`.

A real registry with a real image is not available from Python (the Go
tests of cmd/panda build one in process with go-containerregistry), so
these tests cover what a registry without the image gives: a stub registry
(below) answers the Docker registry API's ping and 404 MANIFEST_UNKNOWN for
every manifest, and the build must end failed with ``image_not_found``
through the SDK. That an image build succeeds and its sandboxes start is
tested by cmd/panda's TestTemplateFromImage. Builds with steps (a Dockerfile
FROM the built-in tiny) need no registry: they are built here for real.

Same server fixture and environment variables as sdk/python/tests/_server.py.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socketserver
import sys
import tempfile
import threading
import unittest
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _server import PandaServer, start_module_server, tag  # noqa: E402
from pandastack import (  # noqa: E402
    Client,
    ForbiddenError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    Template,
    TemplateBuildError,
)

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None


class EmptyRegistry:
    """A registry (plain HTTP on loopback) that holds no images."""

    def __init__(self) -> None:
        self.paths: List[str] = []
        reg = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                reg.paths.append(self.path)
                if self.path.rstrip("/") == "/v2":
                    status, body = 200, b"{}"
                else:
                    status = 404
                    body = json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = _answer

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.host = "127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


class TemplateBuildTest(unittest.TestCase):
    def test_missing_image_fails_with_image_not_found(self) -> None:
        reg = EmptyRegistry()
        self.addCleanup(reg.stop)
        name = "sdk-%s" % tag()
        ref = "%s/nope/app:1.0" % reg.host
        lines: List[str] = []
        with self.assertRaises(TemplateBuildError) as cm:
            Template.from_image(ref).build(name, on_log=lines.append, client=ADMIN)
        e = cm.exception
        self.assertEqual(e.code, "image_not_found", "error %r; log %r" % (e, lines))
        self.assertIn(ref, e.message)  # the image as the user wrote it
        self.assertEqual((e.build.status, e.build.name, e.build.from_image), ("failed", name, ref))
        self.assertTrue(lines, "no log lines")
        self.assertTrue(any("/v2/nope/app/manifests/1.0" in p for p in reg.paths), "registry saw %r" % reg.paths)

        # The build's status says the same, and no template came of it.
        got = ADMIN.get_template_build(e.build.build_id)
        self.assertEqual((got.status, got.code), ("failed", "image_not_found"))
        self.assertNotIn(name, [t.name for t in ADMIN.list_templates()])
        listed = ADMIN.list_template_builds(name)
        self.assertEqual([(b.build_id, b.status) for b in listed], [(e.build.build_id, "failed")])
        self.assertIn(e.build.build_id, [b.build_id for b in ADMIN.list_template_builds()])
        with self.assertRaises(NotFoundError):
            Sandbox.create(template=name, memory_mib=256, client=ADMIN)
        with self.assertRaises(NotFoundError):
            ADMIN.delete_template(name)

        # The log can be read again, from the first line, after the end.
        again = list(ADMIN.template_build_logs(e.build.build_id))
        self.assertEqual(again, lines)

    def test_refused_requests(self) -> None:
        with self.assertRaises(InvalidArgumentError):
            Template.from_image("/etc/passwd").build("sdk-%s" % tag(), client=ADMIN)
        with self.assertRaises(InvalidArgumentError):
            ADMIN.start_template_build("base", "127.0.0.1:1/x:1")  # a built-in name
        with self.assertRaises(InvalidArgumentError):
            ADMIN.delete_template("base")
        with self.assertRaises(NotFoundError):
            ADMIN.get_template_build("nosuchbuild")

        key = ADMIN.create_key("sdk-templates-%s" % tag())
        self.addCleanup(ADMIN.revoke_key, key.id)
        with Client(api_key=key.key, api_url=SERVER.url, timeout=30) as user:
            # Any key may build; publishing is for admin keys.
            with self.assertRaises(ForbiddenError):
                user.publish_template("whatever")
            with self.assertRaises(NotFoundError):
                user.delete_template("whatever")

    def test_steps_build_a_template(self) -> None:
        src = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, src)
        os.makedirs(os.path.join(src, "app"))
        with open(os.path.join(src, "app", "hello.txt"), "w") as f:
            f.write("hi from python\n")
        name = "sdk-steps-%s" % tag()
        self.addCleanup(lambda: ADMIN.delete_template(name, force=True))
        builder = (
            Template.from_image("tiny")
            .run("mkdir -p /srv && echo built > /srv/built")
            .copy(os.path.join(src, "app"), "/srv/app")
            .env(GREETING='hello "world" $HOME')
            .workdir("/srv")
        )
        lines: List[str] = []
        build = builder.build(name, on_log=lines.append, client=ADMIN)
        self.assertEqual((build.status, build.version), ("succeeded", 1), lines)
        with Sandbox.create(template=name, memory_mib=256, client=ADMIN) as sb:
            r = sb.exec("cat built app/hello.txt; echo \"$GREETING\"; pwd")
            self.assertEqual(r.stdout, 'built\nhi from python\nhello "world" $HOME\n/srv\n', r)

        # Again with the last step changed: the steps before it are cached.
        lines.clear()
        again = builder.run("echo second > /srv/second").build(name, on_log=lines.append, client=ADMIN)
        self.assertEqual(again.version, 2)
        self.assertGreaterEqual(sum(1 for l in lines if l.strip() == "cached"), 3, lines)

        # A failing step fails the build, naming it.
        with self.assertRaises(TemplateBuildError) as cm:
            Template.from_image("tiny").run("echo oops; exit 7").build("sdk-fail-%s" % tag(), client=ADMIN)
        self.assertIn("oops", cm.exception.message)
        self.assertIn("7", cm.exception.message)

    def test_builtin_template_by_name_is_listed(self) -> None:
        names = [t.name for t in ADMIN.list_templates()]
        self.assertIn("tiny", names)
        for t in ADMIN.list_templates():
            self.assertIsNone(t.image, t)


if __name__ == "__main__":
    unittest.main()
