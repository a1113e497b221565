"""A controller for the attacks on kept jobs (test_reattach_attacks.py): its own process, as a kernel
would be, steered through stdin: one command a line, one JSON line out per command.

    keep NODES              SlurmJob(keep_alive=True), proc mesh 'train' (2 a host), Counter 'counter'
    reattach [force] [T]    SlurmJob.reattach(force=..., timeout=T)
    incr [T]                counter.incr.call() on every rank
    incr_one RANK           counter.incr on one rank (call_one: straight to the actor, not through an agent)
    pids                    the procs' pids (proc mesh state)
    state                   which ranks are failed
    shout N                 every rank prints N lines
    flood N                 every rank starts printing N lines in a thread (returns at once)
    nest                    rank 0's actor spawns a proc mesh of its own (once): its actor's pid
    resize N                the proc mesh grows (or shrinks) to N procs (a one-host job)
    respawn                 respawn failed ranks
    stop_procs              procs.stop()
    stop_job                job.stop()
    jobs                    squeue's job ids
    exit                    a normal exit (the controller's shutdown: a kept job is detached)
    kill                    SIGKILL this process
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from jupyter_mesh import Actor, SlurmJob, endpoint, this_host
from jupyter_mesh.lowlevel import set_fault_hook


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


class Inner(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start
        self.inner = None

    @endpoint
    def nest(self) -> int:
        """A proc mesh of this actor's own (on its host), with an actor: its pid."""
        if self.inner is None:
            self.inner = this_host().spawn_procs(per_host={"p": 1}, name="inner").spawn("inner", Inner)
        return self.inner.pid.call_one().get(timeout=60)

    @endpoint
    def flood(self, n: int) -> None:
        """Print ``n`` lines from a thread, as fast as it can (the call returns at once)."""

        def run() -> None:
            for i in range(n):
                print(f"flood {i} " + "y" * 100)
            sys.stdout.flush()

        threading.Thread(target=run, daemon=True).start()

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def shout(self, n: int) -> int:
        for i in range(n):
            print(f"line {i} " + "x" * 200)
        return n


def main() -> None:
    job = procs = counter = None
    shouted = [0]  # lines of `shout` received
    faults: list[str] = []
    set_fault_hook(lambda e: faults.append(str(e)))  # as a kernel does: a failure nobody waited on is shown, not raised

    def sink(mesh: str, rank: int, label: str, fd: int, lines: list[str]) -> None:
        shouted[0] += sum(1 for line in lines if line.startswith("line "))

    from jupyter_mesh._runtime.controller import Controller

    Controller.get().output = sink  # worker output is counted, never printed on our stdout (the test reads it);
    # a controller that replaces this one (bound for SLURM, or a kept job's) keeps it

    for line in sys.stdin:
        cmd, *args = line.split()
        t0 = time.monotonic()
        try:
            if cmd == "keep":
                job = SlurmJob(nodes=int(args[0]), partition="debug", time="00:10:00", keep_alive=True)
                procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, name="train", timeout=120)
                counter = procs.spawn("counter", Counter, 10)
                counts = counter.incr.call().get(timeout=60)
                say(
                    step=cmd,
                    job_id=job.job_id,
                    counts=list(counts.values()),
                    pids=[r.pid for r in procs.state().ranks],
                    agents=[[a.addr, a.pid] for a in job.agents(1)],
                )
            elif cmd == "reattach":
                force = "force" in args
                t = [float(a) for a in args if a != "force"]
                job = SlurmJob.reattach(force=force, timeout=t[0] if t else 30.0)
                procs = job.proc_meshes().get("train")
                counter = job.actor_meshes().get("counter")
                say(
                    step=cmd,
                    procs=sorted(job.proc_meshes()),
                    actors=sorted(job.actor_meshes()),
                    notes=job.restored.notes,
                    seconds=time.monotonic() - t0,
                )
            elif cmd == "incr":
                got = counter.incr.call().get(timeout=float(args[0]) if args else 30)
                say(step=cmd, counts=list(got.values()))
            elif cmd == "incr_one":
                got = counter.slice(hosts=int(args[0]) // 2, gpus=int(args[0]) % 2).incr.call_one().get(timeout=30)
                say(step=cmd, count=got)
            elif cmd == "pids":
                say(step=cmd, pids=[r.pid for r in procs.state().ranks])
            elif cmd == "state":
                st = procs.state()
                say(step=cmd, failed=[r.rank for r in st.ranks if r.state.value == "failed"], text=str(st))
            elif cmd == "shout":
                shouted[0] = 0
                counter.shout.call(int(args[0])).get(timeout=120)
                time.sleep(1.0)  # the output comes as events, after the replies
                say(step=cmd, lines=shouted[0])
            elif cmd == "nest":
                got = counter.slice(hosts=0, gpus=0).nest.call_one().get(timeout=120)
                say(step=cmd, pid=got)
            elif cmd == "flood":
                counter.flood.call(int(args[0])).get(timeout=60)
                say(step=cmd)
            elif cmd == "resize":
                procs.resize(timeout=60, gpus=int(args[0]))
                say(step=cmd, sizes=procs.sizes, pids=[r.pid for r in procs.state().ranks])
            elif cmd == "respawn":
                procs.respawn()
                say(step=cmd, pids=[r.pid for r in procs.state().ranks])
            elif cmd == "stop_procs":
                procs.stop(timeout=10)
                say(step=cmd)
            elif cmd == "stop_job":
                job.stop()
                say(step=cmd)
            elif cmd == "jobs":
                ids = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
                say(step=cmd, ids=ids.stdout.split())
            elif cmd == "exit":
                say(step=cmd)
                return  # the controller's atexit shutdown detaches a kept job
            elif cmd == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                say(step=cmd, error=f"unknown command {cmd}")
        except Exception as e:  # noqa: BLE001 - the test reads it
            say(step=cmd, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)


if __name__ == "__main__":
    main()
