"""Two versions of jupyter_mesh side by side at scale: ``call`` + gather latency and the controller's CPU
per call, interleaved round by round in the same run, so the load of a shared machine hits both alike.

    python benchmarks/bench_scale_ab.py --a /work/main --b . [--points 1x16,4x16,8x32] [--rounds 10]
                                        [--calls 20] [--values none]

For each hosts x procs-per-host point, one controller program per version (``PYTHONPATH`` = that
tree) starts ``LocalJob(hosts=H)`` and ``H x P`` procs with a ``Bench`` actor, and waits. Then, round by
round (A first in odd rounds, B first in even ones), each runs ``--calls`` calls and reports:

  p50_ms / p90_ms     ``call().get()`` over all its rounds
  cpu_ms_per_call     the controller's ``time.process_time`` (all its threads: the caller's, the
                      receive thread, heartbeats) per call, median of the rounds' means

``--values``: what the endpoint returns (``none``: ``noop``; ``rank``: a distinct int per rank).
Both meshes stay up during the point (the idle one costs ~2 % of a core). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from bench_actors import Bench
from jupyter_mesh import LocalJob
H, P, values = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
job = LocalJob(hosts=H)
try:
    pm = job.host_mesh().spawn_procs(per_host={"gpus": P})
    b = pm.spawn("b", Bench)
    ep = b.noop if values == "none" else b.pid
    for _ in range(20):
        ep.call().get(timeout=120)
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.startswith("run"):
            break
        n = int(line.split()[1])
        lat = []
        c0 = time.process_time()
        for _ in range(n):
            t = time.perf_counter()
            ep.call().get(timeout=120)
            lat.append(time.perf_counter() - t)
        cpu = (time.process_time() - c0) / n
        print(json.dumps({"lat": lat, "cpu": cpu}), flush=True)
    pm.stop(timeout=10)
finally:
    job.stop()
"""


class _Side:
    def __init__(self, name: str, tree: str, hosts: int, per_host: int, values: str):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, HERE, str(hosts), str(per_host), values],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=os.path.abspath(tree),
            start_new_session=True,
        )
        self.lat: list[float] = []
        self.cpu: list[float] = []

    def line(self) -> str:
        assert self.proc.stdout is not None
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"{self.name}: the controller program ended (exit {self.proc.wait(10)})")
        return out

    def run(self, calls: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {calls}\n")
        self.proc.stdin.flush()
        r = json.loads(self.line())
        self.lat += r["lat"]
        self.cpu.append(r["cpu"])

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.lat)
        return {
            "p50_ms": round(1e3 * lat[len(lat) // 2], 2),
            "p90_ms": round(1e3 * lat[min(len(lat) - 1, int(0.9 * len(lat)))], 2),
            "cpu_ms_per_call": round(1e3 * statistics.median(self.cpu), 3),
            "calls": len(lat),
        }


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="tree of version A (its directory goes on PYTHONPATH)")
    ap.add_argument("--b", required=True, help="tree of version B")
    ap.add_argument("--points", default="1x16,4x16,8x32")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--values", choices=("none", "rank"), default="none")
    args = ap.parse_args()
    out: dict[str, Any] = {"a": args.a, "b": args.b, "values": args.values, "rounds": args.rounds}
    for point in args.points.split(","):
        h, p = (int(x) for x in point.split("x"))
        entry: dict[str, Any] = {"procs": h * p, "load_start": _load()}
        sides: list[_Side] = []
        try:
            for name, tree in (("a", args.a), ("b", args.b)):
                side = _Side(name, tree, h, p, args.values)
                sides.append(side)
                if side.line().strip() != "ready":
                    raise RuntimeError(f"{name}: no mesh")
            for i in range(args.rounds):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    side.run(args.calls)
        finally:
            for side in sides:
                side.close()
        entry["load_end"] = _load()
        for side in sides:
            entry[side.name] = side.summary()
        out[point] = entry
        print(json.dumps({point: entry}), file=sys.stderr, flush=True)
        time.sleep(2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
