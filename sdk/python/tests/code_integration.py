"""Integration tests of the code interpreter (``sb.run_code`` and the code
contexts) against a real server.

Not collected by ``unittest discover`` (its name does not match
``test*.py``): it runs on the shared server of the code interpreter's Go
tests in cmd/panda, which bakes the code-interpreter template once for all
of them (a ``panda up`` of this suite's own would bake it again, minutes
under TCG). cmd/panda's TestCodePythonSDK runs this module inside the
network namespace of that server::

    PANDASTACK_API_URL=http://... PANDASTACK_API_KEY=... \\
        python3 -m unittest -v code_integration      # from sdk/python/tests

Environment:
    PANDASTACK_API_URL, PANDASTACK_API_KEY   the server (required)
    PANDASTACK_TEST_CODE_SANDBOX             a running code-interpreter sandbox to
                                             use (its owner kills it); without it
                                             the module creates one (512 MiB) and
                                             kills it at the end
"""

from __future__ import annotations

import asyncio
import os
import threading
import unittest
from typing import List, Optional

import _helpers  # noqa: F401  (import path)
import pandastack
from pandastack import AsyncClient, AsyncSandbox, Client, Result, Sandbox

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Guests run under TCG here: a Python context's start (numpy, pandas and
# matplotlib imported) takes long, so every wait is generous.
TIMEOUT = 900.0

CLIENT: Optional[Client] = None
SB: Optional[Sandbox] = None


def setUpModule() -> None:
    global CLIENT, SB
    missing = [k for k in ("PANDASTACK_API_URL", "PANDASTACK_API_KEY") if not os.environ.get(k)]
    if missing:
        raise RuntimeError(
            "code_integration needs a server: set %s (cmd/panda's TestCodePythonSDK runs it)" % " and ".join(missing)
        )
    CLIENT = Client(timeout=TIMEOUT)
    unittest.addModuleCleanup(CLIENT.close)
    sid = os.environ.get("PANDASTACK_TEST_CODE_SANDBOX")
    if sid:
        SB = Sandbox.connect(sid, client=CLIENT)
    else:
        SB = Sandbox.create(template="code-interpreter", memory_mib=512, ttl_seconds=1800, client=CLIENT)
        unittest.addModuleCleanup(SB.kill)
    if SB.info.template.split(":")[0] != "code-interpreter":
        raise RuntimeError("sandbox %s is of template %r, not code-interpreter" % (SB.id, SB.info.template))


def sb() -> Sandbox:
    assert SB is not None
    return SB


