"""The controller's own work for one ``call`` + gather, without processes: what it costs per rank.

A real ``Client`` and ``StateTracker`` (as the controller wires them) run a cast on a mesh of
``H`` hosts x ``G`` procs on a transport that sends nothing, and are handed the ``H`` gathered replies a
host agent would send (one table per agent it sent to: per host, or past the fan-out per top
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
import pickle
import statistics
import time
from typing import Any

from jupyter_mesh._core.refs import ProcMeshRef
from jupyter_mesh._core.shape import Shape
from jupyter_mesh._core.state import StateTracker
from jupyter_mesh._runtime import tree
from jupyter_mesh._runtime.client import Client
from jupyter_mesh._wire.protocol import OK, Kind
from jupyter_mesh._wire.transport import Message


class _NoTransport:
    """What ``Client`` uses of a transport, sending nothing."""

    address = "ipc:///nowhere/controller"

    def encode(self, msg: Message, to: Any, local: bool = False) -> list[Any]:
        return []

    def send_raw(self, address: str, frames: Any, wait: bool = True) -> None:
        return None

    def send(self, address: str, msg: Message, local: bool = False, wait: bool = True) -> None:
        return None

    @staticmethod
    def wait_sent(tracker: Any) -> None:
        return None

    def forget(self, address: str, linger_ms: int = 0) -> None:
        return None


class _Actors:
    """An ActorMeshRef over the whole proc mesh."""

    def __init__(self, ref: ProcMeshRef):
        self._ref, self._shape, self._view = ref, ref.shape, None
        self._actor_id, self._class_name, self._name = "bench-0", "Bench", "bench"


def _point(hosts: int, per_host: int, values: str, view: bool) -> tuple[Client, _Actors, list[Message]]:
    n = hosts * per_host
    shape = Shape.from_sizes({"hosts": hosts, "gpus": per_host})
    agents = [f"ipc:///nowhere/agent-{h}" for h in range(hosts)]
    ref = ProcMeshRef(
        "m-0", "m", shape, [f"ipc:///nowhere/p{r}" for r in range(n)], [r // per_host for r in range(n)], agents
    )
    client = Client(_NoTransport())  # type: ignore[arg-type]
    state = StateTracker()
    client.hooks.activity = state.activity
    state.created("m-0", "m", dict(shape.extent), [dict(shape.point(r)) for r in range(n)], agents, ref.rank_host)
    for r in range(n):
        state.ready("m-0", r, 1000 + r)
    if view:
        state.subscribe(lambda ev: None)
    # one gathered reply per agent the controller sent to: per host, or per top subtree of the tree
    tp = tree.parents(hosts, tree.fanout())
    groups = [sorted(tree.subtree(tp, i)) for i, up in enumerate(tp) if up < 0] if tp else [[h] for h in range(hosts)]
    replies = []
    for group in groups:
        table, parts = [], []
        for r in (r for h in group for r in range(h * per_host, (h + 1) * per_host)):
            value = None if values == "none" else r if values == "rank" else {"rank": r, "loss": r / 7}
            p = pickle.dumps(value, protocol=5)
            table.append([r, OK, len(p), 0])
            parts.append(p)
        replies.append(Message({"k": Kind.GATHERED, "i": 0, "n": table}, b"".join(parts), []))
    return client, _Actors(ref), replies


def _one(client: Client, mesh: _Actors, replies: list[Message]) -> float:
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
    runs: dict[tuple[int, int, bool], tuple[Client, _Actors, list[Message]]] = {}
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
