"""A torchrun script, unmodified: init from the environment, all_reduce, print, optionally fail or spin.

torchrun --nproc-per-node=4 allreduce.py [--steps N] [--fail-rank R] [--step-time S] [--out DIR]

Test hooks (the script stays a plain torchrun script): ``--alone-rank R``: only rank R joins and its
``init_process_group`` times out; ``--slow-group-rank R``: rank R's gloo group takes a second longer
to come up, and every rank records whether it was up when its own ``init_process_group`` returned.
"""

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--out", default="")
    p.add_argument("--announce", action="store_true", help="print a line once the process group is up")
    p.add_argument("--stall-rank", type=int, default=-1, help="this rank sleeps before it joins the group")
    p.add_argument("--alone-rank", type=int, default=-1, help="only this rank joins: its init times out")
    p.add_argument("--slow-group-rank", type=int, default=-1, help="this rank's group comes up a second late")
    args = p.parse_args()
    me = int(os.environ["RANK"])

    if args.stall_rank >= 0:
        print(f"rank {os.environ['RANK']} about to join", flush=True)
    if me == args.stall_rank:
        time.sleep(600)  # the others wait in the rendezvous meanwhile (native code: no interrupt reaches them)
    if args.alone_rank >= 0:
        if me == args.alone_rank:
            dist.init_process_group("gloo", timeout=timedelta(seconds=2))  # nobody comes: it raises
        return
    up = os.path.join(args.out, f"group{args.slow_group_rank}.up")
    if me == args.slow_group_rank:
        _slow_group(up)

    dist.init_process_group("gloo")
    if args.slow_group_rank >= 0:
        with open(os.path.join(args.out, f"saw{me}.json"), "w") as f:
            json.dump(os.path.exists(up), f)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.announce:
        print(f"rank {rank} joined", flush=True)
    total = torch.zeros(1)
    for step in range(args.steps):
        if rank == args.fail_rank:
            raise ValueError(f"rank {rank} fails on purpose at step {step}")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        total += t
        if args.step_time:
            time.sleep(args.step_time)
    print(f"rank {rank}/{world}: sum {total.item():g}", flush=True)
    if args.out:
        env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"sum": total.item(), "env": env, "argv": __import__("sys").argv}, f)
    dist.destroy_process_group()


def _slow_group(marker: str) -> None:
    """This rank's gloo group takes a second more to come up after it connected to every peer."""
    import torch.distributed.distributed_c10d as c10d

    real = c10d.ProcessGroupGloo

    def slow(*args, **kwargs):
        c10d.ProcessGroupGloo = real  # this run only: the proc runs other scripts after it
        pg = real(*args, **kwargs)
        time.sleep(1.0)
        with open(marker, "w"):
            pass
        return pg

    c10d.ProcessGroupGloo = slow


if __name__ == "__main__":
    main()
