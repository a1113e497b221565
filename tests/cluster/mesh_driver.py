"""A controller program for the multi-host tests, run as its own process (python mesh_driver.py SCENARIO ...).

Why a separate process: a controller that reaches other hosts listens on TCP, and the test process's
own controller serves every other test on private unix sockets. Each scenario prints one JSON line
per step (``{"step": ..., ...}``) that the test reads; a failure prints ``{"error": ...}`` and exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

from jupyter_mesh import (
    Actor,
    AttachJob,
    RDMABuffer,
    SlurmJob,
    SupervisionError,
    current_rank,
    endpoint,
    get_rdma_backend,
)


def say(step: str, **kw) -> None:
    print(json.dumps({"step": step, **kw}), flush=True)


class Probe(Actor):
    @endpoint
    def where(self) -> dict:
        return {
            "netns": os.stat("/proc/self/ns/net").st_ino,
            "pid": os.getpid(),
            "node": os.environ.get("SLURMD_NODENAME"),
            "rank": dict(current_rank()),
        }

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def checksum(self, t) -> float:
        return float(torch.as_tensor(t).double().sum())

    @endpoint
    def nap(self, s: float) -> int:
        time.sleep(s)
        return os.getpid()


class Holder(Actor):
    """Owns a tensor and hands out an RDMABuffer to it; reads others' buffers."""

    def __init__(self, n: int):
        self.t = torch.arange(n, dtype=torch.float32) + current_rank().rank
        self.buf = RDMABuffer(self.t)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def pull(self, buf: RDMABuffer, n: int) -> dict:
        dst = torch.empty(n, dtype=torch.float32)
        t0 = time.monotonic()
        buf.read_into(dst).get(timeout=60)
        return {"backend": get_rdma_backend(buf), "sum": float(dst.double().sum()), "seconds": time.monotonic() - t0}


