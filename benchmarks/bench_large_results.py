"""Large results of a gathered ``call``: each rank returns a tensor of ``--mib`` MiB. Prints one JSON object.

    python benchmarks/bench_large_results.py [--hosts 1] [--procs 2] [--mib 512] [--runs 3]

* ``call_s``/``call_GBps``: ``maker.ones.call(n).get()``, median of ``--runs`` (results of 1 MiB or more
  go from each proc straight to the caller, through shared memory: ``GATHER_DIRECT_MIN``)
* ``call_one_s``/``call_one_GBps``: the same bytes by ``call_one`` to each rank in turn (the direct path
  alone, its peer in the same run)
* ``agent_peak_rss_mib``: each host agent's peak RSS (``VmHWM``) after the calls: an agent that carried
  the results would hold every rank's at once
* ``args_call_s``/``args_GBps``/``agent_peak_rss_mib_after_args``: then the other way, a ``call`` whose
  argument is a tensor of ``--mib`` MiB (each host's agent gets it once and relays it to its procs)
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from bench_actors import Maker

    from jupyter_mesh import LocalJob

    job = LocalJob(hosts=a.hosts)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": a.procs})
        maker = pm.spawn("maker", Maker)
        maker.initialized.get(120)
        n, total = a.mib << 20, a.hosts * a.procs * a.mib / 1024  # GiB per call
        calls, ones = [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            r = maker.ones.call(n).get(300)
            calls.append(time.perf_counter() - t)
            del r
            t = time.perf_counter()
            for h in range(a.hosts):
                for g in range(a.procs):
                    del_me = maker.slice(hosts=h, gpus=g).ones.call_one(n).get(300)
                    del del_me
            ones.append(time.perf_counter() - t)
        call_s, one_s = statistics.median(calls), statistics.median(ones)
        peaks = [_peak_rss_mib(p) for p in job.pids()]
        import torch

        x, args = torch.ones(n // 4), []
        for _ in range(a.runs):
            t = time.perf_counter()
            maker.nelem.call(x).get(300)
            args.append(time.perf_counter() - t)
        args_s = statistics.median(args)
        out = {
            "hosts": a.hosts, "procs_per_host": a.procs, "mib_per_rank": a.mib, "runs": a.runs,
            "call_s": round(call_s, 3), "call_GBps": round(total / call_s, 2),
            "call_one_s": round(one_s, 3), "call_one_GBps": round(total / one_s, 2),
            "agent_peak_rss_mib": peaks, "args_call_s": round(args_s, 3), "args_GBps": round(total / args_s, 2),
            "agent_peak_rss_mib_after_args": [_peak_rss_mib(p) for p in job.pids()],
        }  # fmt: skip
        pm.stop()
    finally:
        job.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
