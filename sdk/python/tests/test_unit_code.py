"""Unit tests of the code interpreter's client side: the decoding of a cell's
event stream (every event type, base64 images, bad lines, a stream cut
before its end), the order of the callbacks, IPython's display hooks, the
checking of arguments, and what ``run_code`` and the context methods put on
the wire, blocking and asyncio, against the in-process stub server.

Real behaviour (real interpreters in a real guest) is tested by
code_integration.py, which cmd/panda's TestCodePythonSDK runs against a
server with sandbox networking.
"""

import asyncio
import base64
import json
import threading
import unittest

from _helpers import SANDBOX, StubServer, send_chunked
import pandastack
from pandastack import AsyncClient, AsyncSandbox, Client, CodeContext, Execution, ExecutionError, Logs, Result, Sandbox
from pandastack.code_interpreter import CodeRun, code_body

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg-bytes"
PDF = b"%PDF-1.4 tiny"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


FULL_BUNDLE = {
    "text/plain": "<Figure size 640x480 with 1 Axes>",
    "text/html": "<table><tr><td>1</td></tr></table>",
    "text/markdown": "# title",
    "image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'/>",
    "image/png": b64(PNG),
    "image/jpeg": b64(JPEG),
    "application/pdf": b64(PDF),
    "text/latex": "$x^2$",
    "application/json": {"a": [1, 2, None]},
    "application/javascript": "console.log(1)",
    "application/vnd.pandastack.data+json": {"x": [1, 2, 3], "y": ["a", "b", "c"]},
    "application/vnd.custom+json": {"k": "v"},
}
CHART = {"type": "line", "title": "sin", "elements": [{"label": "s", "points": [[0, 0.0], [1, 0.84]]}]}

EVENTS = [
    {"type": "stdout", "text": "hello\n"},
    {"type": "result", "is_main_result": False, "data": FULL_BUNDLE, "chart": CHART},
    {"type": "stderr", "text": "warn 🐼\n"},
    {"type": "a_future_event", "x": 1},
    {"type": "stdout", "text": "more\n"},
    {"type": "result", "is_main_result": True, "data": {"text/plain": "42"}},
    {"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback...\nZeroDivisionError: division by zero"},
    {"type": "end", "execution_count": 7, "context_id": "ctx-1", "duration_ms": 12, "truncated": True},
]


def feed(events, **callbacks) -> CodeRun:
    run = CodeRun("abc123", **callbacks)
    for ev in events:
        call = run.add(ev)
        if call is not None:
            call[0](call[1])
    return run


