"""A controller for tests/test_liveness.py's stalled-controller test, in a process of its own so the
test can SIGSTOP it: a one-host ``LocalJob`` with 2 procs and a call out. One JSON line per step:

    {"agent": pid, "procs": {rank: pid}}       ready: the test may stop this process now
    (reads a line on stdin: the test resumed it)
    {"lost": ..., "faults": [...], ...}        what the stall left, or "error": why a call failed
    {"stopped": true}                          the job is stopped
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from actors import Faulty

import jupyter_mesh.lowlevel
from jupyter_mesh import LocalJob


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    faults: list[object] = []
    jupyter_mesh.lowlevel.set_fault_hook(faults.append)  # like a kernel: report a lost host, do not exit
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        f = pm.spawn("f", Faulty)
        pids = f.pid.call().get(timeout=20)
        agents = job.pids()
        fut = f.sleep.call(3.0)  # ends while this process is stopped: its replies wait unread
        say(agent=agents[0], procs={str(p.rank): pid for p, pid in pids.items()})
        sys.stdin.readline()
        time.sleep(1.5)  # two heartbeat intervals: the verdict on the agent, were there one, is in
        out: dict[str, object] = {}
        try:
            out["call"] = sorted(set(fut.get(timeout=20).values()))
            out["same_procs"] = f.pid.call().get(timeout=20) == pids
            out["answers"] = list(f.ok.call().get(timeout=20).values())
        except Exception as e:  # noqa: BLE001 - the test reads why
            out["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["lost"] = dict(job._controller.links.lost)
        out["same_agent"] = job.pids() == agents
        out["ranks"] = [[str(r.state), str(r.failure)] for r in pm.state().ranks]
        out["hosts"] = [str(h.state) for h in pm.state().hosts]
        out["faults"] = [str(x)[:500] for x in faults]
        say(**out)
        pm.stop(timeout=5)
    finally:
        job.stop()
    say(stopped=True)


if __name__ == "__main__":
    main()
