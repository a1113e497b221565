"""Scale: spawn and ``call`` + gather against hosts x procs per host, controller sends per broadcast, and
the idle CPU of the whole mesh; the same program on PyTorch Monarch side by side. Prints one JSON object.

    python benchmarks/bench_scale.py [--quick] [--monarch PYTHON] [--hosts 1,2,4,8] [--procs 4,8,16,32]
                                     [--calls 100] [--idle 10] [--timeout 240]

Each (system, hosts, procs per host) point runs in a fresh program (``_CHILD``), which is the controller:
* ``spawn_s``: ``spawn_procs(per_host={"gpus": P})`` + ``spawn(Bench)`` until every rank answered a call
* ``call_p50_ms``/``call_p90_ms``: ``noop.call().get()`` (broadcast to every rank, gather the replies)
* ``controller_sends_per_call``: messages the calling thread sent per broadcast (jupyter_mesh only;
  heartbeats go from a thread of their own and are not counted); ``controller_receives_per_call``:
  messages it decoded per broadcast (gathered replies, progress), heartbeat answers aside
* ``cpu_ms_per_call``: CPU per broadcast (each thread's ``schedstat``) of the controller, the agents, the
  procs and the rest (templates, the seed) over the timed calls: where the latency goes on 2 cores
* ``floor_pyzmq``: the same topology in bare pyzmq processes (caller -> H relays -> P workers each, each
  relay gathering its P replies): what processes, sockets and wake-ups alone cost on this machine
* ``floor_dgram``: the same over unix datagram sockets read by a blocking ``recv``: one thread wake-up
  per message and process (pyzmq's I/O threads add two), the least one Python process per rank costs
* ``idle_cpu_pct``: CPU of the controller and every process below it (agents, procs, templates),
  in % of one core, from each thread's ``schedstat`` (ns) over ``--idle`` seconds with the mesh idle
  (an idle proc is still pinged 9-12 s after its last call, then every 67-90 s, each at its own
  moment: a window sees its share; a thread that ends within the window drops out of the sum, and an
  idle mesh ends none)
jupyter_mesh: ``LocalJob(hosts=H)``, H agents on this machine; each agent's fork server preloads torch
by default (warm, ``jobs/warm.py``), imported once for all H hosts by the job's seed (``_runtime/seed.py``;
``--no-seed`` adds the same point with ``JUPYTER_MESH_SEED=0``, H imports of torch on the same cores,
``jupyter_mesh_no_seed``); ``--cold`` adds the same point
with ``JUPYTER_MESH_WARM=0`` (``jupyter_mesh_cold``), ``--no-wait`` with ``spawn_procs(warm=False)``,
which forks at once while the templates still import and lets them finish in the background
(``jupyter_mesh_no_wait``: its calls are timed while they do). Monarch 0.7 (``--monarch`` names a Python
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
def cpu(pid):  # seconds run by all its threads, in ns from schedstat (/proc/<pid>/stat counts 10 ms ticks)
    t = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    t += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                pass
    except OSError:
        pass
    return t / 1e9
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
procs = hosts.spawn_procs(per_host={"gpus": P}, warm=os.environ.get("JM_BENCH_WAIT_WARM") != "0")
b = procs.spawn("b", Bench)
b.noop.call().get(timeout=300)
spawn = time.perf_counter() - t0
for _ in range(5):
    b.noop.call().get(timeout=60)
# messages sent by this (the calling) thread per broadcast; heartbeats go from their own thread
tr, me, sends, recvs = Controller.get().transport, threading.get_ident(), [0], [0]
inner, inner_decode = tr._send_frames, tr.decode
def counting(*a, **k):
    if threading.get_ident() == me:
        sends[0] += 1
    return inner(*a, **k)
def counting_decode(*a, **k):  # what reaches the controller, heartbeat answers aside
    if threading.current_thread().name != "jupyter-mesh-heartbeat":
        recvs[0] += 1
    return inner_decode(*a, **k)
tr._send_frames, tr.decode = counting, counting_decode
roles = {"controller": [os.getpid()], "agents": job.pids(), "procs": list(procs.pids().values())}
known = {p for ps in roles.values() for p in ps}
roles["other"] = [p for p in tree(os.getpid()) if p not in known]  # templates, warm children, the seed
cpu0 = {r: sum(cpu(p) for p in ps) for r, ps in roles.items()}
lat = []
for _ in range(N):
    t = time.perf_counter()
    b.noop.call().get(timeout=60)
    lat.append(time.perf_counter() - t)
cpu_per_call = {r: round(1e3 * (sum(cpu(p) for p in ps) - cpu0[r]) / N, 2) for r, ps in roles.items()}
tr._send_frames, tr.decode = inner, inner_decode
time.sleep(3)  # the agents learn the procs are idle (a few heartbeat intervals)
idle, nproc = idle_cpu(IDLE)
procs.stop()
job.stop()
print(json.dumps({"spawn_s": round(spawn, 2), "call_p50_ms": pct(lat, 0.5), "call_p90_ms": pct(lat, 0.9),
                  "controller_sends_per_call": round(sends[0] / N, 2),
                  "controller_receives_per_call": round(recvs[0] / N, 2), "cpu_ms_per_call": cpu_per_call,
                  "idle_cpu_pct": idle, "processes": nproc}))
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

# the floor: the same topology in bare pyzmq over unix sockets, no signing, no actors, no bookkeeping:
# caller -> H relay processes -> P worker processes each; each relay gathers its P replies into one
_FLOOR_WORKER = r"""
import sys, zmq, msgpack, pickle
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); inbox.bind(sys.argv[1])
out = ctx.socket(zmq.PUSH); out.connect(sys.argv[2]); rank = int(sys.argv[3])
print("up", flush=True)
while True:
    h, p = inbox.recv_multipart(); h = msgpack.unpackb(h); pickle.loads(p)
    if h.get("stop"): break
    out.send_multipart([msgpack.packb({"k": "r", "i": h["i"], "rk": rank}), pickle.dumps(None)])
