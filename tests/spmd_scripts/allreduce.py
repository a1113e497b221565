"""A torchrun script, unmodified: init from the environment, all_reduce, print, optionally fail or spin.

torchrun --nproc-per-node=4 allreduce.py [--steps N] [--fail-rank R] [--step-time S] [--out DIR]
"""

import argparse
import json
import os
import time

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
    args = p.parse_args()

    if args.stall_rank >= 0:
        print(f"rank {os.environ['RANK']} about to join", flush=True)
    if int(os.environ["RANK"]) == args.stall_rank:
        time.sleep(600)  # the others wait in the rendezvous meanwhile (native code: no interrupt reaches them)

    dist.init_process_group("gloo")
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


if __name__ == "__main__":
    main()
