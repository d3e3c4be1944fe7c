"""Unit tests of templates built from images and Dockerfiles, against the stub
HTTP server: the builder, the requests the client sends (JSON, and multipart
with a streamed context tar), the build's NDJSON log stream (including a
failed final status), errors, and .dockerignore matching with Docker's rules.
"""

import email.parser
import gzip
import io
import json
import os
import tarfile
import tempfile
import unittest
import shutil

from _helpers import StubServer, send_chunked, send_json
import pandastack
from pandastack import (
    Client,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PandaConnectionError,
    Template,
    TemplateBuild,
    TemplateBuilder,
    TemplateBuildError,
)

BUILD = {
    "build_id": "3f0c9d4e8a7b6c5d4e3f",
    "name": "myapp",
    "from_image": "registry.example.com/myapp:1.0",
    "status": "queued",
    "created_at": "2025-01-02T03:04:05.123456789Z",
}
LOGS = "/v1/templates/builds/3f0c9d4e8a7b6c5d4e3f/logs"


def ndjson(*objs) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


class TemplateStubTest(unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        self.stub.json_route("POST", "/v1/templates", 202, BUILD)

    def logs_route(self, pieces, end=True):
        self.stub.route("GET", LOGS, lambda rec, h: send_chunked(h, 200, pieces, end=end))

    def requests(self, method, path):
        return [r for r in self.stub.requests if r.method == method and r.path == path]


class BuilderTest(unittest.TestCase):
    def test_from_image_is_a_builder(self):
        b = Template.from_image("registry.example.com/app:1.0")
        self.assertIsInstance(b, TemplateBuilder)
        self.assertEqual(b.request_body("app"), {"name": "app", "from_image": "registry.example.com/app:1.0"})

    def test_start_cmd_with_ready(self):
        base = Template.from_image("r/app:1")
        b = base.start_cmd("python3 -m http.server 8000", ready="curl -sf localhost:8000", ready_timeout_seconds=30)
        got = b.request_body("app")
        want = {
            "name": "app",
            "from_image": "r/app:1",
            "start_cmd": "python3 -m http.server 8000",
            "ready_cmd": "curl -sf localhost:8000",
            "ready_timeout_seconds": 30,
        }
        self.assertEqual(got, want)
        # Builders are values: the one started from is unchanged.
        self.assertEqual(base.request_body("app"), {"name": "app", "from_image": "r/app:1"})
        self.assertEqual(base.start_cmd("srv").request_body("x"), {"name": "x", "from_image": "r/app:1", "start_cmd": "srv"})
        self.assertEqual(base.start_cmd("srv").ready_cmd("true").request_body("x")["ready_cmd"], "true")

    def test_bad_arguments(self):
        for bad in ("", "  ", None):
            with self.assertRaises(ValueError, msg="image %r" % (bad,)):
                Template.from_image(bad)
        b = Template.from_image("r/app:1")
        with self.assertRaises(ValueError):
            b.start_cmd("")
        with self.assertRaises(ValueError):
            b.start_cmd("srv", ready_timeout_seconds=5)  # a timeout for no ready command
        for bad in (0, -1, 1.5, True):
            with self.assertRaises(ValueError, msg="timeout %r" % (bad,)):
                b.ready_cmd("true", timeout_seconds=bad)

    def test_steps_make_a_dockerfile(self):
        src = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, src)
        with open(os.path.join(src, "f.txt"), "w") as f:
            f.write("x")
        b = Template.from_image("r/app:1")
        self.assertIsNone(b.effective_dockerfile())
        b2 = (
            b.run('echo "hi" && ls')
            .copy(os.path.join(src, "f.txt"), "/srv/f.txt", user="nobody:nogroup")
            .copy(src, "/srv/all/")
            .env(A='q"d$v\\b', B="2")
            .workdir("/srv")
            .user("nobody")
        )
        self.assertIsNone(b.effective_dockerfile(), "the first builder is unchanged")
        self.assertEqual(
            b2.effective_dockerfile(),
            "FROM r/app:1\n"
            'RUN ["/bin/sh", "-c", "echo \\"hi\\" && ls"]\n'
            'COPY --chown=nobody:nogroup ["copy-0/f.txt", "/srv/f.txt"]\n'
            'COPY ["copy-1/%s", "/srv/all/"]\n'
            'ENV A="q\\"d\\$v\\\\b" B="2"\n'
            "WORKDIR /srv\n"
            "USER nobody\n" % os.path.basename(src),
        )
        self.assertEqual(b2.copies, ((os.path.join(src, "f.txt"), "copy-0/f.txt"), (src, "copy-1/" + os.path.basename(src))))
        self.assertNotIn("from_image", b2.request_body("n"))
        # Without copies the Dockerfile goes in the JSON body.
        self.assertEqual(b.run("true").request_body("n")["dockerfile"], 'FROM r/app:1\nRUN ["/bin/sh", "-c", "true"]\n')
        # Steps after a Dockerfile's own lines; a copy inside its context is a path in it.
        d = Template.from_dockerfile("FROM tiny\n", context=src).copy(os.path.join(src, "f.txt"), "/f")
        self.assertEqual(d.effective_dockerfile(), 'FROM tiny\nCOPY ["f.txt", "/f"]\n')
        self.assertEqual(d.copies, ())

    def test_bad_steps_raise(self):
        b = Template.from_image("r/app:1")
        for call in (
            lambda: b.run(""),
            lambda: b.copy("/nonexistent/x", "/a"),
            lambda: b.copy("/etc/hostname", ""),
            lambda: b.copy("/etc/hostname", "/a", user="bad user"),
            lambda: b.env(),
            lambda: b.env({"1A": "x"}),
            lambda: b.env(A="line\nbreak"),
            lambda: b.workdir(""),
            lambda: b.user("a b"),
            lambda: Template.from_dockerfile("FROM tiny\n", context="/etc/ssl").copy("/etc/hostname", "/h"),
        ):
            with self.assertRaises((ValueError, FileNotFoundError, TypeError)):
                call()