"""

_FLOOR_RELAY = r"""
import sys, os, zmq, msgpack, pickle, subprocess
d, me, P, worker = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); inbox.bind(f"ipc://{d}/{me}")
back = ctx.socket(zmq.PULL); back.bind(f"ipc://{d}/{me}-back")
ws = [subprocess.Popen([sys.executable, "-c", worker, f"ipc://{d}/{me}-w{r}", f"ipc://{d}/{me}-back", str(r)],
                       stdout=subprocess.PIPE, text=True) for r in range(P)]
outs = []
for r, w in enumerate(ws):
    w.stdout.readline(); s = ctx.socket(zmq.PUSH); s.connect(f"ipc://{d}/{me}-w{r}"); outs.append(s)
up = ctx.socket(zmq.PUSH); up.connect(f"ipc://{d}/caller")
up.send_multipart([b"up", b""])
while True:
    h, p = inbox.recv_multipart(); hd = msgpack.unpackb(h)
    for s in outs: s.send_multipart([h, p])
    if hd.get("stop"): break
    got = [back.recv_multipart()[1] for _ in range(P)]
    up.send_multipart([msgpack.packb({"k": "g", "i": hd["i"]}), b"".join(got)])
for w in ws: w.wait()
"""

_FLOOR = r"""
import sys, os, time, json, tempfile, shutil, subprocess, zmq, msgpack, pickle
H, P, N, worker, relay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
d = tempfile.mkdtemp(prefix="jm-floor-")
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); inbox.bind(f"ipc://{d}/caller")
t0 = time.perf_counter()
rs = [subprocess.Popen([sys.executable, "-c", relay, d, f"r{i}", str(P), worker]) for i in range(H)]
for _ in range(H): inbox.recv_multipart()
spawn = time.perf_counter() - t0
outs = []
for i in range(H):
    s = ctx.socket(zmq.PUSH); s.connect(f"ipc://{d}/r{i}"); outs.append(s)
lat = []
for i in range(N + 5):
    t = time.perf_counter()
    h = msgpack.packb({"k": "c", "i": i, "ep": "noop"}); p = pickle.dumps(((), {}))
    for s in outs: s.send_multipart([h, p])
    for _ in range(H): msgpack.unpackb(inbox.recv_multipart()[0])
    if i >= 5: lat.append(time.perf_counter() - t)