def payloads() -> dict:
    return {
        "none": None,
        "small": {"a": 1, "b": [1, 2, 3]},
        "tensor_31k": torch.arange(31 * 256, dtype=torch.float32),
        "tensor_1m": torch.arange(256 * 1024, dtype=torch.float32),
        "tensor_16m": torch.randn(4 << 20),
        "numpy": np.arange(100_000, dtype=np.int64),
        "bytes": os.urandom(70_000),
        "noncontig": torch.arange(64 * 1024, dtype=torch.float32).reshape(256, 256).t(),
        "nested": {"w": [torch.ones(20_000), {"b": np.ones(9000)}], "n": 3},
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def exercise(hosts_mesh, per_host: int) -> None:
    """Spawn, then every adverb with every payload; say where each rank ran."""
    t0 = time.monotonic()
    procs = hosts_mesh.spawn_procs(per_host={"gpus": per_host})
    probes = procs.spawn("probe", Probe)
    where = probes.where.call().get(timeout=60)
    say(
        "spawned",
        seconds=time.monotonic() - t0,
        where=[w for _, w in where.items()],
        me=os.stat("/proc/self/ns/net").st_ino,
    )
    bad = []
    for name, value in payloads().items():
        got = probes.echo.call(value).get(timeout=60)
        if not all(same(value, v) for _, v in got.items()):
            bad.append(f"call {name}")
        one = probes.slice(hosts=len(where) // per_host - 1, gpus=per_host - 1)
        if not same(value, one.echo.call_one(value).get(timeout=60)):
            bad.append(f"call_one {name}")
        if not same(value, probes.echo.choose(value).get(timeout=60)):
            bad.append(f"choose {name}")
        streamed = [f.get(timeout=60) for f in probes.echo.stream(value)]
        if len(streamed) != len(where) or not all(same(value, v) for v in streamed):
            bad.append(f"stream {name}")
        probes.echo.broadcast(value)
    t = torch.randn(1 << 20)
    sums = probes.checksum.call(t).get(timeout=60)
    if not all(abs(v - float(t.double().sum())) < 1e-6 for _, v in sums.items()):
        bad.append("checksum")
    say("adverbs", bad=bad)
    procs.stop()
    say("stopped")


def run_attach(addrs: list[str], per_host: int) -> None:
    job = AttachJob(addrs)
    job.agents(60)
    say("attached", agents=[a.addr for a in job.agents()])
    exercise(job.host_mesh(), per_host)
    job.stop()
    say("job_stopped")


def run_attach_refused(addrs: list[str]) -> None:
    """A second controller while another one is attached: refused at once, with why."""
    job = AttachJob(addrs)
    t0 = time.monotonic()
    try:
        job.agents(30)
        say("attached")
    except Exception as e:  # noqa: BLE001
        say("refused", error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    job.stop()


def run_attach_hold(addrs: list[str]) -> None:
    """Attach and hold until stdin closes (the test attaches a second controller meanwhile)."""
    job = AttachJob(addrs)
    job.agents(60)
    say("attached")
    sys.stdin.read()
    job.stop()


def run_attach_wrong_key(addrs: list[str]) -> None:
    job = AttachJob(addrs)
    t0 = time.monotonic()
    try:
        job.agents(4)
        say("attached")
    except Exception as e:  # noqa: BLE001
        say("failed", error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    job.stop()


def run_attach_rdma(addrs: list[str]) -> None:
    """RDMABuffers between procs on two hosts and on one host: which backend, right bytes, how fast."""
    n = 16 << 20  # 64 MiB of float32
    job = AttachJob(addrs)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 2})
    holders = procs.spawn("holders", Holder, n)
    h00, h01, h10 = (holders.slice(hosts=h, gpus=g) for h, g in ((0, 0), (0, 1), (1, 0)))
    buf = h00.handle.call_one().get(timeout=60)
    want = float((torch.arange(n, dtype=torch.float32)).double().sum())
    for label, reader in (("same_host", h01), ("other_host", h10)):
        results = [reader.pull.call_one(buf, n).get(timeout=120) for _ in range(3)]
        say(
            label,
            backends=[r["backend"] for r in results],
            ok=all(r["sum"] == want for r in results),
            gbps=[n * 4 / r["seconds"] / 1e9 for r in results],
        )
    procs.stop()
    job.stop()


def run_slurm(nodes: int, per_host: int) -> None:
    job = SlurmJob(nodes=nodes, partition="debug", time="00:10:00")
    say("submitted", job_id=job.job_id)
    job.agents(120)
    say("agents", nodes=job.node_names(), state=job.slurm_state()[0])
    from jupyter_mesh.ui.remote import scheduler_jobs

    say("status", lines=scheduler_jobs())  # what `jupyter-mesh status` prints of it
    exercise(job.host_mesh(), per_host)
    job.stop()
    say("job_stopped", job_id=job.job_id, status=scheduler_jobs())


def run_slurm_fault(nodes: int, fault: str, arg: str) -> None:
    """Spawn on SLURM, start a long call, cause ``fault`` (scancel | kill_agent | cut VETH), and
    report what the call and the state say, and how long it took."""
    job = SlurmJob(nodes=nodes, partition="debug", time="00:10:00")
    hosts_mesh = job.host_mesh()
    agents = job.agents(120)
    procs = hosts_mesh.spawn_procs(per_host={"gpus": 1})
    probes = procs.spawn("probe", Probe)
    probes.where.call().get(timeout=60)
    say("hosts", **_hosts(procs.state()))
    fut = probes.nap.call(60)
    time.sleep(0.5)
    t0 = time.monotonic()
    if fault == "scancel":
        subprocess.run(["scancel", str(job.job_id)], check=True, timeout=30)
    elif fault == "kill_agent":
        os.kill(agents[-1].pid, signal.SIGKILL)
    elif fault == "cut":
        subprocess.run(["ip", "link", "set", arg, "down"], check=True, timeout=30)
    try:
        fut.get(timeout=30)
        say("fault", error=None)
    except SupervisionError as e:
        say("fault", error=str(e), seconds=time.monotonic() - t0, kind=type(e).__name__)
    except Exception as e:  # noqa: BLE001
        say("fault", error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0, kind=type(e).__name__)
    if fault == "cut":
        subprocess.run(["ip", "link", "set", arg, "up"], check=True, timeout=30)
    states = procs.state()
    say("state", text=str(states), **_hosts(states))
    t1 = time.monotonic()
    procs.stop(timeout=10)
    job.stop()
    say("job_stopped", job_id=job.job_id, seconds=time.monotonic() - t1)


def _hosts(state) -> dict:
    """What the views get of a mesh's hosts and job (the widget's, the sidebar's, ``jupyter-mesh status``)."""
    from jupyter_mesh.ui.table import text_table
    from jupyter_mesh.ui.wire import mesh_wire

    wire = mesh_wire(state)
    return {"hosts": wire["hosts"], "job": wire["job"], "table": text_table([wire])}


class Counter(Actor):
    """State that must survive a change of controller."""

    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def run_keep(nodes: int, then: str) -> None:
    """A kept-alive job with a proc mesh and a counter actor; then ``exit`` (a normal exit: the
    controller detaches), ``kill`` (SIGKILL itself: the agents detach on its silence) or ``hold``
    (stay until stdin closes, reporting what a call says then)."""
    job = SlurmJob(nodes=nodes, partition="debug", time="00:10:00", keep_alive=True)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, name="train")
    counter = procs.spawn("counter", Counter, 10)
    for _ in range(3):
        counts = counter.incr.call().get(timeout=60)
    pids = counter.pid.call().get(timeout=60)
    say("kept", job_id=job.job_id, counts=list(counts.values()), pids=list(pids.values()))
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "hold":
        while True:  # a takeover interrupts this wait (fail fast): caught, as a script may; the call says why
            try:
                sys.stdin.readline()
                break
            except KeyboardInterrupt:
                continue
        try:
            counter.incr.call().get(timeout=30)
            say("after", error=None)
        except Exception as e:  # noqa: BLE001
            say("after", error=f"{type(e).__name__}: {e}")
        os._exit(0)  # the job is someone else's now: no stop, no detach


def run_reattach(force: str, then: str, kill_rank: str = "") -> None:
    """Take the kept job back; the counters go on from where they were; ``then``: ``stop`` or ``exit``."""
    try:
        job = SlurmJob.reattach(force=force == "force", timeout=30)
    except Exception as e:  # noqa: BLE001
        say("reattach", error=f"{type(e).__name__}: {e}")
        return
    procs, actors = job.proc_meshes(), job.actor_meshes()
    counter = actors["counter"]
    say("reattach", error=None, procs=sorted(procs), actors=sorted(actors), notes=job.restored.notes)
    st = procs["train"].state()
    if kill_rank:
        ok = [r.rank for r in st.ranks if r.state.value != "failed"]
        say("found", running=ok)
        procs["train"].respawn()
    counts = counter.incr.call().get(timeout=60)
    pids = counter.pid.call().get(timeout=60)
    say("counted", counts=list(counts.values()), pids=list(pids.values()))
    if then == "stop":
        job.stop()
        say("job_stopped", job_id=job.job_id)


def main() -> None:
    scenario, *args = sys.argv[1:]
    try:
        if scenario == "attach":
            run_attach(args[1:], int(args[0]))
        elif scenario == "attach_rdma":
            run_attach_rdma(args)
        elif scenario == "attach_refused":
            run_attach_refused(args)
        elif scenario == "attach_hold":
            run_attach_hold(args)
        elif scenario == "attach_wrong_key":
            run_attach_wrong_key(args)
        elif scenario == "slurm":
            run_slurm(int(args[0]), int(args[1]))
        elif scenario == "slurm_fault":
            run_slurm_fault(int(args[0]), args[1], args[2] if len(args) > 2 else "")
        elif scenario == "keep":
            run_keep(int(args[0]), args[1])
        elif scenario == "reattach":
            run_reattach(args[0], args[1], args[2] if len(args) > 2 else "")
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
