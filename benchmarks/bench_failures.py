"""W5: failure detection latency, printed as JSON.

    python benchmarks/bench_failures.py

kill -9 of a proc during a 5 s call -> the caller's future fails (median of 7), and SIGSTOP of a
proc -> found by heartbeats (default timeout 3 s; median of 3). Not a test: no timing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_actors import Bench

from jupyter_mesh import SupervisionError, this_host
from jupyter_mesh.lowlevel import set_fault_hook


def measure(procs, bench, sig: int) -> float:
    one = bench.slice(gpus=1)
    pid = one.pid.call_one().get(timeout=30)
    fut = one.sleep.call_one(5.0)
    time.sleep(0.2)
    t0 = time.perf_counter()
    os.kill(pid, sig)
    try:
        fut.get(timeout=30)
    except SupervisionError:
        took = time.perf_counter() - t0
    else:
        raise RuntimeError("the call did not fail")
    procs.respawn()
    return took


def main() -> None:
    set_fault_hook(lambda err: None)  # failures here are deliberate
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    bench = procs.spawn("bench", Bench)
    bench.initialized.get(timeout=30)
    kills = [measure(procs, bench, signal.SIGKILL) for _ in range(7)]
    stops = [measure(procs, bench, signal.SIGSTOP) for _ in range(3)]
    procs.stop()
    print(
        json.dumps(
            {
                "W5_kill9_during_call_to_error_ms": {
                    "median": round(statistics.median(kills) * 1e3, 2),
                    "min": round(min(kills) * 1e3, 2),
                    "max": round(max(kills) * 1e3, 2),
                    "n": len(kills),
                },
                "sigstop_to_error_by_heartbeat_s": {
                    "median": round(statistics.median(stops), 2),
                    "n": len(stops),
                    "heartbeat_timeout_s": 3.0,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
