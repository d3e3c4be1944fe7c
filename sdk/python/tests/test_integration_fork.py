"""Integration tests of fork, snapshots and pause/resume against a real `panda up`.

Same server fixture and environment variables as sdk/python/tests/_server.py.
"""

from __future__ import annotations

import os
import sys
import time
import unittest
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _server import PandaServer, create_tiny, start_module_server, tag  # noqa: E402
import pandastack  # noqa: E402
from pandastack import Client, Sandbox, Snapshot  # noqa: E402

SERVER: Optional[PandaServer] = None
ADMIN: Optional[Client] = None

# A process that keeps running in the background: it proves a fork or a
# resume continues the live machine instead of rebooting it.
COUNTER = "sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done' >/dev/null 2>&1 &"


def setUpModule() -> None:
    global SERVER, ADMIN
    SERVER, ADMIN = start_module_server()


def create(client: Optional[Client] = None, **kw) -> Sandbox:
    """A tiny sandbox of ADMIN's unless told otherwise (see create_tiny)."""
    return create_tiny(client or ADMIN, **kw)


def counter(sb: Sandbox) -> int:
    r = sb.exec("cat /tmp/counter")
    return int(r.stdout.strip() or 0)


def counter_advances(tc: unittest.TestCase, sb: Sandbox) -> None:
    a = counter(sb)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if counter(sb) > a:
            return
    tc.fail("the background process in %s is not running" % sb.id)


class ForkTest(unittest.TestCase):
    def setUp(self) -> None:
        self.parent = create()
        self.addCleanup(self.parent.kill)
        self.parent.filesystem.write("/work/state.txt", "parent")
        self.parent.exec(COUNTER)
        # The counter runs before anything is forked.
        deadline = time.monotonic() + 30
        while counter(self.parent) == 0:
            if time.monotonic() > deadline:
                self.fail("the counter of %s never started" % self.parent.id)
            time.sleep(0.05)  # polling a condition, bounded by the deadline

    def track(self, *sbs: Sandbox) -> None:
        for sb in sbs:
            self.addCleanup(sb.kill)

    def test_fork_one_child_continues_the_parent(self):
        child = self.parent.fork()
        self.assertIsInstance(child, Sandbox)
        self.track(child)
        self.assertNotEqual(child.id, self.parent.id)
        self.assertEqual(child.info.state, "running")
        self.assertEqual(child.info.parent_id, self.parent.id)
        self.assertEqual(child.info.template, "tiny")
        self.assertEqual(child.info.memory_mib, 256)
        self.assertIs(child.client, self.parent.client)
        # Disk and live processes came along.
        self.assertEqual(child.filesystem.read_text("/work/state.txt"), "parent")
        counter_advances(self, child)
        # The parent keeps running, and the two diverge copy-on-write.
        self.assertEqual(self.parent.refresh().state, "running")
        counter_advances(self, self.parent)
        child.filesystem.write("/work/state.txt", "child")
        self.assertEqual(self.parent.filesystem.read_text("/work/state.txt"), "parent")
        self.assertEqual(child.filesystem.read_text("/work/state.txt"), "child")

    def test_fork_many(self):
        children = self.parent.fork(count=3)
        self.track(*children)
        self.assertIsInstance(children, list)
        self.assertEqual(len(children), 3)
        self.assertEqual(len({c.id for c in children} | {self.parent.id}), 4)
        rand = set()
        for c in children:
            self.assertEqual(c.filesystem.read_text("/work/state.txt"), "parent")
            rand.add(c.exec("head -c 16 /dev/urandom | od -An -tx1").stdout)
            # The clock was set on restore: the guest's time falls within
            # the call that read it (a second either side for rounding).
            before = time.time()
            guest_now = int(c.exec("date +%s").stdout)
            after = time.time()
            self.assertGreaterEqual(guest_now, int(before) - 1)
            self.assertLessEqual(guest_now, after + 1)
        self.assertEqual(len(rand), 3, "children read identical random bytes: the RNG was not reseeded")

    def test_placement_on_one_host(self):
        # `panda up` has one host: every placement that names it, or spreads,
        # lands there; an unknown host is a NotFoundError before anything runs.
        host = self.parent.info.host_id
        self.assertTrue(host)
        kids = self.parent.fork(count=2, placement="spread")
        self.track(*kids)
        self.assertEqual({c.info.host_id for c in kids}, {host})
        kid = self.parent.fork(placement={"host": host})
        self.track(kid)
        self.assertEqual(kid.info.host_id, host)
        with self.assertRaises(pandastack.NotFoundError) as cm:
            self.parent.fork(placement={"host": "no-such-host"})
        self.assertIn("no-such-host", str(cm.exception))
        with self.assertRaises(pandastack.NotFoundError):
            create(placement={"host": "no-such-host"})
        sb = create(placement={"host": host})
        self.track(sb)
        self.assertEqual(sb.info.host_id, host)

    def test_fork_count_one_is_a_list(self):
        got = self.parent.fork(count=1)
        self.track(*got)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], Sandbox)

    def test_fork_over_quota(self):
        key = ADMIN.create_key("sdk-fork-quota-" + tag(), max_sandboxes=2)
        self.addCleanup(ADMIN.revoke_key, key.id)
        user = Client(api_key=key.key, api_url=SERVER.url, timeout=120)
        parent = create(client=user)
        self.addCleanup(parent.kill)
        try:
            children = parent.fork(count=3)
        except pandastack.ForkError as e:
            self.track(*e.children)
            self.assertEqual(len(e.children) + len(e.errors), 3)
            self.assertLessEqual(len(e.children), 1)
            for err in e.errors:
                self.assertIsInstance(err, pandastack.QuotaExceededError)
            for c in e.children:
                self.assertEqual(c.exec("echo ok").stdout, "ok\n")
        except pandastack.QuotaExceededError:
            pass  # the server refused the whole request up front
        else:
            self.track(*children)
            self.fail("fork of 3 children with a quota of 2 sandboxes succeeded")

    def test_fork_of_unknown_sandbox(self):
        ghost = Sandbox(self.parent.info, ADMIN)
        self.parent.kill()
        with self.assertRaises((pandastack.NotFoundError, pandastack.ConflictError)):
            ghost.fork()


