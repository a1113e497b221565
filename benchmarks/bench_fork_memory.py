"""What a forked proc's full garbage collection costs it, in time and in pages made private. Prints JSON.

    python benchmarks/bench_fork_memory.py [--procs 16] [--module torch]

A proc forked from a template shares the template's pages until it writes to them. CPython's collector
writes to every object it walks (its ``gc_refs``), so a proc's first full collection used to copy the
pages of everything the template had imported. The template now freezes what it holds before it forks
(``gc.freeze`` in ``_runtime/template.py``).

* ``bare``: a fresh Python imports ``--module`` then forks once; the child times one ``gc.collect()``
  and reads its private memory (``/proc/self/smaps_rollup``) before and after; once without and once
  with ``gc.freeze()`` before the fork: the peer measured in the same run.
* ``mesh``: ``LocalJob(hosts=1)`` with the warm default, ``--procs`` procs, each does the same in an
  actor: what jupyter_mesh's procs pay now (the medians, and the growth summed over the procs).

Not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def private_mib() -> float:
    """This process's private memory (MiB): the pages it no longer shares with its parent."""
    with open("/proc/self/smaps_rollup") as f:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in f.read().splitlines()[1:]}
    return (fields["Private_Dirty"] + fields["Private_Clean"]) / 1024


_BARE = (
    "import gc, importlib, json, os, sys, time\n"
    + inspect.getsource(private_mib)
    + """
importlib.import_module(sys.argv[1])
if sys.argv[2] == "1":
    gc.collect()
    gc.freeze()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    time.sleep(0.1)  # the fork's own page-table work is done: measure the collection alone
    before = private_mib()
    t = time.perf_counter()
    gc.collect()
    ms = (time.perf_counter() - t) * 1000
    os.write(w, json.dumps({"gc_ms": ms, "private_before_mib": before, "private_after_mib": private_mib()}).encode())
    os._exit(0)
os.close(w)
out = os.read(r, 4096)
os.waitpid(pid, 0)
print(out.decode())
"""
)


def bare(module: str, freeze: bool) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", _BARE, module, "1" if freeze else "0"], capture_output=True, text=True, timeout=120
    )
    if p.returncode != 0:
        raise RuntimeError(f"the bare fork of {module} failed: {p.stderr[-2000:]}")
    r = json.loads(p.stdout)
    return {k: round(v, 1) for k, v in r.items()}


def mesh(procs: int) -> dict[str, Any]:
    from jupyter_mesh import Actor, LocalJob, endpoint

    class Collect(Actor):
        @endpoint
        def collect(self) -> tuple[float, float, float]:
            import gc

            before = private_mib()
            t = time.perf_counter()
            gc.collect()
            return (time.perf_counter() - t) * 1000, before, private_mib()

    job = LocalJob(hosts=1)
    try:
        mesh_ = job.host_mesh().spawn_procs(per_host={"gpus": procs}, timeout=300)
        results = []
        for rank_result in mesh_.spawn("collect", Collect).collect.call().get(120).values():
            results.append(rank_result)
        mesh_.stop()
    finally:
        job.stop()
    gc_ms, before, after = zip(*results, strict=True)
    return {
        "procs": procs,
        "gc_ms_p50": round(statistics.median(gc_ms), 1),
        "private_before_mib_p50": round(statistics.median(before), 1),
        "private_after_mib_p50": round(statistics.median(after), 1),
        "private_growth_mib_total": round(sum(a - b for a, b in zip(after, before, strict=True)), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--module", default="torch", help="what the bare template imports (the warm default: torch)")
    a = ap.parse_args()
    out = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load": os.getloadavg()[0],
        "bare": {"module": a.module, "no_freeze": bare(a.module, False), "freeze": bare(a.module, True)},
        "mesh": mesh(a.procs),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