class PythonTest(unittest.TestCase):
    """Python in the sandbox's default context."""

    def test_state_across_calls(self):
        first = sb().run_code("state_x = 41")
        self.assertIsNone(first.error)
        self.assertEqual(first.results, [])  # an assignment displays nothing
        ex = sb().run_code("state_x + 1")
        self.assertIsNone(ex.error)
        self.assertEqual(ex.text, "42")
        self.assertEqual(len(ex.results), 1)
        self.assertTrue(ex.results[0].is_main_result)
        self.assertIsInstance(ex.execution_count, int)
        self.assertGreater(ex.execution_count, first.execution_count)
        self.assertTrue(ex.context_id)

    def test_stdout_and_stderr_callbacks(self):
        got: List[tuple] = []
        ex = sb().run_code(
            "import sys\nprint('to out')\nsys.stdout.flush()\nprint('to err', file=sys.stderr)\nsys.stderr.flush()\nprint('out again')",
            on_stdout=lambda s: got.append(("out", s)),
            on_stderr=lambda s: got.append(("err", s)),
        )
        self.assertIsNone(ex.error)
        self.assertEqual("".join(ex.logs.stdout), "to out\nout again\n")
        self.assertEqual("".join(ex.logs.stderr), "to err\n")
        self.assertEqual("".join(s for k, s in got if k == "out"), "to out\nout again\n")
        self.assertEqual("".join(s for k, s in got if k == "err"), "to err\n")
        self.assertEqual(got[0], ("out", "to out\n"))  # flushed before stderr was written

    def test_matplotlib_png(self):
        seen: List[Result] = []
        ex = sb().run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()",
            on_result=seen.append,
        )
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        pngs = [r for r in ex.results if r.png is not None]
        self.assertEqual(len(pngs), 1, ex.results)
        r = pngs[0]
        self.assertIsInstance(r.png, bytes)
        self.assertTrue(r.png.startswith(PNG_SIGNATURE), r.png[:16])
        self.assertGreater(len(r.png), 1000)
        self.assertFalse(r.is_main_result)
        self.assertIn("png", r.formats())
        self.assertEqual(r._repr_png_(), r.png)
        self.assertEqual(seen, ex.results)  # on_result got each result
        self.assertIsInstance(r.chart, dict, "a figure has its chart")
        self.assertEqual(r.chart.get("type"), "line")
        self.assertEqual(r.chart.get("title"), "squares")

    def test_dataframe_html(self):
        ex = sb().run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        main = [r for r in ex.results if r.is_main_result]
        self.assertEqual(len(main), 1, ex.results)
        r = main[0]
        self.assertIn("<table", r.html or "")
        self.assertEqual(r._repr_html_(), r.html)
        self.assertIn("a", r.text or "")
        self.assertEqual(r.data, {"a": [1, 2], "b": ["x", "y"]})

    def test_error_with_traceback(self):
        ex = sb().run_code("def f():\n    return 1 / 0\nf()")
        self.assertIsNotNone(ex.error)
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        self.assertIn("ZeroDivisionError", ex.error.traceback)
        self.assertIn("return 1 / 0", ex.error.traceback)
        self.assertNotIn("\x1b[", ex.error.traceback)  # no colour codes
        syntax = sb().run_code("def (")
        self.assertEqual(syntax.error.name, "SyntaxError")
        self.assertEqual(sb().run_code("'still alive'").text, "'still alive'")

    def test_envs_apply_to_the_cell_only(self):
        ex = sb().run_code("import os\nos.environ.get('PANDA_CODE_ENV', 'unset')", envs={"PANDA_CODE_ENV": "from the cell"})
        self.assertEqual(ex.text, "'from the cell'")
        self.assertEqual(sb().run_code("os.environ.get('PANDA_CODE_ENV', 'unset')").text, "'unset'")

    def test_timeout_interrupts_and_the_next_cell_runs(self):
        sb().run_code("timeout_kept = 'kept'")
        ex = sb().run_code("import time\nwhile True:\n    time.sleep(0.05)", timeout=3)
        self.assertIsNotNone(ex.error)
        self.assertEqual(ex.error.name, "TimeoutError")
        after = sb().run_code("timeout_kept")
        self.assertIsNone(after.error)
        self.assertEqual(after.text, "'kept'")

    def test_interrupt_code(self):
        started = threading.Event()
        box: dict = {}

        def run() -> None:
            try:
                box["ex"] = sb().run_code(
                    "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)",
                    on_stdout=lambda s: started.set(),
                    timeout=600,
                )
            except BaseException as e:  # noqa: BLE001 - reported by the test
                box["err"] = e
            finally:
                started.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.assertTrue(started.wait(TIMEOUT), "the cell never started")
        self.assertNotIn("err", box)
        self.assertTrue(sb().interrupt_code())
        t.join(TIMEOUT)
        self.assertFalse(t.is_alive(), "run_code did not return after the interrupt")
        self.assertNotIn("err", box)
        self.assertEqual(box["ex"].error.name, "KeyboardInterrupt")
        self.assertEqual(sb().run_code("1 + 1").text, "2")
        self.assertFalse(sb().interrupt_code())  # nothing runs now


