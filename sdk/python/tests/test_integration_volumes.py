"""Integration tests of volumes against a real `panda up`: the Volume API,
sandboxes mounting volumes, and forks sharing or branching them.

Same server fixture and environment variables as sdk/python/tests/_server.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import unittest
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _server import PandaServer, create_tiny, start_module_server, tag  # noqa: E402
from pandastack import AsyncClient, AsyncVolume, Client, Volume, VolumeMount  # noqa: E402
from pandastack.errors import ConflictError, InsufficientStorageError, InvalidArgumentError, NotFoundError  # noqa: E402

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


def new_volume(tc: unittest.TestCase, size_mib: int = 16) -> Volume:
    v = Volume.create("t-" + tag(), size_mib=size_mib, client=ADMIN)
    tc.addCleanup(_delete, v)
    return v


def _delete(v: Volume) -> None:
    try:
        v.delete(force=True)
    except NotFoundError:
        pass


class VolumeAPITest(unittest.TestCase):
    """The volume calls and the files API, no sandbox involved."""

    def test_lifecycle_and_files(self):
        v = new_volume(self)
        self.assertTrue(v.id.startswith("vol_"), v.id)
        self.assertEqual((v.size_mib, v.parent, v.mounted_by), (16, None, []))
        self.assertIn(v, Volume.list(client=ADMIN))
        self.assertEqual(Volume.get(v.name, client=ADMIN).id, v.id)
        with self.assertRaises(ConflictError):
            Volume.create(v.name, client=ADMIN)

        v.files.write("/dir/a.txt", "hello")
        self.assertEqual(v.files.read_text("dir/a.txt"), "hello")
        self.assertEqual([e.name for e in v.files.list("/dir")], ["a.txt"])
        self.assertEqual(v.files.stat("/dir/a.txt").size, 5)
        self.assertTrue(v.files.mkdir("/d2/e").is_dir)
        self.assertFalse(v.files.exists("/nope"))
        self.assertGreater(v.refresh().used_bytes, 0)
        v.files.remove("/dir", recursive=True)
        self.assertFalse(v.files.exists("/dir/a.txt"))

        with self.assertRaises(InvalidArgumentError):
            v.resize(8)
        self.assertEqual(v.resize(32).size_mib, 32)
        v.delete()
        with self.assertRaises(NotFoundError):
            Volume.get(v.name, client=ADMIN)

    def test_over_the_limit(self):
        v = new_volume(self, size_mib=1)
        with self.assertRaises(InsufficientStorageError):
            v.files.write("/big", b"x" * (2 << 20))
        self.assertFalse(v.files.exists("/big"))

    def test_another_keys_volume_is_not_found(self):
        v = new_volume(self)
        other = Client(api_key=ADMIN.create_key("vol-" + tag()).key, api_url=SERVER.url)
        self.addCleanup(other.close)
        with self.assertRaises(NotFoundError):
            Volume.get(v.name, client=other)
        self.assertNotIn(v.id, [x.id for x in Volume.list(client=other)])

    def test_async(self):
        async def go() -> None:
            async with AsyncClient(api_key=ADMIN.api_key, api_url=SERVER.url) as c:
                v = await AsyncVolume.create("t-" + tag(), size_mib=16, client=c)
                try:
                    await v.files.write("/x", b"async")
                    self.assertEqual(await v.files.read("/x"), b"async")
                    self.assertIn(v.id, [x.id for x in await AsyncVolume.list(client=c)])
                finally:
                    await v.delete(force=True)

        asyncio.run(go())


class VolumeSandboxTest(unittest.TestCase):
    """Sandboxes mounting volumes: one sandbox, then its forks, share and branch."""

    def test_mount_share_branch_promote(self):
        v = new_volume(self)
        ro = new_volume(self)
        v.files.write("/in.txt", "from the api\n")
        ro.files.write("/ref.txt", "reference\n")

        sb = create_tiny(ADMIN, volumes=[{"name": v.name, "path": "/mnt/data"}, {"volume": ro, "path": "/mnt/ro", "read_only": True}])
        self.addCleanup(sb.kill)
        self.assertEqual(sb.volumes, [VolumeMount(v.name, "/mnt/data", False), VolumeMount(ro.name, "/mnt/ro", True)])
        self.assertEqual(sb.exec("cat /mnt/data/in.txt /mnt/ro/ref.txt").stdout, "from the api\nreference\n")
        r = sb.exec("echo written > /mnt/data/out.txt && sync")
        self.assertEqual(r.exit_code, 0, r.stderr)
        self.assertEqual(v.files.read_text("/out.txt"), "written\n")
        self.assertNotEqual(sb.exec("touch /mnt/ro/nope").exit_code, 0)
        self.assertEqual(v.refresh().mounted_by, [sb.id])
        with self.assertRaises(ConflictError):
            v.delete()

        # share (the default): parent and child see each other's closed writes.
        child = sb.fork()
        self.addCleanup(child.kill)
        self.assertEqual([m.name for m in child.volumes], [v.name, ro.name])
        self.assertEqual(child.exec("echo child > /mnt/data/shared.txt").exit_code, 0)
        self.assertEqual(sb.exec("cat /mnt/data/shared.txt").stdout, "child\n")

        # branch: the child writes its own copy; the parent's is untouched.
        br = sb.fork(volumes="branch")
        self.addCleanup(br.kill)
        names = [m.name for m in br.volumes]
        self.assertEqual(names, ["%s-%s" % (v.name, br.id), "%s-%s" % (ro.name, br.id)])
        for n in names:
            self.addCleanup(_delete, Volume.get(n, client=ADMIN))
        self.assertEqual(br.exec("cat /mnt/data/in.txt").stdout, "from the api\n")
        self.assertEqual(br.exec("echo branch > /mnt/data/in.txt").exit_code, 0)
        self.assertEqual(sb.exec("cat /mnt/data/in.txt").stdout, "from the api\n")
        branch = Volume.get(names[0], client=ADMIN)
        self.assertEqual(branch.parent, v.name)
        br.kill()
        parent = branch.promote()
        self.assertEqual(parent.id, v.id)
        self.assertEqual(v.files.read_text("/in.txt"), "branch\n")
        with self.assertRaises(NotFoundError):
            branch.refresh()


if __name__ == "__main__":
    unittest.main()