class BuildTest(TemplateStubTest):
    def test_build_succeeds_with_logs(self):
        done = dict(BUILD, status="succeeded", digest="sha256:abc", started_at="2025-01-02T03:04:06Z", ended_at="2025-01-02T03:04:09Z")
        # Lines split across chunks, and a multi-byte character split too.
        body = ndjson({"line": "building template myapp"}, {"line": "pulling layer 1/2 (1.9 MiB) — ok"}, done)
        self.logs_route([body[:10], body[10:50], body[50:51], body[51:]])
        lines = []
        got = Template.from_image("registry.example.com/myapp:1.0").start_cmd("srv", ready="true").build("myapp", on_log=lines.append, client=self.client)
        self.assertEqual(lines, ["building template myapp", "pulling layer 1/2 (1.9 MiB) — ok"])
        self.assertIsInstance(got, TemplateBuild)
        self.assertTrue(got.succeeded and got.done)
        self.assertEqual((got.build_id, got.name, got.status, got.digest), ("3f0c9d4e8a7b6c5d4e3f", "myapp", "succeeded", "sha256:abc"))
        self.assertIsNotNone(got.ended_at)

        post = self.requests("POST", "/v1/templates")[0]
        self.assertEqual(post.headers["Authorization"], "Bearer sekret")
        self.assertEqual(post.headers["Content-Type"], "application/json")
        self.assertEqual(post.json(), {"name": "myapp", "from_image": "registry.example.com/myapp:1.0", "start_cmd": "srv", "ready_cmd": "true"})
        get = self.requests("GET", LOGS)[0]
        self.assertEqual(get.headers["Accept"], "application/x-ndjson")

    def test_build_fails_with_server_code(self):
        failed = dict(BUILD, status="failed", code="image_not_found", error="image registry.example.com/myapp:1.0 not found in its registry")
        self.logs_route([ndjson({"line": "building template myapp"}, failed)])
        lines = []
        with self.assertRaises(TemplateBuildError) as cm:
            self.client.build_template("myapp", "registry.example.com/myapp:1.0", on_log=lines.append)
        e = cm.exception
        self.assertIsInstance(e, pandastack.PandaError)
        self.assertEqual(e.code, "image_not_found")
        self.assertEqual(e.message, "image registry.example.com/myapp:1.0 not found in its registry")
        self.assertIsNone(e.status)
        self.assertEqual(e.build.status, "failed")
        self.assertIn("image_not_found", str(e))
        self.assertEqual(lines, ["building template myapp"])
        # Only the fields given are sent.
        self.assertEqual(self.requests("POST", "/v1/templates")[0].json(), {"name": "myapp", "from_image": "registry.example.com/myapp:1.0"})

    def test_failed_without_code_or_error(self):
        self.logs_route([ndjson(dict(BUILD, status="failed"))])
        with self.assertRaises(TemplateBuildError) as cm:
            Template.from_image("r/x:1").build("myapp", client=self.client)
        self.assertEqual(cm.exception.code, "build_failed")
        self.assertIn("myapp", cm.exception.message)

    def test_follow_does_not_raise_for_failed(self):
        self.logs_route([ndjson({"line": "a"}, dict(BUILD, status="failed", code="build_failed", error="boom"))])
        got = self.client.follow_template_build(BUILD["build_id"])
        self.assertEqual((got.status, got.code, got.error), ("failed", "build_failed", "boom"))
        self.assertFalse(got.succeeded)

    def test_logs_generator(self):
        done = dict(BUILD, status="succeeded")
        self.logs_route([ndjson({"line": "one"}, {"other": "ignored"}, {"line": "two"}, done)])
        self.assertEqual(list(self.client.template_build_logs(BUILD["build_id"])), ["one", "two"])

        def outer():
            final = yield from self.client.template_build_logs(BUILD["build_id"])
            return final

        gen = outer()
        self.assertEqual(next(gen), "one")
        self.assertEqual(next(gen), "two")
        with self.assertRaises(StopIteration) as cm:
            next(gen)
        self.assertEqual(cm.exception.value.status, "succeeded")

    def test_stream_ends_before_the_build(self):
        self.logs_route([ndjson({"line": "one"})])
        with self.assertRaises(PandaConnectionError) as cm:
            list(self.client.template_build_logs(BUILD["build_id"]))
        self.assertIn("ended before the build did", str(cm.exception))

    def test_refused_start_raises_api_error(self):
        self.stub.json_route("POST", "/v1/templates", 422, {"error": {"code": "invalid", "message": "from_image must be a registry reference"}})
        with self.assertRaises(InvalidArgumentError) as cm:
            Template.from_image("/etc/passwd").build("x", client=self.client)
        self.assertEqual((cm.exception.status, cm.exception.code), (422, "invalid"))
        self.assertEqual(self.requests("GET", LOGS), [])

    def test_logs_of_unknown_build(self):
        self.stub.json_route("GET", "/v1/templates/builds/nope/logs", 404, {"error": {"code": "not_found", "message": "no build nope"}})
        with self.assertRaises(NotFoundError):
            list(self.client.template_build_logs("nope"))


