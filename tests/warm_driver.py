"""A controller program for tests/test_warm_remote.py, run as its own process (python warm_driver.py MODE FLAG).

Hosts that agents bring up (``attach``: two ``jupyter-mesh agent --listen`` on loopback; ``torchx``: two
``local_cwd`` replicas that dial back; ``slurm``: two nodes of tests/cluster's SLURM) warm up by default: each host's template imports what it has of
``jobs.warm``'s list. The list gets one more name here, ``slow_warm_import``, whose import waits while
the file FLAG exists: the agents must report in while their templates are still importing it. Its own
process because such a controller listens on TCP. One JSON line per step; a failure exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.dirname(__file__))


def say(step: str, **kw) -> None:
    print(json.dumps({"step": step, **kw}), flush=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listeners(n: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, addrs = [], []
    for _ in range(n):
        addr = f"tcp://127.0.0.1:{_free_port()}"
        p = subprocess.Popen(
            [sys.executable, "-m", "jupyter_mesh.cli", "agent", "--listen", addr],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        line = p.stdout.readline().decode()  # type: ignore[union-attr]
        assert "waiting to be attached" in line, line
        procs.append(p)
        addrs.append(addr)
    return procs, addrs


def check(job, flag: str, names: list[str]) -> None:
    """The agents joined while FLAG held their templates; then procs fork warm from those templates."""
    from _procs import descendants
    from test_warm import _ppid, has_torch, templates
    from warm_actors import Loaded

    agents = job.agents(120)
    say("joined", hosts=len(agents), flag_still_there=os.path.exists(flag))
    os.unlink(flag)  # the templates finish their warm imports now
    procs = job.host_mesh().spawn_procs(per_host={"procs": 1}, timeout=120)
    probe = procs.spawn("probe", Loaded)
    had = list(probe.had.call(names).get(60).values())
    ppids = sorted(probe.where.call().get(60).values())
    mine = descendants(os.getpid())  # attach, local_cwd: the agents run here; SLURM's run on its nodes
    tmpl = sorted(t for a in agents if a.pid in mine for t in templates(a.pid))
    say(
        "spawned",
        had=had,
        grandparents=sorted(_ppid(p) for p in ppids),
        templates=tmpl,
        torch_in_parents=[has_torch(p) for p in ppids],
    )
    procs.stop()


def main() -> None:
    mode, flag = sys.argv[1], sys.argv[2]
    import slow_warm_import  # noqa: F401 - imported here at once (no flag yet): "this program imported it"

    os.environ["JM_SLOW_IMPORT_FLAG"] = flag  # the agents' templates wait on it
    from jupyter_mesh.config import configured
    from jupyter_mesh.jobs import warm

    warm.WARM_CANDIDATES = (*warm.WARM_CANDIDATES, "slow_warm_import")
    names = ["torch", "slow_warm_import"]
    say("list", remote=warm.remote_warm())
    if mode == "attach":
        from jupyter_mesh import AttachJob

        ls, addrs = listeners(2)
        try:
            job = AttachJob(addrs)
            try:
                check(job, flag, names)
            finally:
                job.stop()
            with configured(warm=False):  # opted out: the next session's templates import nothing extra
                job = AttachJob(addrs)
            try:
                procs = job.host_mesh().spawn_procs(per_host={"procs": 1}, timeout=120)
                from warm_actors import Loaded

                say("opted_out", had=list(procs.spawn("probe", Loaded).had.call(names).get(60).values()))
                procs.stop()
            finally:
                job.stop()
        finally:
            for p in ls:
                p.send_signal(signal.SIGTERM)
            for p in ls:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
                p.stdout.close()  # type: ignore[union-attr]
    elif mode == "torchx":
        from jupyter_mesh import TorchXJob

        job = TorchXJob(nodes=2, scheduler="local_cwd")
        try:
            check(job, flag, names)
        finally:
            job.stop()
    elif mode == "slurm":  # tests/cluster: the SLURM of the namespace hosts
        from jupyter_mesh import SlurmJob

        job = SlurmJob(nodes=2, partition="debug", time="00:10:00")
        try:
            check(job, flag, names)
        finally:
            job.stop()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    from _procs import descendants, wait_dead

    say("stopped", left=sorted(wait_dead(descendants(os.getpid()), 10.0)))


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001
        say("error", error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
        sys.exit(1)
