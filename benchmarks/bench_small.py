"""The small-call path and same-host RDMABuffer, jupyter_mesh and Monarch side by side. Prints one JSON object.

    python benchmarks/bench_small.py [--monarch PYTHON] [--ab TREE] [--rounds 3] [--calls 2000] [--runs 5] [--mib 64]

Each round runs one fresh program per system, the systems alternating (jm, monarch, jm, monarch, ...),
so drift in the machine's speed hits both alike. ``--ab TREE`` adds another jupyter_mesh source tree
(a checkout of main, say) to every round, for an A/B of two versions in the same run; every other round
runs the systems in reverse order. A program spawns 2 procs on this host and measures:
* ``call_one_us``: ``owner.noop.call_one().get()`` round trips from the controller, p50/p90/p99 (after 50
  warm-up calls)
* ``rdma``: ``RDMABuffer`` of ``--mib`` MiB made by the proc ``owner``; the other proc times
  ``buf.read_into(dst).get()`` and ``buf.write_from(src).get()``, its local side allocated and touched
  beforehand, for a CPU tensor and for a memoryview (of a bytearray); GB/s = 1e9 bytes / median time
* ``rdma_GBps.memcpy_in_reader``: the one-copy baseline, a ``memmove`` between two touched buffers of
  that size in the reading proc, measured right after (what a same-host copy can reach at best)
* ``rdma_read_small_us``: the same read of 1 byte and of 4 KiB (tensor), median latency
Monarch 0.7 runs with ``rdma_allow_tcp_fallback=True`` (no ibverbs here). Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# the actors and the measurement, shared by both programs (each prepends its imports and Actor/endpoint)
_BODY = r"""
import json, os, sys, time, statistics
N, SIZE, RUNS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

