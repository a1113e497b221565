"""The controller's per-call work with no processes and no sockets: a real ``Client`` and
``StateTracker`` (wired as the controller wires them) on a transport that sends nothing, a mesh of
``hosts`` x ``per_host`` ranks, and the gathered reply tables its agents would send. Shared by the
tests of that work (``test_gather_batch``) and its benchmark (``benchmarks/bench_controller.py``)."""

from __future__ import annotations

import pickle
from typing import Any

from jupyter_mesh._core.refs import ProcMeshRef
from jupyter_mesh._core.shape import Shape
from jupyter_mesh._core.state import StateTracker
from jupyter_mesh._runtime.client import Client
from jupyter_mesh._wire.protocol import Kind
from jupyter_mesh._wire.transport import Message


class NoTransport:
    """What ``Client`` uses of a transport; ``sent``: the addresses it was asked to send to."""

    address = "ipc:///nowhere/controller"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def encode(self, msg: Message, to: Any, local: bool = False) -> list[Any]:
        return [msg.header]

    def send_raw(self, address: str, frames: Any) -> None:
        self.sent.append(address)

    def send(self, address: str, msg: Message, local: bool = False) -> None:
        self.sent.append(address)

    def forget(self, address: str, linger_ms: int = 0) -> None:
        return None


class Actors:
    """An ActorMeshRef over the proc mesh ``ref`` (or the part of it ``shape`` selects)."""

    def __init__(self, ref: ProcMeshRef, shape: Shape | None = None):
        self._ref, self._shape, self._view = ref, shape or ref.shape, None
        self._sliced = shape is not None  # a part of the mesh as spawned: casts carry its labels
        self._actor_id, self._class_name, self._name = "a-0", "Worker", "workers"
        self._plain: dict[str, bool] = {}  # no method called through as_endpoint()


def no_io_mesh(hosts: int, per_host: int) -> tuple[Client, StateTracker, Actors]:
    """A client and state tracker that know a running mesh ``m-0`` of ``hosts`` x ``per_host`` idle
    ranks, and an actor mesh over all of it."""
    n = hosts * per_host
    shape = Shape.from_sizes({"hosts": hosts, "gpus": per_host})
    agents = [f"ipc:///nowhere/agent-{h}" for h in range(hosts)]
    ref = ProcMeshRef(
        "m-0", "m", shape, [f"ipc:///nowhere/p{r}" for r in range(n)], [r // per_host for r in range(n)], agents
    )
    client = Client(NoTransport())  # type: ignore[arg-type]
    state = StateTracker()
    client.hooks.activity = state.activity
    state.created("m-0", "m", dict(shape.extent), [dict(shape.point(r)) for r in range(n)], agents, ref.rank_host)
    for r in range(n):
        state.ready("m-0", r, 1000 + r)
    return client, state, Actors(ref)


def gathered(call_id: int, entries: list[tuple[int, int, Any]]) -> Message:
    """An agent's gathered reply: (rank, ok, value) per rank; ``bytes`` values go as they are."""
    table, parts = [], []
    for rank, ok, value in entries:
        p = value if isinstance(value, bytes) else pickle.dumps(value, protocol=5)
        table.append([rank, ok, len(p), 0])
        parts.append(p)
    return Message({"k": Kind.GATHERED, "i": call_id, "n": table}, b"".join(parts), [])
