"""Core runtime benchmarks (W1-W4) plus the bare pyzmq floor, printed as one JSON object.

    python benchmarks/bench_core.py [--quick]

W1  spawn 4 procs with torch preloaded until all answer (cold: fresh program; warm: template ready)
W2  no-op call_one round trip, p50/p99 over 2000 calls
W3  call on 4 actors + gather, p50/p99 over 500 rounds
W4  64 MiB float32 tensor as argument, echoed back: GB/s = 2 x 64 MiB / round trip
floor  bare pyzmq DEALER/ROUTER round trip between two processes (msgpack header + pickled args)
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import time

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
t0 = time.perf_counter()
procs = host.spawn_procs(per_host={"gpus": 4})
b = procs.spawn("b", Bench)
b.torch_sum.call().get(timeout=60)
cold = time.perf_counter() - t0
procs.stop()
t0 = time.perf_counter()
procs = host.spawn_procs(per_host={"gpus": 4})
b = procs.spawn("b", Bench)
b.torch_sum.call().get(timeout=60)
warm = time.perf_counter() - t0
procs.stop()
print(json.dumps({"cold": cold, "warm": warm}))
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


_FLOOR_SERVER = r"""
import sys, zmq, msgpack, pickle
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    ident, header, payload = s.recv_multipart()
    h = msgpack.unpackb(header); args = pickle.loads(payload)
    if h.get("stop"): break
    s.send_multipart([ident, msgpack.packb({"k": "r", "i": h["i"]}), pickle.dumps(None)])
"""


def floor(n: int) -> dict[str, float]:
    srv = subprocess.Popen([sys.executable, "-c", _FLOOR_SERVER], stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())  # type: ignore[union-attr]
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(f"tcp://127.0.0.1:{port}")
    lat = []
    for i in range(n + 200):
        t0 = time.perf_counter()
        s.send_multipart([msgpack.packb({"k": "c", "i": i, "m": "noop"}), pickle.dumps(((), {}))])
        h, p = s.recv_multipart()
        msgpack.unpackb(h)
        pickle.loads(p)
        if i >= 200:
            lat.append(time.perf_counter() - t0)
    s.send_multipart([msgpack.packb({"stop": 1}), pickle.dumps(None)])
    srv.wait(10)
    s.close(0)
    ctx.term()
    return {"p50_us": us(pct(lat, 0.5)), "p99_us": us(pct(lat, 0.99)), "n": n}


def main() -> None:
    quick = "--quick" in sys.argv
    results: dict[str, object] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    results["floor_pyzmq_roundtrip"] = floor(2000)
    results["W1_spawn_4_procs_with_torch"] = w1(1 if quick else 3)

    host = this_host()
    procs = host.spawn_procs(per_host={"gpus": 4})
    b = procs.spawn("bench", Bench)
    b.initialized.get(timeout=30)
    one = b.slice(gpus=0)

    for _ in range(300):
        one.noop.call_one().get()
    lat = []
    for _ in range(2000):
        t0 = time.perf_counter()
        one.noop.call_one().get()
        lat.append(time.perf_counter() - t0)
    results["W2_call_one_noop"] = {"p50_us": us(pct(lat, 0.5)), "p99_us": us(pct(lat, 0.99)), "n": 2000}

    for _ in range(100):
        b.noop.call().get()
    lat = []
    for _ in range(500):
        t0 = time.perf_counter()
        b.noop.call().get()
        lat.append(time.perf_counter() - t0)
    results["W3_call_4_actors_gather"] = {"p50_us": us(pct(lat, 0.5)), "p99_us": us(pct(lat, 0.99)), "n": 500}

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