class OtherCallsTest(TemplateStubTest):
    def test_start_and_get_build(self):
        b = self.client.start_template_build("myapp", "r/app:1", ready_timeout_seconds=9)
        self.assertEqual((b.build_id, b.status, b.from_image), ("3f0c9d4e8a7b6c5d4e3f", "queued", "registry.example.com/myapp:1.0"))
        self.assertEqual(self.stub.last.json(), {"name": "myapp", "from_image": "r/app:1", "ready_timeout_seconds": 9})

        self.stub.json_route("GET", "/v1/templates/builds/3f0c9d4e8a7b6c5d4e3f", 200, dict(BUILD, status="running", started_at="2025-01-02T03:04:06Z"))
        got = self.client.get_template_build(b.build_id)
        self.assertEqual(got.status, "running")
        self.assertFalse(got.done)
        self.assertIsNotNone(got.started_at)
        self.assertEqual(self.stub.last.method, "GET")

    def test_build_id_is_quoted(self):
        self.stub.json_route("GET", "/v1/templates/builds/a%2Fb", 404, {"error": {"code": "not_found", "message": "no build"}})
        with self.assertRaises(NotFoundError):
            self.client.get_template_build("a/b")
        self.assertEqual(self.stub.last.target, "/v1/templates/builds/a%2Fb")

    def test_delete(self):
        self.stub.route("DELETE", "/v1/templates/myapp", lambda rec, h: send_json(h, 204, None))
        self.client.delete_template("myapp")
        self.assertEqual((self.stub.last.method, self.stub.last.target), ("DELETE", "/v1/templates/myapp"))
        self.client.delete_template("myapp", force=True)
        self.assertEqual(self.stub.last.target, "/v1/templates/myapp?force=true")

    def test_delete_conflict(self):
        self.stub.json_route("DELETE", "/v1/templates/myapp", 409, {"error": {"code": "conflict", "message": "sandboxes of template myapp are not stopped (1)"}})
        with self.assertRaises(ConflictError) as cm:
            self.client.delete_template("myapp")
        self.assertIn("not stopped", cm.exception.message)

    def test_list_shows_images(self):
        self.stub.json_route("GET", "/v1/templates", 200, {"templates": [
            {"name": "base", "state": "ready", "memory_mib": 1024, "vcpus": 1, "baked_at": "2025-01-02T03:04:05Z"},
            {"name": "myapp", "state": "not_baked", "memory_mib": 1024, "vcpus": 1, "baked_at": None,
             "from_image": "registry.example.com/myapp:1.0", "digest": "sha256:abc", "built_at": "2025-01-02T03:04:09Z"},
        ]})  # fmt: skip
        base, app = self.client.list_templates()
        self.assertIsNone(base.image)
        self.assertEqual((app.name, app.state, app.image, app.digest), ("myapp", "not_baked", "registry.example.com/myapp:1.0", "sha256:abc"))
        self.assertEqual(app.built_at.year, 2025)


