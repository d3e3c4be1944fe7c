#!/usr/bin/env python3
"""Best-of-N with live forks: try N fixes of a failing test in parallel.

An agent prepares one warm sandbox (a small project with a failing test),
forks it into N children that share its memory and disk copy-on-write,
lets each child try a different candidate fix, runs the tests in every
child, and keeps the first child whose tests pass. Each fork costs what
the branches write, not N machines.

Run it against a server (`make up`):

    export PANDASTACK_API_KEY=$(cat /var/lib/pandastack/admin.key)
    PYTHONPATH=sdk/python/src python3 examples/best_of_n.py

(or `pip install ./sdk/python` first). Options: --template (default base,
which has python3), --n (default 4).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pandastack import Sandbox

PROJECT = {
    "/work/calc.py": '''def mean(xs):
    """Arithmetic mean of a non-empty list."""
    return sum(xs) / len(xs) + 1  # bug
''',
    "/work/test_calc.py": '''import unittest
from calc import mean

class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

if __name__ == "__main__":
    unittest.main()
''',
}

# What N different "agents" might propose. Only one is right.
CANDIDATES = [
    "return sum(xs) / len(xs) - 1",
    "return sum(xs) // len(xs)",
    "return sum(xs) / len(xs)",
    "return max(xs) / 2",
    "return sorted(xs)[len(xs) // 2]",
    "return (min(xs) + max(xs)) / 2 + 0.5",
]


def try_candidate(child: Sandbox, fix: str) -> tuple[Sandbox, str, bool, float]:
    t0 = time.monotonic()
    child.exec(
        "sed -i 's|^    return .*|    %s|' /work/calc.py" % fix.replace("|", r"\|"),
    )
    r = child.exec("cd /work && python3 test_calc.py", timeout_seconds=120)
    return child, fix, r.exit_code == 0, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", default="base")
    ap.add_argument("--n", type=int, default=4)
    args = ap.parse_args()
    n = max(1, min(args.n, len(CANDIDATES)))

    with Sandbox.create(template=args.template, ttl_seconds=900) as parent:
        print(f"parent {parent.id}: setting up the project")
        for path, text in PROJECT.items():
            parent.filesystem.write(path, text)
        r = parent.exec("cd /work && python3 test_calc.py")
        print(f"parent: tests fail as expected (exit {r.exit_code})")

        t0 = time.monotonic()
        children = parent.fork(count=n)
        print(f"forked {len(children)} children in {time.monotonic() - t0:.2f}s: "
              + ", ".join(c.id for c in children))
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                results = list(pool.map(try_candidate, children, CANDIDATES[:n]))
            winner = None
            for child, fix, ok, took in results:
                print(f"  {child.id}: {'PASS' if ok else 'fail'} in {took:.2f}s with `{fix}`")
                if ok and winner is None:
                    winner = (child, fix)
            if winner is None:
                print("no candidate passed")
                return 1
            child, fix = winner
            print(f"winner: {child.id} with `{fix}`")
            print(child.filesystem.read_text("/work/calc.py"))
            # The parent was never touched by the attempts.
            print("parent still has the bug:",
                  "+ 1" in parent.filesystem.read_text("/work/calc.py"))
        finally:
            for c in children:
                c.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
