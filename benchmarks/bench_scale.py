"""Scale: spawn and ``call`` + gather against hosts x procs per host, controller sends per broadcast, and
the idle CPU of the whole mesh; the same program on PyTorch Monarch side by side. Prints one JSON object.

    python benchmarks/bench_scale.py [--quick] [--monarch PYTHON] [--hosts 1,2,4,8] [--procs 4,8,16,32]
                                     [--calls 100] [--idle 10] [--timeout 240]

Each (system, hosts, procs per host) point runs in a fresh program (``_CHILD``), which is the controller:
* ``spawn_s``: ``spawn_procs(per_host={"gpus": P})`` + ``spawn(Bench)`` until every rank answered a call
* ``call_p50_ms``/``call_p90_ms``: ``noop.call().get()`` (broadcast to every rank, gather the replies)
* ``controller_sends_per_call``: messages the calling thread sent per broadcast (jupyter_mesh only;
  heartbeats go from a thread of their own and are not counted)
* ``idle_cpu_pct``: CPU of the controller and every process below it (agents, procs, templates),
  in % of one core, from ``/proc/<pid>/stat`` over ``--idle`` seconds with the mesh idle
jupyter_mesh: ``LocalJob(hosts=H)``, H agents on this machine. Monarch 0.7 (``--monarch`` names a Python
that has ``torchmonarch``): ``ProcessJob({"hosts": H})``, H host processes on this machine, each over
unix sockets. A point that runs past ``--timeout`` is recorded as such. This program makes itself the
subreaper of everything its points start: whatever a point leaves behind is counted (``leftover``)
and killed. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# what both systems' points share: the process tree and its CPU, percentiles
_COMMON = r"""
import json, os, sys, time
TCK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
        return (int(x[11]) + int(x[12])) / TCK
    except (OSError, IndexError):
        return 0.0
def tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out
def idle_cpu(seconds):
    pids = tree(os.getpid())
    c0, t0 = sum(cpu(p) for p in pids), time.monotonic()
    time.sleep(seconds)
    return round(100 * (sum(cpu(p) for p in pids) - c0) / (time.monotonic() - t0), 2), len(pids)
def pct(xs, q):
    xs = sorted(xs)
    return round(1e3 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)
H, P, N, IDLE = (int(a) for a in sys.argv[1:5])
"""

_JM = (
    _COMMON
    + r"""
import threading
sys.path.insert(0, sys.argv[5])
from bench_actors import Bench
from jupyter_mesh import LocalJob
from jupyter_mesh._runtime.controller import Controller
job = LocalJob(hosts=H)
hosts = job.host_mesh()
job.agents()  # the agents are up: spawn time is the procs'
t0 = time.perf_counter()
procs = hosts.spawn_procs(per_host={"gpus": P})
b = procs.spawn("b", Bench)
b.noop.call().get(timeout=300)
spawn = time.perf_counter() - t0
for _ in range(5):
    b.noop.call().get(timeout=60)
# messages sent by this (the calling) thread per broadcast; heartbeats go from their own thread
tr, me, sends = Controller.get().transport, threading.get_ident(), [0]
inner = tr._send_frames
def counting(*a, **k):
    if threading.get_ident() == me:
        sends[0] += 1
    return inner(*a, **k)
tr._send_frames = counting
lat = []
for _ in range(N):
    t = time.perf_counter()
    b.noop.call().get(timeout=60)
    lat.append(time.perf_counter() - t)
tr._send_frames = inner
time.sleep(3)  # the agents learn the procs are idle (a few heartbeat intervals)
idle, nproc = idle_cpu(IDLE)
procs.stop()
job.stop()
print(json.dumps({"spawn_s": round(spawn, 2), "call_p50_ms": pct(lat, 0.5), "call_p90_ms": pct(lat, 0.9),
                  "controller_sends_per_call": round(sends[0] / N, 2), "idle_cpu_pct": idle, "processes": nproc}))
"""
)

_MONARCH = (
    _COMMON
    + r"""
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob
class Bench(Actor):
    @endpoint
    def noop(self) -> None:
        return None
job = ProcessJob({"hosts": H})
hosts = job.state(cached_path=None).hosts
hosts.initialized.get()  # the hosts are up: spawn time is the procs'
t0 = time.perf_counter()
procs = hosts.spawn_procs(per_host={"gpus": P})
b = procs.spawn("b", Bench)
b.noop.call().get()
spawn = time.perf_counter() - t0
for _ in range(5):
    b.noop.call().get()
lat = []
for _ in range(N):
    t = time.perf_counter()
    b.noop.call().get()
    lat.append(time.perf_counter() - t)
time.sleep(3)
idle, nproc = idle_cpu(IDLE)
procs.stop().get()
job.kill()
print(json.dumps({"spawn_s": round(spawn, 2), "call_p50_ms": pct(lat, 0.5), "call_p90_ms": pct(lat, 0.9),
                  "controller_sends_per_call": None, "idle_cpu_pct": idle, "processes": nproc}))
"""
)


def _descendants() -> list[int]:
    out, todo = [], [os.getpid()]
    while todo:
        p = todo.pop()
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def _sweep() -> int:
    """Kill and reap whatever a point left (we are its subreaper, so orphans come to us)."""
    left = _descendants()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    return len(left)


def point(python: str, program: str, h: int, p: int, calls: int, idle: int, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [python, "-c", program, str(h), str(p), str(calls), str(idle), HERE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        lines = out.stdout.strip().splitlines()
        r: dict[str, Any] = (
            json.loads(lines[-1])
            if out.returncode == 0 and lines
            else {"error": f"exit {out.returncode}: {out.stderr.strip()[-400:]}"}
        )
    except subprocess.TimeoutExpired:
        r = {"error": f"ran past {timeout:.0f} s"}
    r["wall_s"] = round(time.monotonic() - t0, 1)
    r["leftover"] = _sweep()
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few points, fewer calls: a few minutes")
    ap.add_argument("--monarch", metavar="PYTHON", help="a Python with torchmonarch: run Monarch side by side")
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--procs", default="4,8,16,32", help="procs per host")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--idle", type=int, default=10, help="seconds over which idle CPU is measured")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per point")
    a = ap.parse_args()
    if a.quick:
        grid = [(1, 4), (2, 8), (8, 32)]
        a.calls, a.idle = min(a.calls, 30), min(a.idle, 5)
    else:
        grid = [(h, p) for h in map(int, a.hosts.split(",")) for p in map(int, a.procs.split(","))]
    if hasattr(ctypes, "CDLL") and sys.platform == "linux":
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of a point come to us
    systems = [("jupyter_mesh", sys.executable, _JM)]
    if a.monarch:
        systems.append(("monarch", a.monarch, _MONARCH))
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "loadavg_1m_before": load_before},
        "calls_per_point": a.calls,
        "idle_window_s": a.idle,
        "points": [],
    }
    for h, p in grid:
        row: dict[str, Any] = {"hosts": h, "procs_per_host": p, "procs": h * p}
        for name, python, program in systems:  # side by side: each point on both, one after the other
            row[name] = point(python, program, h, p, a.calls, a.idle, a.timeout)
            print(f"{name} {h}x{p}: {json.dumps(row[name])}", file=sys.stderr, flush=True)
        results["points"].append(row)
    with open("/proc/loadavg") as f:
        results["machine"]["loadavg_1m_after"] = f.read().split()[0]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