class EventsTest(unittest.TestCase):
    """CodeRun and the models: each event type decoded, every format."""

    def test_every_event_type(self):
        run = feed(EVENTS)
        self.assertTrue(run.done)
        ex = run.execution()
        self.assertIsInstance(ex, Execution)
        self.assertEqual(ex.logs, Logs(stdout=["hello\n", "more\n"], stderr=["warn 🐼\n"]))
        self.assertEqual(ex.error, ExecutionError("ZeroDivisionError", "division by zero", "Traceback...\nZeroDivisionError: division by zero"))
        self.assertEqual(str(ex.error), "ZeroDivisionError: division by zero")
        self.assertEqual((ex.execution_count, ex.context_id, ex.duration_ms, ex.truncated), (7, "ctx-1", 12, True))
        self.assertEqual(len(ex.results), 2)
        self.assertEqual(ex.text, "42")
        self.assertEqual([r.is_main_result for r in ex.results], [False, True])

    def test_every_format_of_a_result(self):
        r = feed(EVENTS[:2]).execution().results[0]
        self.assertEqual(r.text, "<Figure size 640x480 with 1 Axes>")
        self.assertEqual(r.html, "<table><tr><td>1</td></tr></table>")
        self.assertEqual(r.markdown, "# title")
        self.assertEqual(r.svg, "<svg xmlns='http://www.w3.org/2000/svg'/>")
        self.assertEqual(r.png, PNG)
        self.assertTrue(r.png.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertEqual(r.jpeg, JPEG)
        self.assertEqual(r.pdf, PDF)
        self.assertEqual(r.latex, "$x^2$")
        self.assertEqual(r.json, {"a": [1, 2, None]})
        self.assertEqual(r.javascript, "console.log(1)")
        self.assertEqual(r.data, {"x": [1, 2, 3], "y": ["a", "b", "c"]})
        self.assertEqual(r.chart, CHART)
        self.assertEqual(r.extra, {"application/vnd.custom+json": {"k": "v"}})
        self.assertEqual(r.mime, FULL_BUNDLE)
        self.assertEqual(r.raw["type"], "result")
        self.assertEqual(
            r.formats(),
            ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart", "application/vnd.custom+json"],
        )
        self.assertEqual(r["png"], PNG)
        self.assertEqual(r["image/png"], b64(PNG))
        with self.assertRaises(KeyError):
            r["nope"]
        self.assertEqual(str(r), "<Figure size 640x480 with 1 Axes>")
        self.assertIn("formats=", repr(r))
        self.assertNotIn(b64(PNG)[:20], repr(r))

    def test_a_result_with_few_formats(self):
        r = Result.from_dict({"type": "result", "data": {"image/png": b64(PNG)}})
        self.assertEqual((r.text, r.html, r.json, r.chart, r.is_main_result), (None, None, None, None, False))
        self.assertEqual(r.formats(), ["png"])
        self.assertEqual(str(r), repr(r))
        # A JSON null and false are values too.
        r = Result.from_dict({"data": {"application/json": False}})
        self.assertEqual((r.json, r.formats()), (False, ["json"]))

    def test_base64_with_line_breaks_is_decoded(self):
        wrapped = base64.encodebytes(PNG).decode("ascii")  # 76-column lines, as some kernels send
        self.assertIn("\n", wrapped)
        self.assertEqual(Result.from_dict({"data": {"image/png": wrapped}}).png, PNG)

    def test_malformed_results_raise(self):
        bad = [
            ({"data": {"image/png": "not base64!"}}, "image/png is not base64"),
            ({"data": {"image/jpeg": "abc"}}, "image/jpeg is not base64"),
            ({"data": {"text/html": 3}}, "text/html is no string"),
            ({"data": {"image/png": ["x"]}}, "image/png is no string"),
            ({"data": "text"}, "data is no object"),
            ({"data": {}, "chart": [1]}, "chart is no object"),
            ({"data": {}, "is_main_result": "yes"}, "is_main_result is no boolean"),
        ]
        for ev, want in bad:
            with self.subTest(ev=ev):
                with self.assertRaises(pandastack.PandaError) as cm:
                    Result.from_dict(dict(ev, type="result"))
                self.assertIn(want, str(cm.exception))

    def test_bad_events_raise(self):
        bad = [
            ("not an object", "no JSON object"),
            ([1, 2], "no JSON object"),
            ({"type": "stdout", "text": 5}, "stdout event (text is no string)"),
            ({"type": "stderr"}, "stderr event (text is no string)"),
            ({"type": "error", "name": 1, "value": "v"}, "error (name is no string)"),
            ({"type": "error", "name": "E", "traceback": ["a"]}, "error (traceback is no string)"),
            ({"type": "end", "execution_count": "3"}, "execution_count is no integer"),
            ({"type": "end", "execution_count": True}, "execution_count is no integer"),
        ]
        for ev, want in bad:
            with self.subTest(ev=ev):
                with self.assertRaises(pandastack.PandaError) as cm:
                    CodeRun("abc123").add(ev)
                self.assertIn(want, str(cm.exception))
                self.assertIn("malformed", str(cm.exception))

    def test_an_api_error_inside_the_stream_is_raised_as_its_class(self):
        with self.assertRaises(pandastack.ConflictError) as cm:
            CodeRun("abc123").add({"type": "error", "error": {"code": "conflict", "message": "sandbox stopped"}})
        self.assertEqual((cm.exception.message, cm.exception.status), ("sandbox stopped", 409))

    def test_lenient_where_harmless(self):
        # Missing optional fields read as empty; an end without a count is None.
        ex = feed([{"type": "error", "name": "KernelDied"}, {"type": "end"}]).execution()
        self.assertEqual(ex.error, ExecutionError("KernelDied", "", ""))
        self.assertEqual(str(ex.error), "KernelDied")
        self.assertEqual((ex.execution_count, ex.context_id, ex.duration_ms, ex.truncated, ex.text), (None, "", 0, False, None))
        # Events after the end are not taken.
        run = feed([{"type": "end", "execution_count": 1}, {"type": "stdout", "text": "late"}])
        self.assertEqual(run.execution().logs.stdout, [])

    def test_stream_without_end(self):
        run = feed(EVENTS[:3])
        self.assertFalse(run.done)
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            run.unfinished()
        self.assertIn("ended before the cell's end", str(cm.exception))
        self.assertIn("abc123", str(cm.exception))

    def test_stream_without_end_after_a_guest_error(self):
        run = feed(EVENTS[:1] + [{"type": "error", "name": "GuestError", "value": "the code server sent a line over 64 MiB", "traceback": ""}])
        with self.assertRaises(pandastack.PandaError) as cm:
            run.unfinished()
        e = cm.exception
        self.assertNotIsInstance(e, pandastack.PandaConnectionError)
        self.assertEqual((e.code, e.status), ("guest_error", 502))
        self.assertIn("the code server sent a line over 64 MiB", e.message)
        # A cell's own exception named GuestError, followed by output, is no guest failure.
        run = feed([{"type": "error", "name": "GuestError", "value": "mine"}, {"type": "stdout", "text": "x"}])
        with self.assertRaises(pandastack.PandaConnectionError):
            run.unfinished()

    def test_stream_without_end_after_the_servers_timeout(self):
        # The server interrupts a cell its guest let run past the timeout
        # and ends the stream with a TimeoutError: the cell's outcome.
        run = feed(EVENTS[:1] + [{"type": "error", "name": "TimeoutError", "value": "the cell ran past its timeout of 5s and was interrupted", "traceback": ""}])
        ex = run.unfinished()
        self.assertEqual(ex.error.name, "TimeoutError")
        self.assertEqual(ex.logs.stdout, ["hello\n"])
        self.assertIsNone(ex.execution_count)

    def test_callbacks_in_event_order(self):
        got = []
        feed(
            EVENTS,
            on_stdout=lambda s: got.append(("out", s)),
            on_stderr=lambda s: got.append(("err", s)),
            on_result=lambda r: got.append(("result", r.text)),
        )
        self.assertEqual(
            got,
            [("out", "hello\n"), ("result", "<Figure size 640x480 with 1 Axes>"), ("err", "warn 🐼\n"), ("out", "more\n"), ("result", "42")],
        )

    def test_code_context_model(self):
        c = CodeContext.from_dict({"id": "c1", "language": "python", "cwd": "/home/user", "state": "idle", "new": 1})
        self.assertEqual((c.id, c.language, c.cwd, c.state, c.raw["new"]), ("c1", "python", "/home/user", "idle", 1))


class DisplayHooksTest(unittest.TestCase):
    """The hooks IPython calls to display a Result in a notebook."""

    def test_each_hook_returns_its_format(self):
        r = feed(EVENTS[:2]).execution().results[0]
        want = {
            "_repr_html_": FULL_BUNDLE["text/html"],
            "_repr_markdown_": "# title",
            "_repr_svg_": FULL_BUNDLE["image/svg+xml"],
            "_repr_png_": PNG,
            "_repr_jpeg_": JPEG,
            "_repr_pdf_": PDF,
            "_repr_latex_": "$x^2$",
            "_repr_json_": {"a": [1, 2, None]},
            "_repr_javascript_": "console.log(1)",
        }
        for hook, value in want.items():
            with self.subTest(hook=hook):
                self.assertEqual(getattr(r, hook)(), value)

    def test_absent_formats_are_none(self):
        # IPython skips a format whose hook returns None.
        r = Result.from_dict({"data": {"text/plain": "2"}, "is_main_result": True})
        for hook in ("_repr_html_", "_repr_markdown_", "_repr_svg_", "_repr_png_", "_repr_jpeg_", "_repr_pdf_", "_repr_latex_", "_repr_json_", "_repr_javascript_"):
            self.assertIsNone(getattr(r, hook)(), hook)

    def test_mimebundle(self):
        r = feed(EVENTS[:2]).execution().results[0]
        bundle = r._repr_mimebundle_()
        self.assertEqual(bundle, FULL_BUNDLE)  # as Jupyter carries it: images in base64
        self.assertEqual(bundle["image/png"], b64(PNG))
        bundle["text/plain"] = "changed"
        self.assertEqual(r.text, "<Figure size 640x480 with 1 Axes>")  # a copy
        self.assertEqual(r._repr_mimebundle_(include=["image/png", "text/plain"]), {"image/png": b64(PNG), "text/plain": FULL_BUNDLE["text/plain"]})
        self.assertNotIn("image/png", r._repr_mimebundle_(exclude=["image/png"]))


class ArgumentsTest(unittest.TestCase):
    def test_body(self):
        self.assertEqual(code_body("1+1", None, None, None, None), {"code": "1+1"})
        self.assertEqual(
            code_body("x", "js", None, {"A": "1"}, 10),
            {"code": "x", "language": "js", "env": {"A": "1"}, "timeout_seconds": 10},
        )
        ctx = CodeContext("c1", "python", "/home/user", "idle")
        self.assertEqual(code_body("x", None, ctx, None, None), {"code": "x", "context_id": "c1"})
        self.assertEqual(code_body("x", None, "c2", None, None), {"code": "x", "context_id": "c2"})
        self.assertEqual(code_body("x", None, None, None, 2.5)["timeout_seconds"], 3)  # whole seconds, rounded up
        self.assertEqual(code_body("x", None, None, None, 3600)["timeout_seconds"], 3600)

    def test_bad_arguments(self):
        bad = [
            ((b"1+1", None, None, None, None), TypeError, "code must be a str"),
            (("x", "python", "c1", None, None), ValueError, "language or context, not both"),
            (("x", "python", CodeContext("c1", "python", "/home/user", "idle"), None, None), ValueError, "not both"),
            (("x", "", None, None, None), ValueError, "language must be"),
            (("x", 3, None, None, None), ValueError, "language must be"),
            (("x", None, 5, None, None), TypeError, "context must be a CodeContext or a context id"),
            (("x", None, "", None, None), ValueError, "context id is empty"),
            (("x", None, None, {"A": 1}, None), TypeError, "envs must map str to str"),
            (("x", None, None, ["A=1"], None), TypeError, "envs must be a mapping"),
            (("x", None, None, None, 0), ValueError, "timeout must be more than 0"),
            (("x", None, None, None, -1), ValueError, "timeout must be more than 0"),
            (("x", None, None, None, 3601), ValueError, "at most 3600"),
            (("x", None, None, None, True), TypeError, "timeout must be a number"),
            (("x", None, None, None, "5"), TypeError, "timeout must be a number"),
            (("x", None, None, None, float("nan")), TypeError, "timeout must be a number"),
        ]
        for args, exc, want in bad:
            with self.subTest(args=args):
                with self.assertRaises(exc) as cm:
                    code_body(*args)
                self.assertIn(want, str(cm.exception))


C = "/v1/sandboxes/abc123/code"
CONTEXT = {"id": "ctx-1", "language": "python", "cwd": "/tmp", "state": "idle"}


def ndjson(events, split=7):
    data = b"".join(json.dumps(e, ensure_ascii=False).encode("utf-8") + b"\n" for e in events)
    return [data[i : i + split] for i in range(0, len(data), split)]


class StubMixin:
    def route_events(self, events, split=7, end=True, tail=b""):
        pieces = ndjson(events, split) + ([tail] if tail else [])
        self.stub.route("POST", C, lambda rec, h: send_chunked(h, 200, pieces, end=end))

    def route_contexts(self):
        self.stub.json_route("POST", C + "/contexts", 201, CONTEXT)
        self.stub.json_route("GET", C + "/contexts", 200, {"contexts": [CONTEXT, dict(CONTEXT, id="python", cwd="/home/user")]})
        self.stub.json_route("POST", C + "/contexts/ctx-1/restart", 200, CONTEXT)
        self.stub.json_route("DELETE", C + "/contexts/ctx-1", 204, None)
        self.stub.json_route("POST", C + "/interrupt", 200, {"interrupted": True})


HTTP_ERRORS = [
    (400, "bad_request", pandastack.BadRequestError),
    (404, "not_found", pandastack.NotFoundError),
    (409, "conflict", pandastack.ConflictError),
    (422, "invalid", pandastack.InvalidArgumentError),
    (501, "not_implemented", pandastack.PandaError),
    (502, "guest_error", pandastack.PandaError),
]


class RunCodeTest(StubMixin, unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        self.sb = Sandbox.connect("abc123", client=self.client)

    def test_run_code_streams_to_callbacks_in_order(self):
        self.route_events(EVENTS)
        got = []
        ex = self.sb.run_code(
            "print('hello')",
            on_stdout=lambda s: got.append(("out", s)),
            on_stderr=lambda s: got.append(("err", s)),
            on_result=lambda r: got.append(("result", r.is_main_result)),
        )
        self.assertEqual(got, [("out", "hello\n"), ("result", False), ("err", "warn 🐼\n"), ("out", "more\n"), ("result", True)])
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.results[0].png, PNG)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertEqual((ex.execution_count, ex.context_id, ex.truncated), (7, "ctx-1", True))
        rec = self.stub.last
        self.assertEqual((rec.method, rec.path), ("POST", C))
        self.assertEqual(rec.json(), {"code": "print('hello')"})
        self.assertEqual(rec.headers["Accept"], "application/x-ndjson")
        self.assertEqual(rec.headers["Authorization"], "Bearer sekret")

    def test_body_with_every_argument(self):
        self.route_events([{"type": "end", "execution_count": 1}])
        self.sb.run_code("echo $A", language="bash", envs={"A": "1"}, timeout=5)
        self.assertEqual(self.stub.last.json(), {"code": "echo $A", "language": "bash", "env": {"A": "1"}, "timeout_seconds": 5})
        self.sb.run_code("x", context=CodeContext("ctx-1", "python", "/tmp", "idle"))
        self.assertEqual(self.stub.last.json(), {"code": "x", "context_id": "ctx-1"})

    def test_bad_arguments_send_nothing(self):
        n = len(self.stub.requests)
        with self.assertRaises(ValueError):
            self.sb.run_code("x", language="python", context="ctx-1")
        with self.assertRaises(ValueError):
            self.sb.run_code("x", timeout=0)
        self.assertEqual(len(self.stub.requests), n)

    def test_stream_without_end(self):
        # The body ends cleanly, but without the end event.
        self.route_events(EVENTS[:3])
        out = []
        with self.assertRaises(pandastack.PandaConnectionError) as cm:
            self.sb.run_code("x", on_stdout=out.append)
        self.assertIn("ended before the cell's end", str(cm.exception))
        self.assertEqual(out, ["hello\n"])  # what came before the cut was delivered
        # The connection breaks mid-body.
        self.route_events(EVENTS[:3], end=False)
        with self.assertRaises(pandastack.PandaConnectionError):
            self.sb.run_code("x")

    def test_timeout_error_then_no_end(self):
        self.route_events([{"type": "stdout", "text": "a"}, {"type": "error", "name": "TimeoutError", "value": "past its timeout", "traceback": ""}])
        ex = self.sb.run_code("x", timeout=1)
        self.assertEqual((ex.error.name, ex.logs.stdout), ("TimeoutError", ["a"]))

    def test_guest_error_then_no_end(self):
        self.route_events([{"type": "stdout", "text": "a"}, {"type": "error", "name": "GuestError", "value": "bad line from the guest", "traceback": ""}])
        with self.assertRaises(pandastack.PandaError) as cm:
            self.sb.run_code("x")
        self.assertEqual(cm.exception.code, "guest_error")
        self.assertIn("bad line from the guest", str(cm.exception))

    def test_malformed_line(self):
        self.route_events([{"type": "stdout", "text": "a"}], tail=b"{not json}\n")
        with self.assertRaises(pandastack.PandaError) as cm:
            self.sb.run_code("x")
        self.assertIn("no JSON", str(cm.exception))

    def test_http_errors_map_to_classes(self):
        for status, code, cls in HTTP_ERRORS:
            with self.subTest(code=code):
                self.stub.json_route("POST", C, status, {"error": {"code": code, "message": "m-" + code}})
                with self.assertRaises(cls) as cm:
                    self.sb.run_code("x")
                self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.message), (status, code, "m-" + code))

    def test_exception_in_a_callback_hangs_up(self):
        hung_up = threading.Event()

        def route(rec, h):
            h.send_response(200)
            h.send_header("Content-Type", "application/x-ndjson")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            line = json.dumps({"type": "stdout", "text": "x"}).encode() + b"\n"
            try:
                for _ in range(2000):
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    h.wfile.flush()
                    threading.Event().wait(0.005)
            except OSError:
                hung_up.set()
            h.close_connection = True

        self.stub.route("POST", C, route)

        def boom(s):
            raise RuntimeError("stop here")

        with self.assertRaisesRegex(RuntimeError, "stop here"):
            self.sb.run_code("while True: print('x')", on_stdout=boom)
        self.assertTrue(hung_up.wait(10), "the server kept writing to a stream the client left")

    def test_contexts(self):
        self.route_contexts()
        ctx = self.sb.create_code_context(language="python", cwd="/tmp")
        self.assertEqual(ctx, CodeContext("ctx-1", "python", "/tmp", "idle"))
        self.assertEqual((self.stub.last.method, self.stub.last.path, self.stub.last.json()), ("POST", C + "/contexts", {"language": "python", "cwd": "/tmp"}))
        self.sb.create_code_context()
        self.assertEqual(self.stub.last.json(), {})
        self.assertEqual([c.id for c in self.sb.list_code_contexts()], ["ctx-1", "python"])
        self.assertEqual(self.sb.restart_code_context(ctx).id, "ctx-1")
        self.assertEqual((self.stub.last.method, self.stub.last.path, self.stub.last.body), ("POST", C + "/contexts/ctx-1/restart", b""))
        self.assertIsNone(self.sb.remove_code_context("ctx-1"))
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("DELETE", C + "/contexts/ctx-1"))
        self.assertTrue(self.sb.interrupt_code())
        self.assertEqual((self.stub.last.path, self.stub.last.json()), (C + "/interrupt", {}))
        self.assertTrue(self.sb.interrupt_code(ctx))
        self.assertEqual(self.stub.last.json(), {"context_id": "ctx-1"})

    def test_context_ids_are_quoted_and_checked(self):
        self.stub.json_route("DELETE", C + "/contexts/a%2Fb", 404, {"error": {"code": "not_found", "message": "context a/b not found"}})
        with self.assertRaises(pandastack.NotFoundError):
            self.sb.remove_code_context("a/b")
        self.assertEqual(self.stub.last.target, C + "/contexts/a%2Fb")
        with self.assertRaises(TypeError):
            self.sb.restart_code_context(None)
        with self.assertRaises(ValueError):
            self.sb.create_code_context(cwd="")

    def test_bad_context_answers(self):
        self.stub.json_route("POST", C + "/contexts", 201, {"language": "python"})
        with self.assertRaisesRegex(pandastack.PandaError, "no code context"):
            self.sb.create_code_context()
        self.stub.json_route("GET", C + "/contexts", 200, [CONTEXT])
        with self.assertRaisesRegex(pandastack.PandaError, "no contexts list"):
            self.sb.list_code_contexts()


