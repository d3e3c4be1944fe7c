"""Unit tests: the in-tree build backend produces an installable wheel with every module."""

import os
import sys
import tempfile
import unittest
import zipfile

import _helpers
import pandastack

ROOT = os.path.dirname(_helpers.SRC)
sys.path.insert(0, os.path.join(ROOT, "_build"))
import pandastack_build  # noqa: E402


class PackagingTest(unittest.TestCase):
    def test_version_matches_pyproject(self):
        self.assertEqual(pandastack_build._project()["version"], pandastack.__version__)
        self.assertEqual(pandastack_build._project()["name"], "pandastack")

    def test_license_metadata(self):
        self.assertEqual(pandastack_build._project()["license"], "Apache-2.0")
        self.assertIn("\nLicense: Apache-2.0\n", pandastack_build._metadata())
        with open(os.path.join(os.path.dirname(ROOT), "..", "LICENSE"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("Apache License", text)
        self.assertIn("Version 2.0, January 2004", text)
        self.assertIn("Copyright 2026 The PandaStack Authors", text)

    def test_wheel_contents(self):
        with tempfile.TemporaryDirectory() as d:
            name = pandastack_build.build_wheel(d)
            self.assertEqual(name, "pandastack-%s-py3-none-any.whl" % pandastack.__version__)
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                record = z.read("pandastack-%s.dist-info/RECORD" % pandastack.__version__).decode()
        for mod in ["__init__", "client", "errors", "models", "sandbox", "filesystem", "snapshot", "templates", "_ndjson", "async_client", "async_sandbox", "processes", "async_processes", "code_interpreter"]:
            self.assertIn("pandastack/%s.py" % mod, names)
        self.assertIn("pandastack/py.typed", names)
        self.assertFalse([n for n in names if "__pycache__" in n or "/." in n])
        for n in names:
            self.assertIn(n + ",", record)

    def test_sdist_builds(self):
        with tempfile.TemporaryDirectory() as d:
            name = pandastack_build.build_sdist(d)
            self.assertTrue(os.path.exists(os.path.join(d, name)))


if __name__ == "__main__":
    unittest.main()
