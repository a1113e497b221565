"""Core runtime benchmarks (W1-W4) plus the bare pyzmq floor, printed as one JSON object.

    python benchmarks/bench_core.py [--quick] [--no-w1]

W1  spawn 4 procs with torch preloaded until all answer (cold: fresh program; warm: template ready)
W2  no-op call_one round trip, p50/p99 over 2000 calls (and its ratio to the floor)
W3  call on 4 actors + gather, p50/p99 over 500 rounds
    W2, W3 and the floor are measured in interleaved blocks, so drift in the VM's speed hits all alike
W4  64 MiB float32 tensor as argument, echoed back: GB/s = 2 x 64 MiB / round trip
floor  bare pyzmq DEALER/ROUTER round trip between two processes (msgpack header + pickled args),
       over unix sockets and over loopback TCP; x_floor_p50 compares with the runtime's own transport
       (unix sockets by default, TCP+CURVE with JUPYTER_MESH_BIND=tcp://127.0.0.1)
fan-out floor  W3's topology in bare pyzmq: caller -> relay process -> 4 worker processes -> relay gathers
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_actors import Bench

from jupyter_mesh import this_host


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def us(x: float) -> float:
    return round(x * 1e6, 1)


_W1_CHILD = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
from jupyter_mesh import this_host
from bench_actors import Bench
host = this_host(preload=["torch"])
times = {}
for run in ("cold", "warm"):  # cold: the template is still importing torch; warm: it is ready
    t0 = time.perf_counter()
    procs = host.spawn_procs(per_host={"gpus": 4})
    b = procs.spawn("b", Bench)
    b.torch_sum.call().get(timeout=60)
    times[run] = time.perf_counter() - t0
    procs.stop()
print(json.dumps(times))
"""


def w1(runs: int) -> dict[str, float]:
    here = os.path.dirname(os.path.abspath(__file__))
    colds, warms = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _W1_CHILD, here], capture_output=True, text=True, timeout=120)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        colds.append(r["cold"])
        warms.append(r["warm"])
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    torch_import = time.perf_counter() - t0
    return {
        "cold_s_median": round(statistics.median(colds), 3),
        "warm_s_median": round(statistics.median(warms), 3),
        "fresh_interpreter_import_torch_s": round(torch_import, 3),
        "runs": runs,
    }


_BIND = r"""
import os, tempfile, uuid
def bind(sock):  # the transport under test: FLOOR_KIND=ipc (unix socket) or tcp (loopback)
    if os.environ.get("FLOOR_KIND") == "ipc":
        a = "ipc://" + os.path.join(tempfile.gettempdir(), "jm-floor-" + uuid.uuid4().hex[:12]); sock.bind(a); return a
    return "tcp://127.0.0.1:%d" % sock.bind_to_random_port("tcp://127.0.0.1")
"""

_FLOOR_SERVER = (
    _BIND
    + r"""
import sys, zmq, msgpack, pickle
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); addr = bind(s)
print(addr, flush=True)
while True:
    ident, header, payload = s.recv_multipart()
    h = msgpack.unpackb(header); args = pickle.loads(payload)
    if h.get("stop"): break
    s.send_multipart([ident, msgpack.packb({"k": "r", "i": h["i"]}), pickle.dumps(None)])
"""
)


class Floor:
    """The bare pyzmq round trip, kept running so its blocks interleave with W2's: the VM's speed
    drifts during a run, so a ratio is only fair between samples taken side by side."""

    def __init__(self, kind: str = "tcp") -> None:
        env = {**os.environ, "FLOOR_KIND": kind}
        self.srv = subprocess.Popen([sys.executable, "-c", _FLOOR_SERVER], stdout=subprocess.PIPE, text=True, env=env)
        addr = self.srv.stdout.readline().strip()  # type: ignore[union-attr]
        self.ctx = zmq.Context()
        self.s = self.ctx.socket(zmq.DEALER)
        self.s.connect(addr)
        self.i = 0
        self.block(200)  # warm-up

    def block(self, n: int) -> list[float]:
        lat = []
        for _ in range(n):
            self.i += 1
            t0 = time.perf_counter()
            self.s.send_multipart([msgpack.packb({"k": "c", "i": self.i, "ep": "noop"}), pickle.dumps(((), {}))])
            h, p = self.s.recv_multipart()
            msgpack.unpackb(h)
            pickle.loads(p)
            lat.append(time.perf_counter() - t0)
        return lat

    def stop(self) -> None:
        self.s.send_multipart([msgpack.packb({"stop": 1}), pickle.dumps(None)])
        self.srv.wait(10)
        self.s.close(0)
        self.ctx.term()