class AsyncRunCodeTest(StubMixin, unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = AsyncClient(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)

    async def asyncTearDown(self):
        await self.client.close()

    async def test_run_code_with_plain_and_async_callbacks(self):
        self.route_events(EVENTS)
        sb = await AsyncSandbox.connect("abc123", client=self.client)
        got = []

        async def on_result(r):
            await asyncio.sleep(0)
            got.append(("result", r.is_main_result))

        ex = await sb.run_code("x", on_stdout=lambda s: got.append(("out", s)), on_stderr=lambda s: got.append(("err", s)), on_result=on_result)
        self.assertEqual(got, [("out", "hello\n"), ("result", False), ("err", "warn 🐼\n"), ("out", "more\n"), ("result", True)])
        self.assertEqual((ex.text, ex.results[0].png, ex.error.name, ex.execution_count), ("42", PNG, "ZeroDivisionError", 7))

    async def test_errors(self):
        sb = await AsyncSandbox.connect("abc123", client=self.client)
        with self.assertRaises(ValueError):
            await sb.run_code("x", language="python", context="c")
        for end in (True, False):
            self.route_events(EVENTS[:2], end=end)
            with self.assertRaises(pandastack.PandaConnectionError):
                await sb.run_code("x")
        self.route_events([], tail=b"nope\n")
        with self.assertRaisesRegex(pandastack.PandaError, "no JSON"):
            await sb.run_code("x")
        for status, code, cls in HTTP_ERRORS:
            with self.subTest(code=code):
                self.stub.json_route("POST", C, status, {"error": {"code": code, "message": "m"}})
                with self.assertRaises(cls) as cm:
                    await sb.run_code("x")
                self.assertEqual(cm.exception.code, code)

    async def test_contexts(self):
        self.route_contexts()
        sb = await AsyncSandbox.connect("abc123", client=self.client)
        ctx = await sb.create_code_context("python", "/tmp")
        self.assertEqual(ctx.id, "ctx-1")
        self.assertEqual(len(await sb.list_code_contexts()), 2)
        self.assertEqual((await sb.restart_code_context(ctx)).id, "ctx-1")
        await sb.remove_code_context(ctx)
        self.assertTrue(await sb.interrupt_code("ctx-1"))


class SameWireTest(StubMixin, unittest.TestCase):
    """The blocking and asyncio sandboxes send the same code requests."""

    def test_requests_match(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        self.route_events([{"type": "end", "execution_count": 1}])
        self.route_contexts()

        with Client(api_key="k", api_url=self.stub.url) as c:
            sb = Sandbox.connect("abc123", client=c)
            sb.run_code("x = 'é'", language="python", envs={"A": "b"}, timeout=9.5)
            sb.run_code("y", context="ctx-1")
            sb.create_code_context("bash", "/tmp")
            sb.list_code_contexts()
            sb.restart_code_context("ctx-1")
            sb.remove_code_context("ctx-1")
            sb.interrupt_code("ctx-1")
        sync_reqs, self.stub.requests[:] = list(self.stub.requests), []

        async def go():
            async with AsyncClient(api_key="k", api_url=self.stub.url) as c:
                sb = await AsyncSandbox.connect("abc123", client=c)
                await sb.run_code("x = 'é'", language="python", envs={"A": "b"}, timeout=9.5)
                await sb.run_code("y", context="ctx-1")
                await sb.create_code_context("bash", "/tmp")
                await sb.list_code_contexts()
                await sb.restart_code_context("ctx-1")
                await sb.remove_code_context("ctx-1")
                await sb.interrupt_code("ctx-1")

        asyncio.run(go())
        skip = {"host", "connection", "accept-encoding"}
        self.assertEqual(len(self.stub.requests), len(sync_reqs))
        for got, want in zip(self.stub.requests, sync_reqs):
            self.assertEqual((got.method, got.target, got.body), (want.method, want.target, want.body))
            gh = {k.lower(): v for k, v in got.headers.items() if k.lower() not in skip}
            wh = {k.lower(): v for k, v in want.headers.items() if k.lower() not in skip}
            self.assertEqual(gh, wh)


if __name__ == "__main__":
    unittest.main()
