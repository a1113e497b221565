"""The controller's own work for one ``call`` + gather, without processes: what it costs per rank.

A real ``Client`` and ``StateTracker`` (as the controller wires them: ``tests/_no_io.py``, shared with
``tests/test_gather_batch.py``) run a cast on a mesh of ``H`` hosts x ``G`` procs on a transport that sends
nothing, and are handed the ``H`` gathered replies a host agent would send (one table per agent it sent to: per host, or past the fan-out per top
subtree of the tree; a pickled value per rank). So a mesh of 16,384 ranks can be
measured on a laptop: what is left is the controller's Python per call and per rank, no wake-ups, no
signing, no sockets (those are per message, and measured by ``bench_core.py``).

For each point, interleaved round by round so the machine's load hits all alike:

  us_per_call       CPU (``time.process_time``) for one cast + its H replies + the ValueMesh, median
  us_per_rank       the same divided by H x G
  with_view         the same with a listener of every event subscribed (as the widget's hub does)

``--values`` picks what each rank returns: ``none`` (a no-op endpoint), ``rank`` (a distinct int per
rank) or ``dict`` (a small distinct dict per rank). Prints one JSON object. Run with the tree to measure
first on ``PYTHONPATH``:

    python benchmarks/bench_controller.py [--points 2x8,8x32,64x256,2048x8] [--rounds 30] [--values none]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _no_io import Actors, gathered, no_io_mesh

from jupyter_mesh._runtime import tree
from jupyter_mesh._runtime.client import Client
from jupyter_mesh._wire.protocol import OK
from jupyter_mesh._wire.transport import Message


def _point(hosts: int, per_host: int, values: str, view: bool) -> tuple[Client, Actors, list[Message]]:
    client, state, mesh = no_io_mesh(hosts, per_host)
    if view:
        state.subscribe(lambda ev: None)
    # one gathered reply per agent the controller sent to: per host, or per top subtree of the tree
    tp = tree.parents(hosts, tree.fanout())
    groups = [sorted(tree.subtree(tp, i)) for i, up in enumerate(tp) if up < 0] if tp else [[h] for h in range(hosts)]
    replies = []
    for group in groups:
        ranks = (r for h in group for r in range(h * per_host, (h + 1) * per_host))
        replies.append(gathered(0, [(r, OK, _value(r, values)) for r in ranks]))
    return client, mesh, replies


def _value(r: int, values: str) -> Any:
    return None if values == "none" else r if values == "rank" else {"rank": r, "loss": r / 7}


def _one(client: Client, mesh: Actors, replies: list[Message]) -> float:
    t0 = time.process_time()
    fut = client.cast(mesh, "noop", (), {}, "call")  # type: ignore[arg-type]
    call_id = next(reversed(client.calls.pending))
    for msg in replies:
        msg.header["i"] = call_id
        client.on_reply(msg)
    vm = fut.get(timeout=0)
    took = time.process_time() - t0
    assert len(vm) == len(mesh._ref.proc_addrs)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="2x8,8x32,64x256,2048x8")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=5, help="calls per point per round")
    ap.add_argument("--values", choices=("none", "rank", "dict"), default="none")
    args = ap.parse_args()
    points = [tuple(int(x) for x in p.split("x")) for p in args.points.split(",")]
    runs: dict[tuple[int, int, bool], tuple[Client, Actors, list[Message]]] = {}
    for h, g in points:
        for view in (False, True):
            runs[(h, g, view)] = _point(h, g, args.values, view)
            _one(*runs[(h, g, view)])  # warm up
    took: dict[tuple[int, int, bool], list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for key, run in runs.items():
            for _ in range(args.calls):
                took[key].append(_one(*run))
    out: dict[str, Any] = {"values": args.values, "rounds": args.rounds}
    for (h, g, view), xs in took.items():
        med = statistics.median(xs) * 1e6
        entry = out.setdefault(f"{h}x{g}", {"ranks": h * g})
        entry["with_view" if view else "us_per_call"] = round(med, 1)
        entry["with_view_per_rank" if view else "us_per_rank"] = round(med / (h * g), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