_FANOUT_WORKER = (
    _BIND
    + r"""
import sys, zmq, msgpack, pickle
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); addr = bind(inbox)
print(addr, flush=True)
out = ctx.socket(zmq.PUSH); out.connect(sys.argv[1])
while True:
    h, p = inbox.recv_multipart(); h = msgpack.unpackb(h); pickle.loads(p)
    if h.get("stop"): break
    out.send_multipart([msgpack.packb({"k": "r", "i": h["i"], "rk": int(sys.argv[2])}), pickle.dumps(None)])
"""
)

_FANOUT_RELAY = (
    _BIND
    + r"""
import sys, zmq, msgpack, pickle, subprocess
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); me = bind(inbox)
workers = [subprocess.Popen([sys.executable, "-c", sys.argv[1], me, str(r)], stdout=subprocess.PIPE, text=True)
           for r in range(4)]
outs = []
for w in workers:
    s = ctx.socket(zmq.PUSH); s.connect(w.stdout.readline().strip()); outs.append(s)
print(me, flush=True)
back = None; got = []
while True:
    h, p = inbox.recv_multipart(); hd = msgpack.unpackb(h)
    if hd["k"] == "c":
        if back is None:
            back = ctx.socket(zmq.PUSH); back.connect(hd["s"])
        for s in outs: s.send_multipart([h, p])
        if hd.get("stop"): break
    else:
        got.append(p)
        if len(got) == 4:
            back.send_multipart([msgpack.packb({"k": "g", "i": hd["i"]}), b"".join(got)]); got = []
for w in workers: w.wait()
"""
)


class FanoutFloor:
    """W3's topology in bare pyzmq: the caller sends to a relay process, which sends to 4 worker
    processes and gathers their replies into one (what a host agent does). No signing, no actors:
    the cost of the processes, sockets and thread wake-ups alone on this machine."""

    def __init__(self, kind: str = "tcp") -> None:
        env = {**os.environ, "FLOOR_KIND": kind}
        self.relay = subprocess.Popen(
            [sys.executable, "-c", _FANOUT_RELAY, _FANOUT_WORKER], stdout=subprocess.PIPE, text=True, env=env
        )
        addr = self.relay.stdout.readline().strip()  # type: ignore[union-attr]
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        if kind == "ipc":
            self.me = f"ipc://{tempfile.gettempdir()}/jm-floor-{uuid.uuid4().hex[:12]}"
            self.inbox.bind(self.me)
        else:
            self.me = f"tcp://127.0.0.1:{self.inbox.bind_to_random_port('tcp://127.0.0.1')}"
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.connect(addr)
        self.i = 0
        self.block(100)

    def block(self, n: int) -> list[float]:
        lat = []
        for _ in range(n):
            self.i += 1
            t0 = time.perf_counter()
            self.out.send_multipart([msgpack.packb({"k": "c", "i": self.i, "s": self.me}), pickle.dumps(((), {}))])
            h, _ = self.inbox.recv_multipart()
            msgpack.unpackb(h)
            lat.append(time.perf_counter() - t0)
        return lat

    def stop(self) -> None:
        self.out.send_multipart([msgpack.packb({"k": "c", "i": -1, "s": self.me, "stop": 1}), pickle.dumps(None)])
        self.relay.wait(10)
        self.inbox.close(0)
        self.out.close(0)
        self.ctx.term()


