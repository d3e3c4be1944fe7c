# The Python SDK's leg of `panda bench path` (internal/testing/bench/pathpy.go).
# It reads one JSON request a line from stdin and answers one JSON line on
# stdout: {"op": "create"} times Sandbox.create and a first exec of true,
# then kills the sandbox (untimed); {"op": "exec", "id": ID} times one
# exec of true in sandbox ID. Times are measured here, with
# time.perf_counter, so the pipe to the benchmark is not counted.
import json
import sys
import time

from pandastack import Client, Sandbox


def main():
    client = Client()  # PANDASTACK_API_URL, PANDASTACK_API_KEY
    opts = json.loads(sys.argv[1])
    connected = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "create":
                t0 = time.perf_counter()
                sb = Sandbox.create(template=opts.get("template") or None, memory_mib=opts.get("memory_mib") or None,
                                    vcpus=opts.get("vcpus") or None, ttl_seconds=600, client=client)
                try:
                    r = sb.exec(["true"])
                    ms = (time.perf_counter() - t0) * 1000
                finally:
                    sb.kill()
            else:
                sb = connected.get(req["id"])
                if sb is None:
                    sb = connected[req["id"]] = Sandbox.connect(req["id"], client=client)
                t0 = time.perf_counter()
                r = sb.exec(["true"])
                ms = (time.perf_counter() - t0) * 1000
            if r.exit_code != 0:
                raise RuntimeError("true exited %d" % r.exit_code)
            out = {"ms": ms}
        except Exception as e:  # reported to the benchmark, which stops
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


main()
