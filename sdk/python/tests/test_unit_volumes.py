"""Unit tests of volumes against the stub HTTP server, sync and async.

What each call puts on the wire (method, path, query, body), how answers
are decoded, and that malformed ``volumes`` arguments raise ValueError
before anything is sent. Real behaviour is tested against `panda up` in
test_integration_volumes.py.
"""

import unittest

from _helpers import SANDBOX, StubServer, send_json
from pandastack import AsyncClient, AsyncSandbox, AsyncVolume, Client, FileInfo, Sandbox, Volume, VolumeMount
from pandastack.errors import ConflictError

VOL = {
    "id": "vol_0123456789abcdef",
    "name": "data",
    "size_mib": 1024,
    "used_bytes": 8192,
    "created_at": "2026-12-07T10:00:00Z",
    "mounted_by": ["abc123"],
}
BRANCH = dict(VOL, id="vol_bbbbbbbbbbbbbbbb", name="data-c1", parent="data", mounted_by=[])
FILE = {"name": "a.txt", "path": "/a.txt", "size": 5, "mode": 0o644, "is_dir": False}
MOUNTED = dict(SANDBOX, volumes=[{"name": "data", "path": "/mnt/data"}, {"name": "ro", "path": "/mnt/ro", "read_only": True}])

BAD_MOUNTS = [
    "data",
    {"mnt/data": "data"},
    {"/mnt/data": ""},
    {"/mnt/data": 3},
    [{"path": "/mnt/data"}],
    [{"name": "data", "volume": "data", "path": "/x"}],
    [{"name": "data", "path": "/x", "read_only": "yes"}],
    [{"name": "data", "path": "/x", "mode": "ro"}],
    ["data"],
]


class VolumeTest(unittest.TestCase):
    def setUp(self):
        self.stub = StubServer().start()
        self.addCleanup(self.stub.stop)
        self.client = Client(api_key="sekret", api_url=self.stub.url, timeout=10)
        self.addCleanup(self.client.close)
        s = self.stub
        s.json_route("POST", "/v1/volumes", 201, VOL)
        s.json_route("GET", "/v1/volumes", 200, {"volumes": [VOL, BRANCH]})
        s.json_route("GET", "/v1/volumes/data", 200, VOL)
        s.json_route("GET", "/v1/volumes/" + VOL["id"], 200, VOL)
        s.json_route("PATCH", "/v1/volumes/" + VOL["id"], 200, dict(VOL, size_mib=4096))
        s.json_route("DELETE", "/v1/volumes/" + VOL["id"], 204, None)
        s.json_route("POST", "/v1/volumes/" + BRANCH["id"] + "/promote", 200, dict(VOL, used_bytes=12288))
        s.json_route("PUT", "/v1/volumes/" + VOL["id"] + "/files", 200, FILE)
        s.route("GET", "/v1/volumes/" + VOL["id"] + "/files", lambda rec, h: (h.send_response(200), h.send_header("Content-Length", "5"), h.end_headers(), h.wfile.write(b"hello")))
        s.json_route("GET", "/v1/volumes/" + VOL["id"] + "/files/list", 200, {"entries": [FILE]})
        s.json_route("GET", "/v1/volumes/" + VOL["id"] + "/files/stat", 200, FILE)
        s.json_route("POST", "/v1/volumes/" + VOL["id"] + "/files/mkdir", 200, dict(FILE, name="d", path="/d", is_dir=True))
        s.json_route("DELETE", "/v1/volumes/" + VOL["id"] + "/files", 204, None)
        s.json_route("POST", "/v1/sandboxes", 201, MOUNTED)
        s.json_route("GET", "/v1/sandboxes/abc123", 200, MOUNTED)
        s.json_route("POST", "/v1/sandboxes/abc123/fork", 201, {"children": [{"sandbox": dict(SANDBOX, id="c1", volumes=[{"name": "data-c1", "path": "/mnt/data"}])}]})

    def test_create_get_list(self):
        v = Volume.create("data", size_mib=2048, client=self.client)
        self.assertEqual((self.stub.last.method, self.stub.last.path), ("POST", "/v1/volumes"))
        self.assertEqual(self.stub.last.json(), {"name": "data", "size_mib": 2048})
        self.assertEqual((v.id, v.name, v.size_mib, v.used_bytes, v.parent, v.mounted_by), (VOL["id"], "data", 1024, 8192, None, ["abc123"]))
        self.assertEqual(v.created_at.year, 2026)
        Volume.create("data", client=self.client)
        self.assertEqual(self.stub.last.json(), {"name": "data", "size_mib": 1024})
        self.assertEqual(Volume.get("data", client=self.client), v)
        got = Volume.list(client=self.client)
        self.assertEqual([x.name for x in got], ["data", "data-c1"])
        self.assertEqual(got[1].parent, "data")

    def test_bad_size_is_refused_before_sending(self):
        n = len(self.stub.requests)
        for bad in (0, -1, 1.5, True, "1024", None):
            with self.subTest(size=bad), self.assertRaises(ValueError):
                Volume.create("data", size_mib=bad, client=self.client)
        self.assertEqual(len(self.stub.requests), n)

    def test_resize_delete_promote(self):
        v = Volume.get("data", client=self.client)
        self.assertIs(v.resize(4096), v)
        self.assertEqual((self.stub.last.method, self.stub.last.json()), ("PATCH", {"size_mib": 4096}))
        self.assertEqual(v.size_mib, 4096)
        v.delete()
        self.assertEqual((self.stub.last.method, self.stub.last.query), ("DELETE", ""))
        v.delete(force=True)
        self.assertEqual(self.stub.last.query, "force=true")
        b = Volume(BRANCH, self.client)
        parent = b.promote()
        self.assertEqual(self.stub.last.path, "/v1/volumes/%s/promote" % BRANCH["id"])
        self.assertEqual((parent.id, parent.used_bytes), (VOL["id"], 12288))

    def test_conflict_is_raised(self):
        self.stub.json_route("DELETE", "/v1/volumes/" + VOL["id"], 409, {"error": {"code": "conflict", "message": "volume data is mounted by abc123"}})
        with self.assertRaises(ConflictError) as cm:
            Volume(VOL, self.client).delete()
        self.assertIn("mounted", str(cm.exception))

    def test_files(self):
        f = Volume(VOL, self.client).files
        info = f.write("/a.txt", "hello", mode=0o600)
        self.assertEqual((self.stub.last.method, self.stub.last.path, self.stub.last.query), ("PUT", "/v1/volumes/%s/files" % VOL["id"], "path=/a.txt&mode=600"))
        self.assertEqual(self.stub.last.body, b"hello")
        self.assertEqual(info, FileInfo.from_dict(FILE))
        self.assertEqual(f.read("/a.txt"), b"hello")
        self.assertEqual(f.read_text("a.txt"), "hello")
        self.assertEqual(self.stub.last.query, "path=a.txt")
        self.assertEqual([e.name for e in f.list("/")], ["a.txt"])
        self.assertEqual(f.stat("/a.txt").size, 5)
        self.assertTrue(f.exists("/a.txt"))
        self.assertTrue(f.mkdir("/d").is_dir)
        self.assertEqual(self.stub.last.json(), {"path": "/d"})
        f.remove("/d", recursive=True)
        self.assertEqual((self.stub.last.method, self.stub.last.query), ("DELETE", "path=/d&recursive=true"))
        self.assertFalse(hasattr(f, "watch_dir"))

    def test_create_sandbox_with_volumes(self):
        v = Volume(VOL, self.client)
        sb = Sandbox.create(template="tiny", volumes={"/mnt/data": v, "/mnt/other": "other"}, client=self.client)
        self.assertEqual(self.stub.last.json()["volumes"], [{"name": VOL["id"], "path": "/mnt/data"}, {"name": "other", "path": "/mnt/other"}])
        self.assertEqual(sb.volumes, [VolumeMount("data", "/mnt/data", False), VolumeMount("ro", "/mnt/ro", True)])
        Sandbox.create(template="tiny", volumes=[{"name": "data", "path": "/mnt/data", "read_only": True}, {"volume": v, "path": "/v"}], client=self.client)
        self.assertEqual(self.stub.last.json()["volumes"], [{"name": "data", "path": "/mnt/data", "read_only": True}, {"name": VOL["id"], "path": "/v"}])
        Sandbox.create(template="tiny", client=self.client)
        self.assertNotIn("volumes", self.stub.last.json())

    def test_bad_mounts_are_refused_before_sending(self):
        n = len(self.stub.requests)
        for bad in BAD_MOUNTS:
            with self.subTest(volumes=bad), self.assertRaises(ValueError):
                Sandbox.create(template="tiny", volumes=bad, client=self.client)
        self.assertEqual(len(self.stub.requests), n)

    def test_fork_volume_mode(self):
        sb = Sandbox.connect("abc123", client=self.client)
        child = sb.fork(volumes="branch")
        self.assertEqual(self.stub.last.json(), {"count": 1, "volume_mode": "branch"})
        self.assertEqual(child.volumes, [VolumeMount("data-c1", "/mnt/data", False)])
        sb.fork(volumes="share")
        self.assertEqual(self.stub.last.json(), {"count": 1, "volume_mode": "share"})
        sb.fork()
        self.assertNotIn("volume_mode", self.stub.last.json())
        n = len(self.stub.requests)
        with self.assertRaises(ValueError):
            sb.fork(volumes="copy")
        self.assertEqual(len(self.stub.requests), n)