class SnapshotTest(unittest.TestCase):
    def test_snapshot_create_from_it_and_delete(self):
        sb = create()
        self.addCleanup(sb.kill)
        sb.filesystem.write("/work/saved.txt", "before")
        sb.exec(COUNTER)
        name = "sdk-" + tag()
        snap = sb.snapshot(name=name)
        self.assertIsInstance(snap, Snapshot)
        self.assertTrue(snap.id.isalnum() and snap.id == snap.id.lower(), snap.id)
        self.assertEqual((snap.name, snap.sandbox_id, snap.template, snap.memory_mib), (name, sb.id, "tiny", 256))
        self.assertIsNotNone(snap.created_at)
        self.assertEqual(sb.refresh().state, "running")  # the source keeps running
        sb.filesystem.write("/work/saved.txt", "after")

        self.assertEqual(Snapshot.get(snap.id, client=ADMIN), snap)
        self.assertIn(snap.id, [s.id for s in Snapshot.list(client=ADMIN)])

        restored = Sandbox.create(snapshot=snap, ttl_seconds=600, client=ADMIN)
        self.addCleanup(restored.kill)
        self.assertEqual(restored.info.snapshot_id, snap.id)
        self.assertEqual(restored.filesystem.read_text("/work/saved.txt"), "before")
        counter_advances(self, restored)
        by_id = Sandbox.create(snapshot=snap.id, ttl_seconds=600, client=ADMIN)
        self.addCleanup(by_id.kill)
        self.assertEqual(by_id.filesystem.read_text("/work/saved.txt"), "before")

        snap.delete()
        with self.assertRaises(pandastack.NotFoundError):
            Snapshot.get(snap.id, client=ADMIN)
        with self.assertRaises(pandastack.NotFoundError):
            snap.delete()
        self.assertEqual(restored.exec("echo alive").stdout, "alive\n")

    def test_unnamed_snapshot_and_other_keys(self):
        sb = create()
        self.addCleanup(sb.kill)
        snap = sb.snapshot()
        self.addCleanup(lambda: _quiet(snap.delete))
        self.assertTrue(snap.id)
        key = ADMIN.create_key("sdk-snap-other-" + tag())
        self.addCleanup(ADMIN.revoke_key, key.id)
        other = Client(api_key=key.key, api_url=SERVER.url)
        with self.assertRaises(pandastack.NotFoundError):
            Snapshot.get(snap.id, client=other)
        self.assertNotIn(snap.id, [s.id for s in Snapshot.list(client=other)])
        with self.assertRaises(pandastack.NotFoundError):
            Sandbox.create(snapshot=snap.id, client=other)

    def test_unknown_snapshot(self):
        with self.assertRaises(pandastack.NotFoundError):
            Snapshot.get("nosuchsnapshot0", client=ADMIN)
        with self.assertRaises(pandastack.NotFoundError):
            Sandbox.create(snapshot="nosuchsnapshot0", client=ADMIN)


class PauseTest(unittest.TestCase):
    def test_pause_and_resume(self):
        sb = create()
        self.addCleanup(sb.kill)
        sb.exec(COUNTER)
        info = sb.pause()
        self.assertEqual(info.state, "paused")
        self.assertIs(info, sb.info)
        self.assertEqual(sb.refresh().state, "paused")
        self.assertIn(sb.id, [s.id for s in Sandbox.list(state="paused", client=ADMIN)])
        with self.assertRaises(pandastack.ConflictError):
            sb.exec("true")
        with self.assertRaises(pandastack.ConflictError):
            sb.filesystem.read("/etc/passwd")
        self.assertEqual(sb.resume().state, "running")
        counter_advances(self, sb)
        with self.assertRaises(pandastack.ConflictError):
            sb.resume()  # not paused

    def test_kill_paused(self):
        sb = create()
        sb.pause()
        sb.kill()
        self.assertEqual(sb.refresh().state, "stopped")


def _quiet(fn) -> None:
    try:
        fn()
    except pandastack.PandaError:
        pass


if __name__ == "__main__":
    unittest.main()