class ContextsTest(unittest.TestCase):
    def test_contexts_create_list_restart_remove(self):
        sb().run_code("ctx_x = 'default'")
        ctx = sb().create_code_context(cwd="/tmp")
        removed = False

        def cleanup() -> None:
            if not removed:
                sb().remove_code_context(ctx)

        self.addCleanup(cleanup)
        self.assertEqual((ctx.language, ctx.cwd), ("python", "/tmp"))
        self.assertTrue(ctx.id)
        # Its own state and cwd.
        self.assertEqual(sb().run_code("ctx_x = 'mine'\nimport os\nos.getcwd()", context=ctx).text, "'/tmp'")
        self.assertEqual(sb().run_code("ctx_x", context=ctx.id).text, "'mine'")
        self.assertEqual(sb().run_code("ctx_x").text, "'default'")
        listed = {c.id: c for c in sb().list_code_contexts()}
        self.assertIn(ctx.id, listed)
        self.assertEqual((listed[ctx.id].language, listed[ctx.id].cwd, listed[ctx.id].state), ("python", "/tmp", "idle"))
        self.assertIn("python", {c.language for c in listed.values() if c.id != ctx.id})  # the default context
        # A restart forgets the state, keeps id, language and cwd.
        again = sb().restart_code_context(ctx)
        self.assertEqual((again.id, again.language, again.cwd), (ctx.id, "python", "/tmp"))
        self.assertEqual(sb().run_code("ctx_x", context=ctx).error.name, "NameError")
        # A cell that kills the interpreter leaves a dead context, restartable.
        died = sb().run_code("import os\nos._exit(1)", context=ctx)
        self.assertEqual(died.error.name, "KernelDied")
        self.assertEqual({c.id: c.state for c in sb().list_code_contexts()}[ctx.id], "dead")
        sb().restart_code_context(ctx.id)
        self.assertEqual(sb().run_code("40 + 2", context=ctx).text, "42")
        # Removed: gone from the list, and cells there are refused.
        sb().remove_code_context(ctx)
        removed = True
        self.assertNotIn(ctx.id, {c.id for c in sb().list_code_contexts()})
        with self.assertRaises(pandastack.NotFoundError):
            sb().run_code("1", context=ctx)
        with self.assertRaises(pandastack.NotFoundError):
            sb().remove_code_context(ctx)

    def test_bad_arguments(self):
        with self.assertRaises(pandastack.BadRequestError) as cm:
            sb().run_code("1", language="cobol")
        self.assertIn("cobol", str(cm.exception))
        with self.assertRaises(ValueError):
            sb().run_code("1", language="python", context="python")
        with self.assertRaises(pandastack.BadRequestError):
            sb().create_code_context(cwd="/no/such/directory")


class OtherLanguagesTest(unittest.TestCase):
    def test_bash(self):
        out: List[str] = []
        ex = sb().run_code("BASH_VAR=5\ncd /tmp\necho \"v=$BASH_VAR\"", language="bash", on_stdout=out.append)
        self.assertIsNone(ex.error)
        self.assertEqual("".join(out), "v=5\n")
        again = sb().run_code("echo \"$BASH_VAR $(pwd)\"; echo oops >&2", language="sh")
        self.assertEqual("".join(again.logs.stdout), "5 /tmp\n")
        self.assertEqual("".join(again.logs.stderr), "oops\n")
        failed = sb().run_code("false", language="bash")
        self.assertEqual((failed.error.name, failed.error.value), ("ExitError", "exit status 1"))

    def test_javascript(self):
        out: List[str] = []
        ex = sb().run_code("let jsA = 20;\nconsole.log('hi from node');\njsA + 1", language="javascript", on_stdout=out.append)
        self.assertIsNone(ex.error, ex.error)
        self.assertEqual("".join(out), "hi from node\n")
        self.assertEqual(ex.text, "21")
        self.assertEqual(sb().run_code("jsA * 2 + 2", language="js").text, "42")
        self.assertEqual(sb().run_code("Promise.resolve('awaited')", language="js").text, "'awaited'")  # a Promise is awaited
        err = sb().run_code("throw new TypeError('bad thing')", language="js")
        self.assertEqual((err.error.name, err.error.value), ("TypeError", "bad thing"))


class AsyncTest(unittest.TestCase):
    def test_async_twin(self):
        async def go() -> None:
            async with AsyncClient(timeout=TIMEOUT) as c:
                asb = await AsyncSandbox.connect(sb().id, client=c)
                got: List[str] = []

                async def on_stdout(s: str) -> None:
                    got.append(s)

                ex = await asb.run_code("async_y = 6 * 7\nprint('async out')\nasync_y", on_stdout=on_stdout)
                self.assertEqual((ex.text, "".join(got)), ("42", "async out\n"))
                ctx = await asb.create_code_context(language="bash")
                try:
                    self.assertEqual(ctx.language, "bash")
                    self.assertIn(ctx.id, [x.id for x in await asb.list_code_contexts()])
                    ex = await asb.run_code("echo $((6 * 7))", context=ctx)
                    self.assertEqual("".join(ex.logs.stdout), "42\n")
                finally:
                    await asb.remove_code_context(ctx)

        asyncio.run(go())


if __name__ == "__main__":
    unittest.main()