class AsyncVolumeTest(unittest.IsolatedAsyncioTestCase):
    """The asyncio twins send what the sync calls send."""

    def setUp(self):
        VolumeTest.setUp(self)  # type: ignore[arg-type]
        self.aclient = AsyncClient(api_key="sekret", api_url=self.stub.url, timeout=10)

    async def asyncTearDown(self):
        await self.aclient.close()

    async def test_same_requests(self):
        v = await AsyncVolume.create("data", size_mib=2048, client=self.aclient)
        self.assertEqual(self.stub.last.json(), {"name": "data", "size_mib": 2048})
        self.assertEqual(v, Volume(VOL, self.client))
        self.assertEqual([x.name for x in await AsyncVolume.list(client=self.aclient)], ["data", "data-c1"])
        await v.resize(4096)
        self.assertEqual(v.size_mib, 4096)
        await v.delete(force=True)
        self.assertEqual(self.stub.last.query, "force=true")
        parent = await AsyncVolume(BRANCH, self.aclient).promote()
        self.assertIsInstance(parent, AsyncVolume)
        self.assertEqual(await v.files.read("/a.txt"), b"hello")
        await v.files.write("/a.txt", b"hello")
        self.assertEqual(self.stub.last.query, "path=/a.txt")
        self.assertEqual([e.name for e in await v.files.list("/")], ["a.txt"])
        sb = await AsyncSandbox.create(template="tiny", volumes={"/mnt/data": v}, client=self.aclient)
        self.assertEqual(self.stub.last.json()["volumes"], [{"name": VOL["id"], "path": "/mnt/data"}])
        self.assertEqual(sb.volumes[1], VolumeMount("ro", "/mnt/ro", True))
        await sb.fork(volumes="branch")
        self.assertEqual(self.stub.last.json(), {"count": 1, "volume_mode": "branch"})


if __name__ == "__main__":
    unittest.main()