class Side(Actor):
    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def make(self, nbytes: int, kind: str):
        import torch
        if kind == "tensor":
            self.keep = torch.rand(nbytes // 4) if nbytes % 4 == 0 else torch.ones(nbytes, dtype=torch.uint8)
        else:
            self.keep = memoryview(bytearray(os.urandom(nbytes)))
        return RDMABuffer(self.keep)

    @endpoint
    def memcpy(self, nbytes: int, runs: int) -> list:
        import ctypes
        src, dst = bytearray(b"x" * nbytes), bytearray(b"y" * nbytes)  # both touched
        a = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(src))
        b = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(dst))
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            ctypes.memmove(b, a, nbytes)
            times.append(time.perf_counter() - t0)
        return times

    @endpoint
    def transfer(self, buf, kind: str, op: str, runs: int) -> list:
        import torch
        n = buf.size()
        local = torch.zeros(n // 4, dtype=torch.float32) if kind == "tensor" and n % 4 == 0 else torch.zeros(n, dtype=torch.uint8)
        if kind != "tensor":
            local = memoryview(bytearray(n))
        times = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            if op == "read_into":
                buf.read_into(local, timeout=60).get()
            else:
                buf.write_from(local, timeout=60).get()
            if i:
                times.append(time.perf_counter() - t0)
        return times

procs = this_host().spawn_procs(per_host={"gpus": 2})
owner = procs.slice(gpus=0).spawn("owner", Side)
reader = procs.slice(gpus=1).spawn("reader", Side)
owner.noop.call_one().get()
reader.noop.call_one().get()
for _ in range(50):
    owner.noop.call_one().get()
lat = []
for _ in range(N):
    t = time.perf_counter()
    owner.noop.call_one().get()
    lat.append(time.perf_counter() - t)
lat.sort()
out = {"call_one_us": {q: round(1e6 * lat[int(f * len(lat))], 1) for q, f in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}}
rdma = {}
for kind in ("tensor", "memoryview"):
    try:
        buf = owner.make.call_one(SIZE, kind).get()
        r = {}
        for op in ("read_into", "write_from"):
            ts = reader.transfer.call_one(buf, kind, op, RUNS).get()
            r[op] = round(SIZE / statistics.median(ts) / 1e9, 3)
        rdma[kind] = r
    except Exception as e:
        rdma[kind] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
rdma["memcpy_in_reader"] = round(SIZE / statistics.median(reader.memcpy.call_one(SIZE, RUNS).get()) / 1e9, 3)
out["rdma_GBps"] = rdma
small = {}
for n in (1, 4096):
    try:
        buf = owner.make.call_one(n, "tensor").get()
        small[str(n)] = round(1e6 * statistics.median(reader.transfer.call_one(buf, "tensor", "read_into", 50).get()), 1)
    except Exception as e:
        small[str(n)] = f"{type(e).__name__}: {str(e)[:300]}"
out["rdma_read_small_us"] = small
STOP
print("RESULT " + json.dumps(out), flush=True)
"""

_JM = "from jupyter_mesh import Actor, RDMABuffer, endpoint, this_host\n" + _BODY.replace(
    "STOP", "procs.stop().get(timeout=60)"
)
_MONARCH = (
    "import monarch\nmonarch.configure(rdma_allow_tcp_fallback=True)\n"
    "from monarch.actor import Actor, endpoint, this_host\nfrom monarch.rdma import RDMABuffer\n"
    + _BODY.replace("STOP", "procs.stop().get()")
)


def run(python: str, program: str, a: argparse.Namespace, tree: str = os.path.dirname(HERE)) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    args = [python, "-c", program, str(a.calls), str(a.mib << 20), str(a.runs)]
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=a.timeout, env=env, start_new_session=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        r: dict[str, Any] = (
            json.loads(lines[-1][7:]) if lines else {"error": f"exit {p.returncode}: {p.stderr.strip()[-600:]}"}
        )
    except subprocess.TimeoutExpired:
        r = {"error": f"ran past {a.timeout:.0f} s"}
    r["wall_s"] = round(time.monotonic() - t0, 1)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--monarch", metavar="PYTHON", help="a Python with torchmonarch: run Monarch side by side")
    ap.add_argument("--ab", metavar="TREE", help="another jupyter_mesh source tree, run beside this one in every round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5, help="timed transfers per size and op")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per program")
    a = ap.parse_args()
    here = os.path.dirname(HERE)
    systems = [("jupyter_mesh", sys.executable, _JM, here)]
    if a.ab:
        systems.append(("jupyter_mesh@ab", sys.executable, _JM, os.path.abspath(a.ab)))
    if a.monarch:
        systems.append(("monarch", a.monarch, _MONARCH, here))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    rounds: list[dict[str, Any]] = []
    for i in range(a.rounds):
        row: dict[str, Any] = {}
        for name, python, program, tree in systems if i % 2 == 0 else systems[::-1]:
            row[name] = run(python, program, a, tree)
            print(f"round {i} {name}: {json.dumps(row[name])}", file=sys.stderr, flush=True)
        rounds.append(row)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]
    result = {
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_before": load, "loadavg_1m_after": load_after},
        "calls": a.calls,
        "size_MiB": a.mib,
        "rounds": rounds,
    }
    if a.ab:
        result["ab_tree"] = os.path.abspath(a.ab)
    if a.monarch:
        ratios = []
        for row in rounds:
            try:
                ratios.append(
                    round(row["jupyter_mesh"]["call_one_us"]["p50"] / row["monarch"]["call_one_us"]["p50"], 3)
                )
            except (KeyError, TypeError):
                pass
        result["call_one_p50_ratio_jm_over_monarch"] = ratios
        if a.ab:
            result["call_one_p50_ratio_ab_over_monarch"] = [
                round(row["jupyter_mesh@ab"]["call_one_us"]["p50"] / row["monarch"]["call_one_us"]["p50"], 3)
                for row in rounds
                if "call_one_us" in row.get("jupyter_mesh@ab", {}) and "call_one_us" in row.get("monarch", {})
            ]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
