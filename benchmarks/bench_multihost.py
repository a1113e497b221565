"""Across hosts vs within one: attach, spawn, call latency and 64 MiB moves, on namespace hosts.

Needs root (network namespaces): two "hosts" from tests/cluster/netns.py, each running
``jupyter-mesh agent --listen``; the controller (this process) attaches to them over TCP + CURVE.
Prints one JSON object. Run: ``sudo .venv/bin/python benchmarks/bench_multihost.py`` (``make bench``
skips it when not root).

What it measures, each as the median of several runs:
  attach_s         attach_to_workers to two listening agents
  spawn_s          spawn_procs 2 x 2 + an actor on each, until all answer
  call_p50_ms      call + gather on all 4 ranks (2 hosts)
  call_one_p50_ms  call_one to a rank on the other host
  echo_64m_*       a 64 MiB tensor to one rank and back (2 x 64 MiB over CURVE TCP): GB/s
  rdma_64m_*       RDMABuffer.read_into of 64 MiB: same host (shared memory) vs across hosts (UCX or zmq)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))

import netns  # noqa: E402
import torch  # noqa: E402

from jupyter_mesh import Actor, RDMABuffer, attach_to_workers, endpoint, get_rdma_backend  # noqa: E402

N = 16 << 20  # float32: 64 MiB


class B(Actor):
    def __init__(self) -> None:
        self.t = torch.ones(N)
        self.buf = RDMABuffer(self.t)

    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def echo(self, t):
        return t

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def pull(self, buf: RDMABuffer) -> tuple[str, float]:
        dst = torch.empty(N)
        t0 = time.perf_counter()
        buf.read_into(dst).get(timeout=120)
        return get_rdma_backend(buf), time.perf_counter() - t0


def main() -> None:
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root for network namespaces"}))
        return
    cfg = tempfile.mkdtemp(prefix="jm-bench-")
    os.environ["JUPYTER_MESH_CONFIG_DIR"] = cfg
    subprocess.run([sys.executable, "-m", "jupyter_mesh.cli", "keygen"], check=True, capture_output=True)
    out: dict[str, object] = {}
    with netns.Hosts(2) as hosts:
        agents, addrs = [], []
        for i, h in enumerate(hosts):
            addr = f"tcp://{h.ip}:{6100 + i}"
            p = netns.run_in(
                h, [sys.executable, "-m", "jupyter_mesh.cli", "agent", "--listen", addr], stdout=subprocess.PIPE
            )
            p.stdout.readline()
            agents.append(p)
            addrs.append(addr)
        try:
            t0 = time.perf_counter()
            hm = attach_to_workers(addrs)
            out["attach_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            procs = hm.spawn_procs(per_host={"gpus": 2})
            b = procs.spawn("b", B)
            b.ping.call().get(timeout=120)
            out["spawn_s"] = time.perf_counter() - t0
            lat = []
            for _ in range(200):
                t0 = time.perf_counter()
                b.ping.call().get(timeout=30)
                lat.append(time.perf_counter() - t0)
            out["call_p50_ms"] = statistics.median(lat) * 1e3
            far = b.slice(hosts=1, gpus=0)
            lat = []
            for _ in range(200):
                t0 = time.perf_counter()
                far.ping.call_one().get(timeout=30)
                lat.append(time.perf_counter() - t0)
            out["call_one_p50_ms"] = statistics.median(lat) * 1e3
            x = torch.randn(N)
            secs = []
            for _ in range(5):
                t0 = time.perf_counter()
                far.echo.call_one(x).get(timeout=120)
                secs.append(time.perf_counter() - t0)
            out["echo_64m_gbps_median"] = 2 * N * 4 / statistics.median(secs) / 1e9
            buf = b.slice(hosts=0, gpus=0).handle.call_one().get(timeout=60)
            for label, reader in (("same_host", b.slice(hosts=0, gpus=1)), ("other_host", far)):
                runs = [reader.pull.call_one(buf).get(timeout=180) for _ in range(5)]
                out[f"rdma_64m_{label}_backend"] = runs[0][0]
                out[f"rdma_64m_{label}_gbps_median"] = N * 4 / statistics.median(s for _, s in runs) / 1e9
            procs.stop()
        finally:
            for p in agents:
                p.terminate()
            for p in agents:
                p.wait(15)
                p.stdout.close()
            shutil.rmtree(cfg, ignore_errors=True)  # its key
    out["ucx_tls"] = os.environ.get("UCX_TLS", "")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
