"""A controller for the attack tests (test_multihost_attacks.py), run as its own process and steered
through stdin: one command a line, one JSON line out per command.

    job ADDR...        AttachJob(ADDRS) (sends the attach; does not wait)
    agents T           job.agents(T)
    spawn              a proc mesh (1 per host) with an actor on it, then one call
    call [T]           call that actor
    nap S              a call that sleeps S seconds
    stopped_echo MIB   SIGSTOP the (one) proc, call_one it with a MIB MiB array, change the array, SIGCONT:
                       whether call_one returned while the proc was still stopped, and whether the
                       actor got the array unchanged
    stop_job           job.stop()
    quit               stop everything and exit
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

from jupyter_mesh import Actor, AttachJob, endpoint


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


class P(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def nap(self, s: float) -> int:
        time.sleep(s)
        return os.getpid()


def _commands():
    """The test's commands, one per line. A failure nothing waited on interrupts this program's main
    thread (fail fast, the default in a script) while it waits here: the driver catches that, as a
    script may, and the failure is raised by its next call, which the test reads."""
    while True:
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        yield line


def main() -> None:
    job = procs = actor = None
    for line in _commands():
        cmd, *args = line.split()
        t0 = time.monotonic()
        try:
            if cmd == "job":
                job = AttachJob(args)
                say(step=cmd)
            elif cmd == "agents":
                ag = job.agents(float(args[0]))
                say(step=cmd, agents=[[a.addr, a.pid] for a in ag], seconds=time.monotonic() - t0)
            elif cmd == "spawn":
                procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30)
                actor = procs.spawn("p", P)
                got = actor.pid.call().get(timeout=30)
                say(step=cmd, pids=[v for _, v in got.items()], seconds=time.monotonic() - t0)
            elif cmd == "call":
                got = actor.pid.call().get(timeout=float(args[0]) if args else 30)
                say(step=cmd, pids=[v for _, v in got.items()], seconds=time.monotonic() - t0)
            elif cmd == "nap":
                got = actor.nap.call(float(args[0])).get(timeout=60)
                say(step=cmd, pids=[v for _, v in got.items()], seconds=time.monotonic() - t0)
            elif cmd == "hold_gil":  # a long C call that keeps the GIL: no thread of ours runs meanwhile
                ctypes.PyDLL(None).sleep(int(args[0]))
                say(step=cmd)
            elif cmd == "stopped_echo":
                import numpy as np

                (pid,) = actor.pid.call().get(timeout=30).values()
                arr = np.zeros(int(args[0]) << 20, np.uint8)
                os.kill(pid, signal.SIGSTOP)
                try:
                    fut = actor.echo.call_one(arr)
                    with open(f"/proc/{pid}/stat") as f:
                        still_stopped = f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
                    arr[:] = 1  # value semantics: the call carries what the array held when it was made
                finally:
                    os.kill(pid, signal.SIGCONT)
                got = fut.get(timeout=60)
                say(step=cmd, still_stopped=still_stopped, nbytes=int(got.nbytes), unchanged=not got.any())
            elif cmd == "shm_prefix":  # the names of this session's shared-memory segments
                from jupyter_mesh._wire.shm import session_prefix

                say(step=cmd, prefix=session_prefix(job._controller.key))
            elif cmd == "stop_job":
                job.stop()
                say(step=cmd)
            elif cmd == "quit":
                break
            else:
                say(step=cmd, error=f"unknown command {cmd}")
        except Exception as e:  # noqa: BLE001 - the test reads it
            say(step=cmd, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    if procs is not None:
        try:
            procs.stop(timeout=10)
        except Exception:  # noqa: BLE001
            pass
    if job is not None:
        job.stop()
    say(step="quit")


if __name__ == "__main__":
    main()
