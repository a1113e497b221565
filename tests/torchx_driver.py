"""A controller program for tests/test_torchx_job.py, run as its own process (python torchx_driver.py).

Why a separate process: a TorchX job's agents dial back over TCP (loopback for ``local_cwd``), and the
test process's own controller serves every other test on private unix sockets. Prints one JSON line
per step (``{"step": ..., ...}``); a failure prints ``{"error": ...}`` and exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))


def say(step: str, **kw) -> None:
    print(json.dumps({"step": step, **kw}), flush=True)


def main() -> None:
    from _procs import descendants, wait_dead
    from actors import Counter

    import jupyter_mesh.lowlevel
    from jupyter_mesh import SupervisionError, TorchXJob
    from jupyter_mesh._wire.keyfile import config_dir

    say("imported", torchx=sorted(m for m in sys.modules if m == "torchx" or m.startswith("torchx.")))
    faults: list = []
    jupyter_mesh.lowlevel.set_fault_hook(faults.append)  # like a kernel: a lost host is not fatal here
    sigint = signal.getsignal(signal.SIGINT)
    t0 = time.monotonic()
    job = TorchXJob(nodes=2, scheduler="local_cwd")
    jobs_dir = os.path.join(config_dir(), "jobs")
    records = [n for n in os.listdir(jobs_dir) if n.endswith(".json")]
    with open(os.path.join(jobs_dir, records[0])) as f:
        record = json.load(f)
    say(
        "submitted",
        handle=job.app_handle,
        sigint_kept=signal.getsignal(signal.SIGINT) is sigint,
        keys=[n for n in os.listdir(jobs_dir) if n.endswith(".key")],
        record=record,
    )
    procs = job.host_mesh().spawn_procs(per_host={"procs": 2}, timeout=120)
    counters = procs.spawn("c", Counter, 0)
    where = counters.whoami.call().get(60)
    agents = job.agents()
    from jupyter_mesh.ui.remote import scheduler_jobs

    say(
        "up",
        status=scheduler_jobs(),  # what `jupyter-mesh status` prints of it
        seconds=round(time.monotonic() - t0, 2),
        ranks=sorted(json.dumps(v, sort_keys=True) for v in where.values()),
        agents=[{"index": a.index, "pid": a.pid, "addr": a.addr} for a in agents],
        children=sorted(descendants(os.getpid())),
        keys=[n for n in os.listdir(jobs_dir) if n.endswith(".key")],
        state=job.state()[0],
    )
    victim = agents[1]
    os.kill(victim.pid, signal.SIGKILL)
    try:
        counters.incr.call().get(60)
        say("lost", cause=None)
    except SupervisionError as e:
        say("lost", cause=str(e))
    alive = counters.slice(hosts=0).incr.call().get(30)
    say("host0", values=sorted(alive.values()), state=job.state()[0])
    before = descendants(os.getpid())
    job.stop()
    say(
        "stopped",
        left=sorted(wait_dead(before, 10.0)),
        state=job.state()[0],
        files=sorted(n for n in os.listdir(jobs_dir) if not n.endswith(".logs")),
        status=scheduler_jobs(),
        sigint_kept=signal.getsignal(signal.SIGINT) is sigint,
    )


def slurm() -> None:
    """TorchX's slurm scheduler on the test SLURM (tests/cluster: no accounting, so no sacct)."""
    from actors import Counter

    from jupyter_mesh import TorchXJob

    job = TorchXJob(nodes=2, scheduler="slurm", scheduler_args={"partition": "debug", "time": "00:10:00"})
    say("submitted", handle=job.app_handle, state=list(job.state()))
    procs = job.host_mesh().spawn_procs(per_host={"procs": 1}, timeout=120)
    where = procs.spawn("c", Counter, 0).whoami.call().get(60)
    say(
        "up",
        ranks=sorted(v["hosts"] for v in where.values()),
        agents=[a.addr for a in job.agents()],
        state=list(job.state()),
    )
    procs.stop()
    job.stop()
    say("stopped", state=list(job.state()))


def fails(script: str) -> None:
    """Replicas whose agent cannot start (``script`` stands in for the interpreter): the wait ends when
    TorchX says the app ended, with the replica's output, not at the timeout."""
    from _procs import descendants

    from jupyter_mesh import TorchXJob
    from jupyter_mesh._wire.keyfile import config_dir

    job = TorchXJob(nodes=2, python=script)
    t0 = time.monotonic()
    try:
        job.agents(timeout=100)
        say("failed", cause=None)
    except Exception as e:  # noqa: BLE001 - the test reads it
        say("failed", cause=f"{type(e).__name__}: {e}", within_timeout=time.monotonic() - t0 < 100)
    job.stop()
    jobs_dir = os.path.join(config_dir(), "jobs")
    say(
        "stopped",
        files=sorted(n for n in os.listdir(jobs_dir) if not n.endswith(".logs")),
        children=sorted(descendants(os.getpid())),
    )


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["slurm"]:
            slurm()
        elif sys.argv[1:2] == ["fails"]:
            fails(sys.argv[2])
        else:
            main()
    except BaseException as e:  # noqa: BLE001 - the test reads why
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}), flush=True)
        sys.exit(1)
    from jupyter_mesh._runtime.controller import Controller

    Controller.get().shutdown()
