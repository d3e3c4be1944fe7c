"""Unit tests of a sandbox's ``memory`` as the SDK decodes it: the lazy figures are there only when the server sends them."""

import unittest

import _helpers  # noqa: F401  (puts the SDK on sys.path)

from pandastack import LazyMemory, MemoryUsage
from pandastack.models import SandboxInfo


class MemoryUsageTest(unittest.TestCase):
    def test_lazy_figures(self):
        m = MemoryUsage.from_dict(
            {"private_mib": 12.5, "shared_mib": 40, "pss_mib": 20,
             "lazy": {"image_mib": 1024, "read_mib": 98.5, "fetched_mib": 104, "local_mib": 6}})
        self.assertEqual(m.pss_mib, 20.0)
        self.assertEqual(m.lazy, LazyMemory(image_mib=1024.0, read_mib=98.5, fetched_mib=104.0, local_mib=6.0))

    def test_no_lazy(self):
        m = MemoryUsage.from_dict({"private_mib": 1, "shared_mib": 2, "pss_mib": 3})
        self.assertIsNone(m.lazy)
        # A malformed lazy member is dropped, not an error.
        self.assertIsNone(MemoryUsage.from_dict({"pss_mib": 3, "lazy": "yes"}).lazy)
        self.assertIsNone(MemoryUsage.from_dict(None))

    def test_sandbox_info(self):
        info = SandboxInfo.from_dict({"id": "a", "template": "base", "state": "running", "memory_mib": 1024, "vcpus": 1,
                                      "created_at": "2026-12-01T10:00:00Z", "metadata": {},
                                      "memory": {"private_mib": 1, "shared_mib": 2, "pss_mib": 3, "lazy": {"image_mib": 1024}}})
        self.assertEqual(info.memory.lazy.image_mib, 1024.0)
        self.assertEqual(info.memory.lazy.fetched_mib, 0.0)


if __name__ == "__main__":
    unittest.main()