def timed(fn: Any, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return lat


def stats(lat: list[float]) -> dict[str, float]:
    return {"p50_us": us(pct(lat, 0.5)), "p99_us": us(pct(lat, 0.99)), "n": len(lat)}


def main() -> None:
    quick = "--quick" in sys.argv
    results: dict[str, object] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if "--no-w1" not in sys.argv:  # A/B runs of W2-W4 skip the fresh-program spawns
        results["W1_spawn_4_procs_with_torch"] = w1(1 if quick else 3)

    host = this_host()
    procs = host.spawn_procs(per_host={"gpus": 4})
    b = procs.spawn("bench", Bench)
    b.initialized.get(timeout=30)
    one = b.slice(gpus=0)
    # floors over both transports: the runtime's own (unix sockets by default; TCP with
    # JUPYTER_MESH_BIND=tcp://127.0.0.1) and the other, each interleaved with W2 and W3
    kind = "tcp" if os.environ.get("JUPYTER_MESH_BIND", "").startswith("tcp://") else "ipc"
    other = "tcp" if kind == "ipc" else "ipc"
    floor, floor_other = Floor(kind), Floor(other)
    fanout, fanout_other = FanoutFloor(kind), FanoutFloor(other)

    def w2() -> None:
        one.noop.call_one().get()

    def w3() -> None:
        b.noop.call().get()

    timed(w2, 300)
    timed(w3, 100)
    floor_lat: list[float] = []
    floor_other_lat: list[float] = []
    fanout_lat: list[float] = []
    fanout_other_lat: list[float] = []
    w2_lat: list[float] = []
    w3_lat: list[float] = []
    for _ in range(5):  # interleaved blocks: floors, W2, fan-out floors, W3
        floor_lat += floor.block(400)
        floor_other_lat += floor_other.block(400)
        w2_lat += timed(w2, 400)
        fanout_lat += fanout.block(100)
        fanout_other_lat += fanout_other.block(100)
        w3_lat += timed(w3, 100)
    for f in (floor, floor_other, fanout, fanout_other):
        f.stop()
    results["transport"] = kind
    results[f"floor_pyzmq_roundtrip_{kind}"] = stats(floor_lat)
    results[f"floor_pyzmq_roundtrip_{other}"] = stats(floor_other_lat)
    results["W2_call_one_noop"] = {
        **stats(w2_lat),
        "x_floor_p50": round(pct(w2_lat, 0.5) / pct(floor_lat, 0.5), 2),  # over the same transport
        f"x_{other}_floor_p50": round(pct(w2_lat, 0.5) / pct(floor_other_lat, 0.5), 2),
    }
    results[f"floor_pyzmq_fanout_4_gather_{kind}"] = stats(fanout_lat)
    results[f"floor_pyzmq_fanout_4_gather_{other}"] = stats(fanout_other_lat)
    results["W3_call_4_actors_gather"] = {
        **stats(w3_lat),
        "x_fanout_floor_p50": round(pct(w3_lat, 0.5) / pct(fanout_lat, 0.5), 2),
        f"x_{other}_fanout_floor_p50": round(pct(w3_lat, 0.5) / pct(fanout_other_lat, 0.5), 2),
    }

    import torch

    t = torch.rand(16 * 1024 * 1024)  # 64 MiB float32
    one.echo.call_one(t).get(timeout=60)
    times = []
    for _ in range(3 if quick else 10):
        t0 = time.perf_counter()
        back = one.echo.call_one(t).get(timeout=60)
        times.append(time.perf_counter() - t0)
    assert back.shape == t.shape
    rtt = statistics.median(times)
    results["W4_echo_64MiB_tensor"] = {
        "rtt_ms_median": round(rtt * 1e3, 2),
        "GBps": round(2 * t.nbytes / rtt / 1e9, 3),
        "definition": "2 x 64 MiB moved / round trip",
    }
    procs.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