from pandastack._buildcontext import PatternMatcher, context_files, read_dockerignore  # noqa: E402


def make_tree(test, files):
    """A temporary directory with files (path -> content; "->x" makes a symlink to x),
    removed when test ends."""
    d = tempfile.mkdtemp()
    test.addCleanup(shutil.rmtree, d)
    for p, content in files.items():
        full = os.path.join(d, p)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if content.startswith("->"):
            os.symlink(content[2:], full)
        else:
            with open(full, "w") as f:
                f.write(content)
    return d


TREE = {
    "Dockerfile": "FROM alpine\n", "app.py": "print(1)\n", "debug.log": "x",
    "build/out.bin": "bin", "build/keep.txt": "keep",
    "src/main.go": "package main", "src/secret": "s", "src/sub/secret": "s2",
    "link": "->/etc/passwd",
}  # fmt: skip


class DockerignoreTest(unittest.TestCase):
    """The same cases as the Go SDK's TestWriteContextTarDockerignore (moby/patternmatcher)."""

    def names(self, ignore):
        files = dict(TREE)
        if ignore is not None:
            files[".dockerignore"] = ignore
        d = make_tree(self, files)
        return sorted(rel + ("/" if os.path.isdir(full) and not os.path.islink(full) else "") for rel, full, _ in context_files(d))

    def test_context_files(self):
        cases = [
            ("no .dockerignore", None, ["Dockerfile", "app.py", "build/", "build/keep.txt", "build/out.bin", "debug.log", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"]),
            ("patterns", "# comment\n*.log\nbuild\n**/secret\n", [".dockerignore", "Dockerfile", "app.py", "link", "src/", "src/main.go", "src/sub/"]),
            ("exception under an excluded directory", "build\n!build/keep.txt\n", [".dockerignore", "Dockerfile", "app.py", "build/keep.txt", "debug.log", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"]),
            ("the last matching line wins", "*\n!src\nsrc/secret\n", ["src/", "src/main.go", "src/sub/", "src/sub/secret"]),
            ("leading slash and dot", "/app.py\n./debug.log\n.dockerignore\n", ["Dockerfile", "build/", "build/keep.txt", "build/out.bin", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"]),
        ]  # fmt: skip
        for name, ignore, want in cases:
            with self.subTest(name):
                self.assertEqual(self.names(ignore), want)

    def test_read_dockerignore(self):
        got = read_dockerignore("\ufeff# c\n\n  a/./b  \n!/c\n/d/\n  # not a comment\n")
        self.assertEqual(got, ["a/b", "!c", "d", "# not a comment"])

    def test_patterns(self):
        cases = [
            ("*.go", "main.go", True), ("*.go", "src/main.go", False), ("src/*.go", "src/main.go", True),
            ("**/*.go", "a/b/c.go", True), ("**/*.go", "c.go", True), ("a/**/b", "a/b", True), ("a/**/b", "a/x/y/b", True),
            ("a/**", "a/x", True), ("a?c", "abc", True), ("a?c", "a/c", False), ("[a-c]x", "bx", True), ("[a-c]x", "dx", False),
            ("a\\*b", "a*b", True), ("a\\*b", "axb", False), ("a.b", "axb", False), ("a+b", "a+b", True), ("**foo", "xfoo", True),
            ("dir", "dir/sub/file", True),  # a parent directory matches
        ]  # fmt: skip
        for pattern, path, want in cases:
            with self.subTest(pattern=pattern, path=path):
                got, _ = PatternMatcher([pattern]).matches(path)
                self.assertEqual(got, want)
        with self.assertRaises(ValueError):
            PatternMatcher(["!"])


def parse_multipart(rec):
    """The parts of a recorded multipart request: name -> bytes."""
    raw = b"Content-Type: " + rec.headers["Content-Type"].encode() + b"\r\n\r\n" + rec.body
    msg = email.parser.BytesParser().parsebytes(raw)
    return {p.get_param("name", header="content-disposition"): p.get_payload(decode=True) for p in msg.get_payload()}


class DockerfileBuildTest(TemplateStubTest):
    def finish(self):
        self.logs_route([ndjson({"line": "step 1"}, dict(BUILD, status="succeeded"))])

    def test_from_dockerfile_path_sends_context(self):
        d = make_tree(self, dict(TREE, **{".dockerignore": "*.log\nbuild\n"}))
        self.finish()
        seen = []
        b = (
            Template.from_dockerfile(os.path.join(d, "Dockerfile"))
            .build_arg("VERSION", "1").build_arg("VERSION", "2").build_arg("EMPTY", "")
            .start_cmd("srv", ready="true")
            .build("myapp", on_context=seen.append, client=self.client)
        )  # fmt: skip
        self.assertTrue(b.succeeded)
        rec = self.requests("POST", "/v1/templates")[0]
        self.assertTrue(rec.headers["Content-Type"].startswith("multipart/form-data; boundary="))
        self.assertTrue(rec.chunked, "the body is streamed")
        parts = parse_multipart(rec)
        self.assertEqual(list(parts), ["spec", "dockerfile", "context"])
        self.assertEqual(json.loads(parts["spec"]), {"name": "myapp", "build_args": {"VERSION": "2", "EMPTY": ""}, "start_cmd": "srv", "ready_cmd": "true"})
        self.assertEqual(parts["dockerfile"], b"FROM alpine\n")
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(parts["context"]))) as tf:
            members = {m.name: m for m in tf.getmembers()}
            self.assertEqual(sorted(members), [".dockerignore", "Dockerfile", "app.py", "link", "src", "src/main.go", "src/secret", "src/sub", "src/sub/secret"])
            self.assertTrue(members["link"].issym())
            self.assertEqual(members["link"].linkname, "/etc/passwd")
            self.assertEqual(tf.extractfile("app.py").read(), b"print(1)\n")
        self.assertEqual(seen[-1].files, 9)

    def test_from_dockerfile_text_without_context_is_json(self):
        self.finish()
        Template.from_dockerfile("FROM alpine:3.20\nRUN true\n").build_arg("A", "b").build("myapp", client=self.client)
        rec = self.requests("POST", "/v1/templates")[0]
        self.assertEqual(rec.json(), {"name": "myapp", "dockerfile": "FROM alpine:3.20\nRUN true\n", "build_args": {"A": "b"}})
        # A one-line Dockerfile is text too.
        self.assertEqual(Template.from_dockerfile("FROM alpine").dockerfile, "FROM alpine")

    def test_text_with_context(self):
        d = make_tree(self, {"a.txt": "a"})
        self.finish()
        Template.from_dockerfile("FROM alpine\nCOPY . /\n", context=d).build("myapp", client=self.client)
        parts = parse_multipart(self.requests("POST", "/v1/templates")[0])
        self.assertEqual(json.loads(parts["spec"]), {"name": "myapp"})
        self.assertEqual(parts["dockerfile"], b"FROM alpine\nCOPY . /\n")

    def test_refused_upload(self):
        d = make_tree(self, {"Dockerfile": "FROM x\n", "blob": "x" * (4 << 20)})
        self.stub.json_route("POST", "/v1/templates", 413, {"error": {"code": "payload_too_large", "message": "the build context is larger than this server accepts (2 GiB)"}})
        with self.assertRaises(pandastack.PayloadTooLargeError):
            Template.from_dockerfile(os.path.join(d, "Dockerfile")).build("myapp", client=self.client)

    def test_not_implemented(self):
        self.stub.json_route("POST", "/v1/templates", 501, {"error": {"code": "not_implemented", "message": "this server does not build templates from Dockerfiles yet"}})
        with self.assertRaises(pandastack.PandaError) as cm:
            Template.from_dockerfile("FROM alpine\n").build("myapp", client=self.client)
        self.assertEqual(cm.exception.code, "not_implemented")

    def test_bad_arguments(self):
        d = make_tree(self, {"f": "x"})
        with self.assertRaises(FileNotFoundError):
            Template.from_dockerfile(os.path.join(d, "missing"))
        with self.assertRaises(IsADirectoryError):
            Template.from_dockerfile(d)
        with self.assertRaises(NotADirectoryError):
            Template.from_dockerfile("FROM x\n", context=os.path.join(d, "f"))
        with self.assertRaises(ValueError):
            Template.from_dockerfile("FROM x\n").build_arg("1A", "x")
        with self.assertRaises(ValueError):
            Template.from_dockerfile("FROM x\n").build_arg("A", 1)
        with self.assertRaises(ValueError):
            Template.from_image("r/app:1").build_arg("A", "b")
        with self.assertRaises(ValueError):
            TemplateBuilder(image="r/app:1", dockerfile="FROM x")
        with self.assertRaises(ValueError):
            Template.from_dockerfile("\n \n")


if __name__ == "__main__":
    unittest.main()


class VersionsAndOwnersTest(TemplateStubTest):
    def test_listing_has_versions(self):
        self.stub.json_route("GET", "/v1/templates", 200, {"templates": [
            {"name": "tiny", "state": "ready", "memory_mib": 256, "vcpus": 1},
            {"name": "app", "state": "not_baked", "version": 2, "latest_version": 2, "public": False,
             "from_image": "r/app:2", "size_bytes": 1048576, "disk_bytes": 4096,
             "versions": [{"version": 1, "from_image": "r/app:1", "size_bytes": 10, "disk_bytes": 4096, "build_ms": 1200,
                           "built_at": "2025-01-02T03:04:05Z", "published": True},
                          {"version": 2, "from_image": "r/app:2", "size_bytes": 1048576, "disk_bytes": 4096, "build_ms": 900,
                           "built_at": "2025-01-03T03:04:05Z"}]},
        ]})
        tiny, app = self.client.list_templates()
        self.assertEqual((tiny.version, tiny.public, tiny.versions, tiny.ref), (None, None, [], "tiny"))
        self.assertEqual((app.version, app.latest_version, app.public, app.ref), (2, 2, False, "app:2"))
        self.assertEqual([(v.version, v.image, v.build_ms, v.published) for v in app.versions],
                         [(1, "r/app:1", 1200, True), (2, "r/app:2", 900, False)])
        self.assertIsInstance(app.versions[0], pandastack.TemplateVersion)
        self.assertIsNotNone(app.versions[0].built_at)

    def test_pinned_create_and_delete_of_a_version(self):
        self.stub.json_route("POST", "/v1/sandboxes", 201, {"id": "sb1", "state": "running", "template": "app:3"})
        sb = pandastack.Sandbox.create(template="app:3", client=self.client)
        self.assertEqual(self.stub.last.json()["template"], "app:3")
        self.assertEqual(sb.info.template, "app:3")
        self.stub.route("DELETE", "/v1/templates/app%3A3", lambda rec, h: h.send_response(204) or h.end_headers())
        self.client.delete_template("app:3")
        self.assertEqual(self.stub.last.target, "/v1/templates/app%3A3")

    def test_publish(self):
        for verb in ("publish", "unpublish"):
            self.stub.json_route("POST", "/v1/templates/app/" + verb, 200, {"name": "app", "public": verb == "publish"})
        self.client.publish_template("app")
        self.assertEqual(self.stub.last.target, "/v1/templates/app/publish")
        self.client.publish_template("app", public=False)
        self.assertEqual(self.stub.last.target, "/v1/templates/app/unpublish")
        # One version: NAME:N.
        self.stub.json_route("POST", "/v1/templates/app%3A2/publish", 200,
                             {"name": "app", "version": 2, "public": True, "published_versions": [2]})
        self.client.publish_template("app:2")
        self.assertEqual(self.stub.last.target, "/v1/templates/app%3A2/publish")

    def test_name_taken(self):
        self.stub.json_route("POST", "/v1/templates", 409, {"error": {"code": "conflict", "message": "the template name app is taken; pick another"}})
        with self.assertRaises(ConflictError):
            self.client.start_template_build("app", "r/app:1")

    def test_interrupted_build(self):
        b = TemplateBuild.from_dict(dict(BUILD, status="failed", code="interrupted", error="the server restarted during the build; start it again", version=None))
        self.assertEqual((b.code, b.version, b.succeeded), ("interrupted", None, False))
        self.assertEqual(TemplateBuild.from_dict(dict(BUILD, status="succeeded", version=4)).version, 4)

    def test_build_host(self):
        self.assertEqual(TemplateBuild.from_dict(dict(BUILD, host_id="agent-2")).host_id, "agent-2")
        self.assertIsNone(TemplateBuild.from_dict(BUILD).host_id)
