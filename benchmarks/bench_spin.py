"""The caller's spin before it sleeps (``replies.SPIN_S``, ``JUPYTER_MESH_SPIN_US``): on and off, side by side.

    python benchmarks/bench_spin.py [--rounds 3] [--calls 3000] [--spin-us 100] [--busy 0]

Each round runs one fresh program with the spin off (``JUPYTER_MESH_SPIN_US=0``) and one with it on,
alternating which goes first, so drift in the machine's speed hits both alike. A program spawns 4 procs
on this host and measures, after 200 warm-up calls:
* ``call_one_us``: ``one.noop.call_one().get()`` round trips, p50/p90;
* ``call4_us``: ``all.noop.call().get()`` on the 4 procs (gathered), p50/p90;
* ``caller_cpu_us``: CPU time of the controller process (all its threads) per ``call_one``.
``--busy N`` runs N busy-loop processes meanwhile (a loaded machine, whose cores never idle). Prints one
JSON object. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_PROGRAM = r"""
import json, os, time
os.environ.setdefault("JUPYTER_MESH_WARM", "0")
from jupyter_mesh import Actor, endpoint, this_host

class Side(Actor):
    @endpoint
    def noop(self) -> None:
        return None

N = int(os.environ["BENCH_CALLS"])
procs = this_host().spawn_procs(per_host={"gpus": 4})
side = procs.spawn("side", Side)
one = side.slice(gpus=0)
for _ in range(200):
    one.noop.call_one().get(timeout=10)
    side.noop.call().get(timeout=10)

def timed(fn, n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    lat.sort()
    return {"p50": round(1e6 * lat[len(lat) // 2], 1), "p90": round(1e6 * lat[int(0.9 * len(lat))], 1)}

c0 = time.process_time()
call_one = timed(lambda: one.noop.call_one().get(timeout=10), N)
cpu = (time.process_time() - c0) / N
call4 = timed(lambda: side.noop.call().get(timeout=10), N // 3)
procs.stop()
print(json.dumps({"call_one_us": call_one, "call4_us": call4, "caller_cpu_us": round(1e6 * cpu, 1)}))
"""


def run(spin_us: float, calls: int, timeout: float) -> dict[str, object]:
    env = dict(os.environ, JUPYTER_MESH_SPIN_US=str(spin_us), BENCH_CALLS=str(calls))
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--spin-us", type=float, default=100.0, help="the spin of the 'on' runs")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes running meanwhile")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        load = os.getloadavg()[0]
        rounds = []
        for r in range(a.rounds):
            order = [("off", 0.0), ("on", a.spin_us)]
            if r % 2:
                order.reverse()
            rounds.append({name: run(us, a.calls, a.timeout) for name, us in order})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "busy_processes": a.busy,
                "loadavg_1m_before": round(load, 2),
                "spin_us_on": a.spin_us,
                "calls": a.calls,
                "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                "rounds": rounds,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
