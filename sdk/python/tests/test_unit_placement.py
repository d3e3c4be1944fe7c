"""Unit tests of ``placement`` on create and fork, sync and async, against the stub HTTP server.

What each form puts on the wire, and that a bad placement raises ValueError
before anything is sent.
"""

import unittest

from _helpers import SANDBOX, StubServer
from pandastack import AsyncClient, AsyncSandbox, Client, Sandbox

# (placement argument, the "placement" member sent; None: no member)
GOOD = [
    (None, None),
    ("auto", None),
    ("spread", "spread"),
    ({"host": "h2"}, {"host": "h2"}),
]

BAD = [
    "Spread",
    "",
    "h2",
    True,
    3,
    ["h2"],
    {},
    {"host": ""},
    {"host": None},
    {"host": 2},
    {"hosts": "h2"},
    {"host": "h2", "spread": True},
    {"spread": True},
]


def sent_placement(body):
    return body.get("placement")


class PlacementTest(unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        self.stub.json_route("POST", "/v1/sandboxes", 201, dict(SANDBOX, host_id="h2"))
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"sandbox": dict(SANDBOX, id="c1", host_id="h2")}]})

    def test_create(self):
        for arg, want in GOOD:
            with self.subTest(placement=arg):
                sb = Sandbox.create(template="tiny", ttl_seconds=None, placement=arg, client=self.client)
                body = self.stub.last.json()
                self.assertEqual(sent_placement(body), want)
                self.assertEqual(body["template"], "tiny")
                self.assertEqual(sb.info.host_id, "h2")

    def test_fork(self):
        sb = Sandbox.connect("abc123", client=self.client)
        for arg, want in GOOD:
            with self.subTest(placement=arg):
                child = sb.fork(placement=arg)
                self.assertEqual(child.id, "c1")
                body = self.stub.last.json()
                self.assertEqual(body["count"], 1)
                self.assertEqual(sent_placement(body), want)
        sb.fork(1, {"host": "h3"})  # positional, as fork(count, placement)
        self.assertEqual(self.stub.last.json(), {"count": 1, "placement": {"host": "h3"}})

    def test_bad_placement_is_not_sent(self):
        sb = Sandbox.connect("abc123", client=self.client)
        n = len(self.stub.requests)
        for bad in BAD:
            with self.subTest(placement=bad):
                with self.assertRaises(ValueError) as cm:
                    Sandbox.create(placement=bad, client=self.client)
                self.assertIn("placement", str(cm.exception))
                with self.assertRaises(ValueError):
                    sb.fork(placement=bad)
        self.assertEqual(len(self.stub.requests), n, "a bad placement was sent")

    def test_messages(self):
        with self.assertRaisesRegex(ValueError, r'placement must be None, "spread" or \{"host": HOST_ID\}, got \'h2\''):
            Sandbox.create(placement="h2", client=self.client)
        with self.assertRaisesRegex(ValueError, r'write placement="spread"'):
            Sandbox.create(placement={"spread": True}, client=self.client)
        with self.assertRaisesRegex(ValueError, r"placement host must be a host id"):
            Sandbox.create(placement={"host": ""}, client=self.client)


class AsyncPlacementTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = AsyncClient(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.stub.json_route("GET", "/v1/sandboxes/abc123", 200, SANDBOX)
        self.stub.json_route("POST", "/v1/sandboxes", 201, dict(SANDBOX, host_id="h2"))
        self.stub.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"sandbox": dict(SANDBOX, id="c1", host_id="h2")}]})

    async def asyncTearDown(self):
        await self.client.close()

    async def test_create_and_fork(self):
        sb = await AsyncSandbox.connect("abc123", client=self.client)
        for arg, want in GOOD:
            with self.subTest(placement=arg):
                got = await AsyncSandbox.create(ttl_seconds=None, placement=arg, client=self.client)
                self.assertEqual(got.info.host_id, "h2")
                self.assertEqual(sent_placement(self.stub.last.json()), want)
                await sb.fork(placement=arg)
                self.assertEqual(sent_placement(self.stub.last.json()), want)
        kids = await sb.fork(1, "spread")
        self.assertEqual([k.id for k in kids], ["c1"])
        self.assertEqual(self.stub.last.json(), {"count": 1, "placement": "spread"})

    async def test_bad_placement_is_not_sent(self):
        sb = await AsyncSandbox.connect("abc123", client=self.client)
        n = len(self.stub.requests)
        for bad in BAD:
            with self.subTest(placement=bad):
                with self.assertRaises(ValueError):
                    await AsyncSandbox.create(placement=bad, client=self.client)
                with self.assertRaises(ValueError):
                    await sb.fork(placement=bad)
        self.assertEqual(len(self.stub.requests), n, "a bad placement was sent")


if __name__ == "__main__":
    unittest.main()
