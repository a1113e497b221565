"""Faults of each process kind: time to a clear error, and time to a working mesh again (JSON).

    python benchmarks/bench_faults.py

For the README's failure table. Each fault is caused for real (signals to real processes; relay
failures injected in the agent with JUPYTER_MESH_FAIL_RELAYS). Not a test: nothing is asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from jupyter_mesh import Actor, LocalJob, MeshError, endpoint
from jupyter_mesh.lowlevel import set_fault_hook


class Worker(Actor):
    @endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def ok(self) -> str:
        return "fine"


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _fails(fut: Any) -> None:
    try:
        fut.get(30)
    except MeshError:
        return
    raise RuntimeError("the call did not fail")


def _mesh(job: LocalJob, n: int = 2) -> tuple[Any, Any]:
    pm = job.host_mesh().spawn_procs(per_host={"gpus": n})
    w = pm.spawn("w", Worker)
    w.initialized.get(30)
    return pm, w


def _template_pid(job: LocalJob, pm: Any) -> int:
    procs = set(pm.pids().values())
    agent = job.pids()[0]
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in procs:
            with contextlib.suppress(OSError), open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == agent:
                    return int(name)
    raise RuntimeError("no template found")


def relay_failure() -> dict[str, float]:
    os.environ["JUPYTER_MESH_FAIL_RELAYS"] = "c:1"
    job = LocalJob(hosts=1)
    del os.environ["JUPYTER_MESH_FAIL_RELAYS"]
    pm, w = _mesh(job)
    err = _time(lambda: _fails(w.ok.call()))
    again = _time(lambda: w.ok.call().get(30))
    pm.stop()
    job.stop()
    return {"to_error_ms": err * 1e3, "next_call_ms": again * 1e3}


def agent_killed() -> dict[str, float]:
    job = LocalJob(hosts=1)
    pm, w = _mesh(job)
    fut = w.sleep.call(30)
    time.sleep(0.2)
    t0 = time.perf_counter()
    os.kill(job.pids()[0], signal.SIGKILL)
    _fails(fut)
    err = time.perf_counter() - t0
    respawn_refused = _time(lambda: _refuse(pm.respawn))
    recover = _time(lambda: _mesh(job)[0].stop())
    pm.stop()
    job.stop()
    return {"to_error_ms": err * 1e3, "respawn_refused_ms": respawn_refused * 1e3, "new_mesh_s": recover}


def agent_stalled() -> dict[str, float]:
    job = LocalJob(hosts=1)
    pm, w = _mesh(job)
    fut = w.sleep.call(30)
    time.sleep(0.2)
    agent = job.pids()[0]
    t0 = time.perf_counter()
    os.kill(agent, signal.SIGSTOP)
    _fails(fut)
    err = time.perf_counter() - t0
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent, signal.SIGCONT)
    stop = _time(lambda: pm.stop(timeout=2))
    recover = _time(lambda: _mesh(job)[0].stop())
    job.stop()
    return {"to_error_s": err, "stop_of_its_mesh_ms": stop * 1e3, "new_mesh_s": recover}


def template_killed() -> dict[str, float]:
    job = LocalJob(hosts=1)
    pm, w = _mesh(job)
    fut = w.sleep.call(30)
    time.sleep(0.2)
    t0 = time.perf_counter()
    os.kill(_template_pid(job, pm), signal.SIGKILL)
    _fails(fut)
    err = time.perf_counter() - t0
    time.sleep(0.3)  # every rank reported
    respawn = _time(lambda: pm.respawn(timeout=30))
    pm.stop()
    job.stop()
    return {"to_error_ms": err * 1e3, "respawn_s": respawn}


def cancel_blocked_sleep() -> dict[str, float]:
    job = LocalJob(hosts=1)
    pm, w = _mesh(job)
    times = []
    for _ in range(5):
        fut = w.sleep.call(30)
        time.sleep(0.3)
        t0 = time.perf_counter()
        fut.cancel()
        w.ok.call().get(30)  # answers only once every rank left its sleep
        times.append(time.perf_counter() - t0)
    pm.stop()
    job.stop()
    return {"cancel_to_next_answer_ms_median": statistics.median(times) * 1e3}


def _refuse(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except MeshError:
        return
    raise RuntimeError("did not refuse")


def main() -> None:
    set_fault_hook(lambda err: None)  # failures here are deliberate
    out = {
        "relay_failure": relay_failure(),
        "agent_kill_9": agent_killed(),
        "agent_sigstop": agent_stalled(),
        "template_kill_9": template_killed(),
        "cancel_of_blocking_sleep": cancel_blocked_sleep(),
        "heartbeat_timeout_s": float(os.environ.get("JUPYTER_MESH_HEARTBEAT_TIMEOUT", "3.0")),
    }
    print(
        json.dumps(
            {k: {m: round(v, 3) for m, v in d.items()} if isinstance(d, dict) else d for k, d in out.items()}, indent=2
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
