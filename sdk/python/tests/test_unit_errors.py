"""Unit tests: error classes and the mapping from API error bodies."""

import builtins
import json
import unittest

import _helpers  # noqa: F401  (import path)
import pandastack
from pandastack import errors as E


class ErrorMappingTest(unittest.TestCase):
    def test_every_code_maps_to_its_class(self):
        table = [
            ("bad_request", 400, pandastack.BadRequestError),
            ("unauthorized", 401, pandastack.AuthenticationError),
            ("forbidden", 403, pandastack.ForbiddenError),
            ("not_found", 404, pandastack.NotFoundError),
            ("conflict", 409, pandastack.ConflictError),
            ("payload_too_large", 413, pandastack.PayloadTooLargeError),
            ("invalid", 422, pandastack.InvalidArgumentError),
            ("quota_exceeded", 429, pandastack.QuotaExceededError),
            ("internal", 500, pandastack.PandaError),
            ("unavailable", 503, pandastack.UnavailableError),
            ("insufficient_storage", 507, pandastack.InsufficientStorageError),
        ]
        for code, status, cls in table:
            with self.subTest(code=code):
                body = json.dumps({"error": {"code": code, "message": "msg " + code}}).encode()
                got = E.error_from_response(status, body)
                self.assertIs(type(got), cls, "code %s: got %s, want %s" % (code, type(got).__name__, cls.__name__))
                self.assertEqual(got.status, status)
                self.assertEqual(got.code, code)
                self.assertEqual(got.message, "msg " + code)
                self.assertIsInstance(got, pandastack.PandaError)

    def test_code_wins_over_status(self):
        body = b'{"error":{"code":"not_found","message":"x"}}'
        got = E.error_from_response(400, body)
        self.assertIsInstance(got, pandastack.NotFoundError)
        self.assertEqual(got.status, 400)

    def test_unknown_code_falls_back_on_status(self):
        got = E.error_from_response(404, b'{"error":{"code":"teapot","message":"x"}}')
        self.assertIsInstance(got, pandastack.NotFoundError)
        self.assertEqual(got.code, "teapot")
        got = E.error_from_response(504, b'{"error":{"code":"timeout","message":"slow"}}')
        self.assertIs(type(got), pandastack.PandaError)
        self.assertEqual((got.status, got.code, got.message), (504, "timeout", "slow"))

    def test_non_json_body(self):
        got = E.error_from_response(502, b"<html>Bad Gateway</html>", "Bad Gateway")
        self.assertIs(type(got), pandastack.PandaError)
        self.assertEqual(got.status, 502)
        self.assertIsNone(got.code)
        self.assertIn("Bad Gateway", got.message)
        got = E.error_from_response(401, b"")
        self.assertIsInstance(got, pandastack.AuthenticationError)

    def test_error_from_inner_body_gets_canonical_status(self):
        got = E.error_from_body({"code": "quota_exceeded", "message": "too many"})
        self.assertIsInstance(got, pandastack.QuotaExceededError)
        self.assertEqual(got.status, 429)
        got = E.error_from_body({"error": {"code": "conflict", "message": "paused"}})
        self.assertIsInstance(got, pandastack.ConflictError)

    def test_str_and_repr(self):
        e = pandastack.NotFoundError("sandbox x not found", status=404, code="not_found")
        self.assertEqual(str(e), "sandbox x not found (not_found, HTTP 404)")
        self.assertIn("NotFoundError", repr(e))
        self.assertEqual(str(pandastack.PandaError("plain")), "plain")

    def test_connection_error_hierarchy(self):
        self.assertTrue(issubclass(pandastack.PandaConnectionError, pandastack.PandaError))
        self.assertTrue(issubclass(pandastack.PandaConnectionError, builtins.ConnectionError))
        self.assertIs(pandastack.ConnectionError, pandastack.PandaConnectionError)
        self.assertTrue(issubclass(pandastack.RequestTimeoutError, builtins.TimeoutError))
        self.assertTrue(issubclass(pandastack.RequestTimeoutError, pandastack.PandaConnectionError))
        e = pandastack.RequestTimeoutError("slow")
        self.assertEqual(e.message, "slow")
        self.assertIsNone(e.status)

    def test_star_import_does_not_shadow_builtin_connection_error(self):
        ns = {}
        exec("from pandastack import *", ns)
        self.assertNotIn("ConnectionError", ns)
        self.assertIn("Sandbox", ns)

    def test_fork_error_carries_children_and_errors(self):
        errs = [pandastack.QuotaExceededError("q", status=429, code="quota_exceeded")]
        e = pandastack.ForkError("1 of 2 failed", children=["c"], errors=errs, code="quota_exceeded")
        self.assertEqual(e.children, ["c"])
        self.assertEqual(e.errors, errs)
        self.assertIsInstance(e, pandastack.PandaError)


if __name__ == "__main__":
    unittest.main()
