"""Direct sends vs the agents' fan-out tree, on one machine: what decides the default fan-out.

``LocalJob(hosts=8)`` x 4 procs = 32 ranks. For each fan-out (0: direct to all 8 agents; 2 and 4: a
tree), in the same run and interleaved round by round so the machine's load hits all alike:

  sends_per_broadcast   messages the controller sent for one broadcast (``Client.cast_sends``)
  call_p50_ms           call + gather on all 32 ranks, median (and p90) of the runs
  reduce_p50_ms         ``endpoint.reduce("sum")`` on all 32 ranks (one value back per subtree)

Prints one JSON object. Run: ``python benchmarks/bench_tree.py [--runs N] [--hosts H] [--procs P]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_actors import Bench

from jupyter_mesh import LocalJob
from jupyter_mesh._runtime.client import current_client
from jupyter_mesh.config import configured


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--fanouts", default="0,2,4")
    args = ap.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    job = LocalJob(hosts=args.hosts)
    out: dict[str, object] = {"hosts": args.hosts, "procs_per_host": args.procs, "runs": args.runs}
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": args.procs})
        b = pm.spawn("bench", Bench)
        b.initialized.get(timeout=120)
        client = current_client()
        calls: dict[int, list[float]] = {f: [] for f in fanouts}
        reduces: dict[int, list[float]] = {f: [] for f in fanouts}
        sends: dict[int, int] = {}
        for f in fanouts:  # warm up each path (the agents' sockets to each other)
            with configured(fanout=f):
                for _ in range(10):
                    b.noop.call().get(60)
                    b.pid.reduce("max").get(60)
                before = client.cast_sends
                b.noop.broadcast()
                sends[f] = client.cast_sends - before
                b.noop.call().get(60)  # the broadcast has run everywhere
        for _ in range(args.runs):
            for f in fanouts:
                with configured(fanout=f):
                    t0 = time.perf_counter()
                    b.noop.call().get(60)
                    calls[f].append((time.perf_counter() - t0) * 1e3)
                    t0 = time.perf_counter()
                    b.pid.reduce("max").get(60)
                    reduces[f].append((time.perf_counter() - t0) * 1e3)
        for f in fanouts:
            name = "direct" if f == 0 else f"tree_fanout_{f}"
            out[name] = {
                "sends_per_broadcast": sends[f],
                "call_p50_ms": round(statistics.median(calls[f]), 3),
                "call_p90_ms": round(_p(calls[f], 0.9), 3),
                "reduce_p50_ms": round(statistics.median(reduces[f]), 3),
            }
        pm.stop(timeout=10)
    finally:
        job.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
