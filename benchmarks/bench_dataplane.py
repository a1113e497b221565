"""Data-plane benchmark W7, printed as one JSON object.

    UCX_TLS=tcp,self python benchmarks/bench_dataplane.py [--quick]

W7  64 MiB one-way RDMABuffer.read_into and write_from between two procs of one host, for every
    backend (shm, ucx when ucxx is installed, zmq), timed inside the reading proc around
    ``buf.read_into(dst).get()``; the destination is allocated and touched beforehand.
Baselines from the same run, same size, same two-process setting:
    memcpy_one_copy_shm   the reader copies from a /dev/shm mapping another process wrote (one copy)
    pyzmq_zero_copy_tcp   one 64 MiB frame, copy=False, PUSH -> PULL over loopback tcp (+ tiny ack)
    pyzmq_zero_copy_ipc   the same over a unix socket
GB/s = 1e9 bytes per second, median of the runs. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_actors import RdmaBench

from jupyter_mesh import this_host

SIZE = 64 << 20


def gbps(times: list[float]) -> dict[str, float]:
    med = statistics.median(times)
    return {
        "GBps": round(SIZE / med / 1e9, 3),
        "best_GBps": round(SIZE / min(times) / 1e9, 3),
        "ms_median": round(med * 1e3, 2),
        "runs": len(times),
    }


_ZMQ_PEER = r"""
import sys, zmq
ctx = zmq.Context(); pull = ctx.socket(zmq.PULL); push = ctx.socket(zmq.PUSH)
addr = sys.argv[1]
if addr == "tcp":
    port = pull.bind_to_random_port("tcp://127.0.0.1"); print(f"tcp://127.0.0.1:{port}", flush=True)
else:
    pull.bind(addr); print(addr, flush=True)
push.connect(sys.stdin.readline().strip())
while True:
    f = pull.recv(copy=False)
    if len(f) == 1: break
    push.send(b"k")
"""


def pyzmq_baseline(kind: str, runs: int) -> dict[str, float]:
    import zmq

    ctx = zmq.Context()
    ack = ctx.socket(zmq.PULL)
    ack_port = ack.bind_to_random_port("tcp://127.0.0.1")
    target = "tcp" if kind == "tcp" else f"ipc:///tmp/jm-bench-{os.getpid()}.sock"
    peer = subprocess.Popen(
        [sys.executable, "-c", _ZMQ_PEER, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    addr = peer.stdout.readline().strip()  # type: ignore[union-attr]
    peer.stdin.write(f"tcp://127.0.0.1:{ack_port}\n")  # type: ignore[union-attr]
    peer.stdin.flush()  # type: ignore[union-attr]
    push = ctx.socket(zmq.PUSH)
    push.connect(addr)
    data = bytearray(os.urandom(1024)) * (SIZE // 1024)
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        push.send(data, copy=False)
        ack.recv()
        if i:
            times.append(time.perf_counter() - t0)
    push.send(b"x")
    peer.wait(10)
    push.close(0)
    ack.close(0)
    ctx.term()
    return gbps(times)


def memcpy_baseline(reader: object, runs: int) -> dict[str, float]:
    path = f"/dev/shm/jm-bench-{os.getpid()}"
    with open(path, "wb") as f:
        f.write(os.urandom(1024) * (SIZE // 1024))
    try:
        return gbps(reader.memcpy_from_file.call_one(path, SIZE, runs).get(timeout=120))  # type: ignore[attr-defined]
    finally:
        os.unlink(path)


def backend_run(host: object, backend: str, runs: int) -> dict[str, object]:
    env = {"JUPYTER_MESH_RDMA_BACKEND": backend, "JUPYTER_MESH_UCX_SAME_HOST": "1"}  # one host: UCX by opt-in
    for k in ("UCX_TLS", "UCX_NET_DEVICES", "UCXPY_PROGRESS_MODE"):
        if k in os.environ:
            env[k] = os.environ[k]
    pm = host.spawn_procs(per_host={"gpus": 2}, env=env, preload=["torch"])  # type: ignore[attr-defined]
    try:
        owner = pm.slice(gpus=0).spawn("owner", RdmaBench)
        reader = pm.slice(gpus=1).spawn("reader", RdmaBench)
        buf = owner.make_buffer.call_one(SIZE).get(timeout=120)
        out: dict[str, object] = {}
        for op in ("read_into", "write_from"):
            name, times = reader.transfer.call_one(buf, op, runs).get(timeout=300)
            out[op] = gbps(times)
            out["backend"] = name
        ok = owner.checksum.call_one().get(timeout=60) == reader.checksum.call_one().get(timeout=60)
        out["data_checked"] = ok
        if backend == "shm":  # the one-copy baseline, measured in the same reader, right after
            out["memcpy_one_copy_shm"] = memcpy_baseline(reader, runs)
        return out
    finally:
        pm.stop()


def main() -> None:
    quick = "--quick" in sys.argv
    runs = 3 if quick else 7
    from jupyter_mesh._data import ucx as _ucx

    results: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "UCX_TLS": os.environ.get("UCX_TLS", "(UCX default)"),
        },
        "size_MiB": SIZE >> 20,
    }
    host = this_host(preload=["torch"])
    w7: dict[str, object] = {}
    for backend in ("shm", "ucx", "zmq"):
        if backend == "ucx" and not _ucx.available():
            w7[backend] = "skipped: ucxx not installed (pip install 'jupyter_mesh[ucx]')"
            continue
        w7[backend] = backend_run(host, backend, runs)
    base = {"memcpy_one_copy_shm": w7["shm"].pop("memcpy_one_copy_shm")}  # type: ignore[union-attr]
    base["pyzmq_zero_copy_tcp"] = pyzmq_baseline("tcp", runs)
    base["pyzmq_zero_copy_ipc"] = pyzmq_baseline("ipc", runs)
    results["baselines"] = base
    results["W7_rdma_64MiB_one_way"] = w7
    ratios = {}
    memcpy = base["memcpy_one_copy_shm"]["GBps"]
    zmq_tcp = base["pyzmq_zero_copy_tcp"]["GBps"]
    for backend, r in w7.items():
        if isinstance(r, dict):
            for op in ("read_into", "write_from"):
                ratios[f"{backend}.{op}/memcpy_one_copy_shm"] = round(r[op]["GBps"] / memcpy, 2)
                if backend == "ucx":
                    ratios[f"ucx.{op}/pyzmq_zero_copy_tcp"] = round(r[op]["GBps"] / zmq_tcp, 2)
    results["ratios"] = ratios
    targets = {
        "same-host (shm) >= 0.5 x memcpy_one_copy_shm": min(
            ratios[f"shm.{op}/memcpy_one_copy_shm"] for op in ("read_into", "write_from")
        )
        >= 0.5
    }
    if "ucx.read_into/pyzmq_zero_copy_tcp" in ratios:
        targets["ucx tcp >= pyzmq tcp"] = (
            min(ratios[f"ucx.{op}/pyzmq_zero_copy_tcp"] for op in ("read_into", "write_from")) >= 1.0
        )
    results["targets_met"] = targets
    results["for_reference"] = (
        "Monarch 0.7 RDMABuffer on this kind of machine (tcp fallback): ~0.5-0.7 GB/s (not installed here)"
    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