for s in outs: s.send_multipart([msgpack.packb({"k": "c", "i": -1, "stop": 1}), pickle.dumps(None)])
for r in rs: r.wait(30)
shutil.rmtree(d, ignore_errors=True)
lat.sort()
print(json.dumps({"spawn_s": round(spawn, 2), "call_p50_ms": round(1e3 * lat[len(lat) // 2], 2),
                  "call_p90_ms": round(1e3 * lat[int(0.9 * len(lat))], 2)}))
"""


# the same again over unix datagram sockets read by blocking ``recv`` in one thread: one wake-up per
# message in each process (pyzmq's I/O threads add two), what one Python process per rank costs at least
_DGRAM_COMMON = r"""
import os, socket, struct, msgpack, pickle
def sock(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(path)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return s
def pack(h, p):
    hb = msgpack.packb(h); return struct.pack("<I", len(hb)) + hb + p
def unpack(d):
    n = struct.unpack_from("<I", d)[0]; return msgpack.unpackb(d[4:4 + n]), d[4 + n:]
"""

_DGRAM_WORKER = (
    _DGRAM_COMMON
    + r"""
import sys
inbox, back, rank = sock(sys.argv[1]), sys.argv[2], int(sys.argv[3])
print("up", flush=True)
while True:
    h, p = unpack(inbox.recv(1 << 16)); pickle.loads(p)
    if h.get("stop"): break
    inbox.sendto(pack({"k": "r", "i": h["i"], "rk": rank}, pickle.dumps(None)), back)
"""
)

_DGRAM_RELAY = (
    _DGRAM_COMMON
    + r"""
import sys, subprocess
d, me, P, worker = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
inbox, back = sock(f"{d}/{me}"), sock(f"{d}/{me}-back")
ws = [subprocess.Popen([sys.executable, "-c", worker, f"{d}/{me}-w{r}", f"{d}/{me}-back", str(r)],
                       stdout=subprocess.PIPE, text=True) for r in range(P)]
for w in ws: w.stdout.readline()
inbox.sendto(b"up", f"{d}/caller")
while True:
    m = inbox.recv(1 << 16); h, _ = unpack(m)
    for r in range(P): inbox.sendto(m, f"{d}/{me}-w{r}")
    if h.get("stop"): break
    got = [unpack(back.recv(1 << 16))[1] for _ in range(P)]
    inbox.sendto(pack({"k": "g", "i": h["i"]}, b"".join(got)), f"{d}/caller")
for w in ws: w.wait()
"""
)

_DGRAM_FLOOR = (
    _DGRAM_COMMON
    + r"""
import sys, time, json, tempfile, shutil, subprocess
H, P, N, worker, relay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
d = tempfile.mkdtemp(prefix="jm-dgram-")
inbox = sock(f"{d}/caller")
t0 = time.perf_counter()
rs = [subprocess.Popen([sys.executable, "-c", relay, d, f"r{i}", str(P), worker]) for i in range(H)]
for _ in range(H): inbox.recv(16)
spawn = time.perf_counter() - t0
lat = []
for i in range(N + 5):
    t = time.perf_counter()
    m = pack({"k": "c", "i": i, "ep": "noop"}, pickle.dumps(((), {})))
    for r in range(H): inbox.sendto(m, f"{d}/r{r}")
    for _ in range(H): unpack(inbox.recv(1 << 16))
    if i >= 5: lat.append(time.perf_counter() - t)
for r in range(H): inbox.sendto(pack({"k": "c", "i": -1, "stop": 1}, pickle.dumps(None)), f"{d}/r{r}")
for r in rs: r.wait(30)
shutil.rmtree(d, ignore_errors=True)
lat.sort()
print(json.dumps({"spawn_s": round(spawn, 2), "call_p50_ms": round(1e3 * lat[len(lat) // 2], 2),
                  "call_p90_ms": round(1e3 * lat[int(0.9 * len(lat))], 2)}))
"""
)


def floor(h: int, p: int, calls: int, timeout: float, dgram: bool = False) -> dict[str, Any]:
    program, worker, relay = (
        (_DGRAM_FLOOR, _DGRAM_WORKER, _DGRAM_RELAY) if dgram else (_FLOOR, _FLOOR_WORKER, _FLOOR_RELAY)
    )
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", program, str(h), str(p), str(calls), worker, relay],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = out.stdout.strip().splitlines()
        r: dict[str, Any] = (
            json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": out.stderr.strip()[-400:]}
        )
    except subprocess.TimeoutExpired:
        r = {"error": f"ran past {timeout:.0f} s"}
    r["wall_s"] = round(time.monotonic() - t0, 1)
    r["leftover"] = _sweep()
    return r


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


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True  # gone already


def _sweep() -> int:
    """Kill and reap whatever a point left (we are its subreaper, so orphans come to us); the count is
    of live ones (a process killed with its parent, e.g. a template's warm child, is reaped here)."""
    left = [p for p in _descendants() if not _zombie(p)]
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


def point(
    python: str, program: str, h: int, p: int, calls: int, idle: int, timeout: float, extra_env: dict[str, str]
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    env.update(extra_env)
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [python, "-c", program, str(h), str(p), str(calls), str(idle), HERE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=os.path.dirname(HERE),  # ``-c`` puts the working directory first: this checkout's package
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
    ap.add_argument("--monarch-max-procs", type=int, default=64, help="larger Monarch points are skipped")
    ap.add_argument("--no-floor", action="store_true", help="skip the bare pyzmq and datagram floors of each point")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="also run jupyter_mesh with JUPYTER_MESH_WARM=0 (templates preload nothing): what warm costs here",
    )
    ap.add_argument(
        "--no-wait",
        action="store_true",
        help="also run jupyter_mesh with spawn_procs(warm=False): fork at once while the templates still import",
    )
    ap.add_argument(
        "--no-seed",
        action="store_true",
        help="also run jupyter_mesh with JUPYTER_MESH_SEED=0: each host imports the warm list itself",
    )
    a = ap.parse_args()
    if a.quick:
        grid = [(1, 4), (1, 16), (2, 8), (8, 32)]
        a.calls, a.idle = min(a.calls, 30), min(a.idle, 5)
    else:
        grid = [(h, p) for h in map(int, a.hosts.split(",")) for p in map(int, a.procs.split(","))]
    if hasattr(ctypes, "CDLL") and sys.platform == "linux":
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of a point come to us
    systems: list[tuple[str, str, str, dict[str, str]]] = [("jupyter_mesh", sys.executable, _JM, {})]
    if a.no_seed:
        systems.append(("jupyter_mesh_no_seed", sys.executable, _JM, {"JUPYTER_MESH_SEED": "0"}))
    if a.cold:
        systems.append(("jupyter_mesh_cold", sys.executable, _JM, {"JUPYTER_MESH_WARM": "0"}))
    if a.no_wait:
        systems.append(("jupyter_mesh_no_wait", sys.executable, _JM, {"JM_BENCH_WAIT_WARM": "0"}))
    if a.monarch:
        systems.append(("monarch", a.monarch, _MONARCH, {}))
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
        for name, python, program, extra_env in systems:  # side by side: each point on both, one after the other
            if name == "monarch" and h * p > a.monarch_max_procs:
                row[name] = {"skipped": f"over --monarch-max-procs {a.monarch_max_procs} (memory of its procs)"}
                continue
            row[name] = point(python, program, h, p, a.calls, a.idle, a.timeout, extra_env)
            print(f"{name} {h}x{p}: {json.dumps(row[name])}", file=sys.stderr, flush=True)
        if not a.no_floor:
            row["floor_pyzmq"] = floor(h, p, a.calls, a.timeout)
            print(f"floor {h}x{p}: {json.dumps(row['floor_pyzmq'])}", file=sys.stderr, flush=True)
            row["floor_dgram"] = floor(h, p, a.calls, a.timeout, dgram=True)
            print(f"floor_dgram {h}x{p}: {json.dumps(row['floor_dgram'])}", file=sys.stderr, flush=True)
        results["points"].append(row)
    with open("/proc/loadavg") as f:
        results["machine"]["loadavg_1m_after"] = f.read().split()[0]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
