"""Unit tests: configuration precedence, URL normalization, query and path quoting."""

import os
import unittest
from datetime import datetime, timedelta, timezone
from unittest import mock

import _helpers  # noqa: F401
import pandastack
from pandastack import client as C
from pandastack.models import FileInfo, SandboxInfo, parse_time


class ConfigTest(unittest.TestCase):
    def env(self, **kv):
        return mock.patch.dict(os.environ, kv, clear=False)

    def setUp(self):
        p = mock.patch.dict(os.environ, {})
        p.start()
        self.addCleanup(p.stop)
        os.environ.pop(C.ENV_API_KEY, None)
        os.environ.pop(C.ENV_API_URL, None)

    def test_defaults(self):
        c = pandastack.Client()
        self.assertIsNone(c.api_key)
        self.assertEqual(c.api_url, "http://127.0.0.1:7788")
        self.assertEqual(c.timeout, C.DEFAULT_TIMEOUT)

    def test_environment(self):
        with self.env(PANDASTACK_API_KEY="k-env", PANDASTACK_API_URL="https://panda.example:8443/"):
            c = pandastack.Client()
            self.assertEqual(c.api_key, "k-env")
            self.assertEqual(c.api_url, "https://panda.example:8443")

    def test_explicit_beats_environment(self):
        with self.env(PANDASTACK_API_KEY="k-env", PANDASTACK_API_URL="http://env:1"):
            c = pandastack.Client(api_key="k-arg", api_url="http://arg:2")
            self.assertEqual((c.api_key, c.api_url), ("k-arg", "http://arg:2"))
            c = pandastack.Client(api_url="http://arg:2")
            self.assertEqual((c.api_key, c.api_url), ("k-env", "http://arg:2"))

    def test_empty_env_is_unset(self):
        with self.env(PANDASTACK_API_KEY="", PANDASTACK_API_URL=""):
            c = pandastack.Client()
            self.assertIsNone(c.api_key)
            self.assertEqual(c.api_url, C.DEFAULT_API_URL)

    def test_missing_key_names_the_variable(self):
        c = pandastack.Client(api_url="http://127.0.0.1:9")
        with self.assertRaises(pandastack.ConfigurationError) as cm:
            c.request("GET", "/v1/sandboxes")
        self.assertIn("PANDASTACK_API_KEY", str(cm.exception))
        with self.assertRaises(pandastack.ConfigurationError) as cm:
            pandastack.Sandbox.create(template="tiny")
        self.assertIn("PANDASTACK_API_KEY", str(cm.exception))

    def test_url_normalization(self):
        cases = {
            "127.0.0.1:7788": "http://127.0.0.1:7788",
            "http://h:1/": "http://h:1",
            "https://h/prefix/": "https://h/prefix",
            "  http://h:1  ": "http://h:1",
        }
        for given, want in cases.items():
            self.assertEqual(pandastack.Client(api_url=given).api_url, want, given)
        for bad in ["ftp://h", "http://", "http://h:notaport"]:
            with self.assertRaises(pandastack.ConfigurationError, msg=bad):
                pandastack.Client(api_url=bad)

    def test_url_with_prefix_and_ipv6(self):
        c = pandastack.Client(api_url="https://h:8443/panda")
        self.assertEqual(c.url("/v1/sandboxes", {"state": "running"}), "https://h:8443/panda/v1/sandboxes?state=running")
        c = pandastack.Client(api_url="http://[::1]:7788")
        self.assertEqual(c.url("/healthz"), "http://[::1]:7788/healthz")

    def test_default_client_follows_environment(self):
        with self.env(PANDASTACK_API_KEY="one"):
            a = C.default_client()
            self.assertIs(a, C.default_client())
            self.assertEqual(a.api_key, "one")
        with self.env(PANDASTACK_API_KEY="two"):
            self.assertEqual(C.default_client().api_key, "two")

    def test_resolve_client(self):
        c = pandastack.Client(api_key="x")
        self.assertIs(C.resolve_client(c, None, None), c)
        with self.assertRaises(ValueError):
            C.resolve_client(c, "k", None)
        with self.env(PANDASTACK_API_URL="http://env:1"):
            r = C.resolve_client(None, "k", None)
            self.assertEqual((r.api_key, r.api_url), ("k", "http://env:1"))


class QuotingTest(unittest.TestCase):
    def test_path_query(self):
        cases = {
            "/work/notes.txt": "path=/work/notes.txt",
            "/work/a b": "path=/work/a%20b",
            "/w/a&b=c+d#e?f%g;h": "path=/w/a%26b%3Dc%2Bd%23e%3Ff%25g%3Bh",
            "/ünï/🐼": "path=/%C3%BCn%C3%AF/%F0%9F%90%BC",
            "relative/x": "path=relative/x",
        }
        for given, want in cases.items():
            self.assertEqual(C.quote_query({"path": given}), want, given)

    def test_repeated_and_typed_params(self):
        q = C.quote_query([("state", "running"), ("metadata", "a=b"), ("metadata", "c=d e"), ("recursive", True)])
        self.assertEqual(q, "state=running&metadata=a%3Db&metadata=c%3Dd%20e&recursive=true")
        self.assertEqual(C.quote_query({"a": None, "b": 1}), "b=1")
        self.assertEqual(C.quote_query(None), "")

    def test_segment(self):
        self.assertEqual(C.quote_segment("abc123"), "abc123")
        self.assertEqual(C.quote_segment("../x y"), "..%2Fx%20y")
        with self.assertRaises(ValueError):
            C.quote_segment("")


class ModelTest(unittest.TestCase):
    def test_parse_time(self):
        utc = timezone.utc
        self.assertEqual(parse_time("2025-01-02T03:04:05Z"), datetime(2025, 1, 2, 3, 4, 5, tzinfo=utc))
        self.assertEqual(parse_time("2025-01-02T03:04:05.123456789Z"), datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=utc))
        self.assertEqual(parse_time("2025-01-02T03:04:05.5+02:00"), datetime(2025, 1, 2, 3, 4, 5, 500000, tzinfo=timezone(timedelta(hours=2))))
        for v in [None, "", "yesterday", 12]:
            self.assertIsNone(parse_time(v))

    def test_sandbox_info_ignores_unknown_fields(self):
        d = dict(_helpers.SANDBOX, future_field=1, expires_at=None)
        info = SandboxInfo.from_dict(d)
        self.assertEqual(info.id, "abc123")
        self.assertEqual(info.metadata, {"a": "b"})
        self.assertIsNone(info.expires_at)
        self.assertEqual(info.raw["future_field"], 1)
        self.assertEqual(info.created_at.microsecond, 123456)

    def test_file_info(self):
        fi = FileInfo.from_dict({"name": "x", "path": "/x", "size": 3, "mode": 0o755, "is_dir": False, "link_target": ""})
        self.assertEqual((fi.mode, fi.is_symlink, fi.link_target, fi.modified_at), (0o755, False, None, None))


if __name__ == "__main__":
    unittest.main()
