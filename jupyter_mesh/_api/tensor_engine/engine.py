"""The controller side of the tensor engine for one proc mesh: the ``TensorWorker`` actors (spawned on
first use), ref and loan ids, and the batched deletes of dropped tensors. Every message is an ordinary
call to those actors, on the channels (and with the authentication) of any actor call; none waits for
the workers except ``fetch`` and ``call_remote``, whose futures the caller holds."""

from __future__ import annotations

import collections
import itertools
import secrets
import threading
from typing import Any

from ..._core.future import Future
from ..._core.shape import Shape
from ...errors import MeshError, MeshValueError
from .worker import TensorWorker

__all__ = ["BASE", "MeshEngine", "engine_for", "next_id"]

# ref ids and borrow ids: one counter per controller, never reused. It starts at a random point: a
# worker's store is shared by every controller that drives its proc (an actor given the ProcMesh may
# activate it too), and two counters from 1 would make their tensors overwrite each other's shards
BASE = secrets.randbits(63) << 32
_ids = itertools.count(BASE + 1)
FLUSH_DELETES = 64  # dropped tensors freed on the workers in batches of about this many


def next_id() -> int:
    return next(_ids)


def _view_key(view: Shape) -> tuple[Any, ...]:
    return (tuple(view.labels), tuple(view.ranks()))


class MeshEngine:
    """The tensor engine of one proc mesh (any view of it shares it)."""

    def __init__(self, pm: Any):
        root = pm if pm._view is None else type(pm)(pm._controller, pm._ref, None, pm._host_mesh)
        self.mesh_id: str = pm._ref.mesh_id
        self.name: str = pm._ref.name
        self.proc_mesh = root
        self.workers = root.spawn("tensor_engine", TensorWorker)
        # the workers' ports for reductions, asked now: a call queues behind the ops before it, so asked
        # at the first reduce, the answer would wait for every op issued so far (the controller with it)
        self._inboxes: Future[Any] = self.workers.inbox.call()
        self._inbox_procs = tuple(root._ref.proc_addrs)  # a respawned proc has a new address, a new inbox
        # (view, ref id) of dropped tensors; appended from finalizers (any thread, even in the middle of
        # our own code): a deque's append needs no lock
        self._dead: collections.deque[tuple[Shape, int]] = collections.deque()

    def stopped(self) -> bool:
        return bool(self.proc_mesh.stopped)

    def workers_for(self, view: Shape) -> Any:
        return self.workers._with_shape(view)

    def send(self, view: Shape, ops: list[tuple[Any, ...]]) -> None:
        """Queue ``ops`` on the workers of ``view``, after the deletes due (in one message per mesh)."""
        if len(self._dead) >= FLUSH_DELETES:
            self.flush()
        self.workers_for(view).ops.broadcast(ops)

    def drop(self, view: Shape, ref_id: int) -> None:
        """A distributed tensor was collected: free its shards with a later message."""
        self._dead.append((view, ref_id))

    def flush(self) -> None:
        groups: dict[tuple[Any, ...], tuple[Shape, list[int]]] = {}
        while self._dead:
            try:
                view, ref_id = self._dead.popleft()
            except IndexError:
                break
            groups.setdefault(_view_key(view), (view, []))[1].append(ref_id)
        if self.stopped():
            return
        for view, ids in groups.values():
            try:
                self.workers_for(view).ops.broadcast([("del", ids)])
            except MeshError:  # dead procs hold nothing any more
                pass

    def inboxes(self) -> dict[int, Any]:
        """Global rank -> that worker's reduction inbox (asked when the workers were spawned, and again
        after a respawn)."""
        procs = tuple(self.proc_mesh._ref.proc_addrs)
        if procs != self._inbox_procs:
            self._inbox_procs, self._inboxes = procs, self.workers.inbox.call()
        vm = self._inboxes.get(timeout=120)
        return dict(zip(self.proc_mesh._shape.ranks(), vm.values(), strict=True))

    def lend(self, view: Shape, ref_id: int, takers: list[int] | None) -> int:
        """Ask the workers of ``takers`` (global ranks; None: all of ``view``) to set the shard aside for
        an actor call that carries the tensor."""
        bid = next_id()
        self.send(view, [("lend", ref_id, bid, takers)])
        return bid

    def unlend(self, view: Shape, borrow_id: int, takers: list[int] | None) -> None:
        """The call the shard was lent for was not sent: nobody will collect the loan."""
        self.send(view, [("unlend", borrow_id, takers)])

    def fetch(self, view: Shape, coords: dict[str, int], ref_ids: list[int]) -> Future[list[Any]]:
        self.flush()
        labels = list(view.labels)
        unknown = sorted(set(coords) - set(labels))
        if unknown:
            raise MeshValueError(
                f"fetch_shard: the tensor's mesh '{self.name}' has dims {labels}, not {unknown}; "
                f"name a coordinate for each of {labels} (missing ones are 0)"
            )
        point = {d: int(coords.get(d, 0)) for d in labels}
        for d, i in point.items():
            if not 0 <= i < view.extent[d]:
                raise MeshValueError(
                    f"fetch_shard: {d}={i} is outside the tensor's mesh '{self.name}' ({d} has size {view.extent[d]})"
                )
        one = self.workers_for(view).slice(**point)
        return one.fetch.call_one(ref_ids)  # type: ignore[no-any-return]


_engines: dict[str, MeshEngine] = {}
_lock = threading.Lock()


def engine_for(pm: Any) -> MeshEngine:
    """The engine of ``pm``'s proc mesh; its workers are spawned on the first use (a stopped mesh raises
    there, as any spawn on it)."""
    mesh_id = pm._ref.mesh_id
    with _lock:
        eng = _engines.get(mesh_id)
        if eng is not None and eng.stopped():
            del _engines[mesh_id]
            eng = None
        if eng is None:
            eng = _engines[mesh_id] = MeshEngine(pm)
        return eng
