"""The calling side of the runtime, shared by the controller and by actors that call other actors.

It turns endpoint calls into signed messages and replies into futures:

* ``call`` / ``stream`` / ``broadcast`` / ``reduce`` on a mesh of N procs over H hosts cost one send per
  host: the host's agent relays the (already signed) message to its procs and, for ``call``, gathers
  their replies into one message back. Past the fan-out (``tree``), the caller sends to that many
  agents only, and they relay to the others (``cast_sends`` counts what the caller sent).
* ``call_one`` / ``choose`` go straight to the actor's own inbox on its proc, which is what decides
  latency; replies come back to the calling thread's reply box (``replies``), read by that thread
  itself while it waits in ``get()``.
* Every message from this process to an actor carries a per-rank sequence number, so a proc can
  restore send order across the two paths: messages from one sender to one actor run FIFO.
"""

from __future__ import annotations

import itertools
import pickle
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from .._core.context import context
from .._core.future import Future
from .._core.refs import ref_to_wire
from .._wire.protocol import DIRECT, GATHER, NO_REPLY, Kind
from .._wire.serialize import UNPICKLABLE_HINT, describe_unpicklable, dumps, is_plain, pickling_for
from .._wire.transport import Message, Transport
from ..errors import (
    CallSite,
    DeliveryError,
    Failure,
    MeshCancelledError,
    MeshError,
    MeshValueError,
    SerializationError,
    SupervisionError,
)
from . import actor_errors, cancels, fanout, interrupts, reduce_ops
from .calls import CallTable, ClientHooks
from .inboxes import ActorInboxes
from .outcomes import Outcomes
from .pending import Pending, Stream
from .ports import Ports
from .replies import ReplyBox, ReplyBoxes
from .supervision import Supervision
from .tree_casts import TreeCasts

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef, ProcMeshRef

__all__ = ["Client", "current_client", "set_current_client", "stopped_error"]


def current_client() -> Client:
    """This process's client: in a proc the one its runtime installed, else the controller's."""
    return cast(Client, context().client())


def set_current_client(client: Client | None) -> None:
    context().set_client(client)


class Client:
    """Sends calls, matches replies to pending futures, fails them when ranks break."""

    def __init__(self, transport: Transport, reply_boxes: bool = False):
        self.transport = transport
        self.address = transport.address
        self._ids = itertools.count(1)
        self.calls = CallTable()  # calls in flight and what we know of ranks, under one lock
        self.hooks = ClientHooks()  # the controller's, set once by it
        self.inboxes = ActorInboxes(transport)  # actors' own inboxes, learnt from spawn replies
        self.outcomes = Outcomes(self.calls, self.inboxes, self.hooks)
        self.supervision = Supervision(self.calls, self.outcomes, self.hooks)
        self._deferred: list[tuple[Pending, str]] = []  # cancels asked for by finalizers
        self.cancel_acks = cancels.CancelAcks()  # interrupted calls' ranks that have not stopped yet
        # what the runtime around the client calls: replies in, rank events in
        self.on_reply = self.outcomes.on_reply
        self.on_progress = self.outcomes.on_progress
        self.mark_failed = self.supervision.mark_failed
        self.mark_removed = self.supervision.mark_removed
        self.mark_stopped = self.supervision.mark_stopped
        self.rank_moved = self.supervision.rank_moved
        self.reset_ranks = self.supervision.reset_ranks
        self.waits_on = self.supervision.waits_on
        self.doomed = self.supervision.doomed
        self.waits_on_actor = self.supervision.waits_on_actor
        self.constructing = self.supervision.constructing
        self.trees = TreeCasts(transport, self.calls, self.outcomes)  # casts through agents' trees
        self.cast_sends = 0  # messages this client sent for casts (to agents): tests and benchmarks read it
        self.fail_all = self.supervision.fail_all
        self.forget_request = self.calls.finish
        self.ports = Ports(transport)  # channels opened here, and values sent to ports anywhere
        self.open_port = self.ports.open
        self.send_to_port = self.ports.send
        # a waiting caller reads its own replies (``replies``); the controller's client only: in a
        # proc, a cancel interrupts an actor's thread anywhere, even in the middle of reading one
        self.boxes = ReplyBoxes(transport, self.on_reply, self._busy_boxes) if reply_boxes else None

    # -- helpers ---------------------------------------------------------------------------------------
    def _encode_args(
        self, mesh: ActorMeshRef, endpoint: str, args: Any, kwargs: Any, ranks: list[int]
    ) -> tuple[bytes, list[Any]]:
        with pickling_for(mesh._ref.mesh_id, ranks):  # where a distributed tensor's shards must wait
            try:
                return dumps((args, kwargs))
            except SerializationError:
                which = describe_unpicklable(args, kwargs) or "an argument does not pickle"
                # raised inside the block: what the pickling set aside for the call is undone
                raise SerializationError(
                    f"{mesh._class_name}.{endpoint} was not called: {which}. {UNPICKLABLE_HINT}"
                ) from None

    def _check_targets(self, ref: ProcMeshRef, ranks: list[int], context: str, call: CallSite | None = None) -> None:
        if self.hooks.before_call is not None:
            self.hooks.before_call()
        self._drain_deferred()
        err = self._blocked(ref, ranks, context, call)
        if err is not None:
            raise err

    def _blocked(
        self, ref: ProcMeshRef, ranks: list[int], context: str, call: CallSite | None = None
    ) -> MeshError | None:
        """Why a call to ``ranks`` cannot run now (stopped, shrunk away, failed), or None."""
        if (
            not self.calls.failed
            and ref.mesh_id not in self.calls.stopped
            and (ranks[0] if len(ranks) == 1 else max(ranks, default=0)) < len(ref.proc_addrs)
        ):
            return None  # the common case, cheaply
        if ref.mesh_id in self.calls.stopped:
            return stopped_error(ref, ranks, context, call)
        gone = [r for r in ranks if r >= len(ref.proc_addrs)]
        if gone:
            return MeshValueError(
                f"{context}: ranks {gone[:8]} of '{ref.name}' were removed when the mesh shrank; "
                "use a slice of the current mesh"
            )
        failed = [self.calls.failed[(ref.mesh_id, r)] for r in ranks if (ref.mesh_id, r) in self.calls.failed]
        if failed:
            return SupervisionError(failed, context, call)
        return None

    def _unseq(self, mesh: ActorMeshRef, ranks: list[int]) -> None:
        """Give back the sequence numbers of a message that was never sent (no gap may stay)."""
        arr = self.calls.seq.get(mesh._actor_id)
        if arr is not None:
            for r in ranks:
                arr[r] -= 1

    def peer_lost(self, address: str, why: str) -> None:
        """An agent is gone for good: requests to it fail, and casts relayed through it are repaired."""
        self.supervision.peer_lost(address, why)
        self.trees.agent_lost(address, why, self._proc_addr)

    def notice_failed(self, mesh_id: str, rank: int, failure: Any) -> None:
        """In a proc: the controller says a rank failed. If its host agent was lost, that agent may sit
        in the middle of casts this proc sent through a tree: repair them as the controller does its
        own (the ranks below fail, their sequence numbers are released). The controller's notices are
        how a proc hears of a lost agent: it runs no heartbeats of its own."""
        if getattr(failure, "kind", None) != "agent":
            return
        addr = self.trees.agent_of(mesh_id, rank)
        if addr is None or addr in self.calls.lost_peers:
            return
        self.peer_lost(addr, getattr(failure, "detail", "") or "its host agent is lost")

    def unforwarded(self, msg: Message) -> None:
        """An agent could not forward a cast of ours down the tree (``UNFORWARDED``): fail that subtree."""
        self.trees.unforwarded(msg.header, self._proc_addr)

    def defer_cancel(self, p: Pending, actor_id: str) -> None:
        """For finalizers, which must not take locks: the cancel runs at the next call from here."""
        self._deferred.append((p, actor_id))

    def _drain_deferred(self) -> None:
        while self._deferred:
            try:
                p, actor_id = self._deferred.pop()
            except IndexError:
                return
            self._cancel(p, actor_id)

    def _seqs(self, mesh: ActorMeshRef, ranks: list[int]) -> int | list[int]:
        arr = self.calls.seq.get(mesh._actor_id)
        if arr is not None and len(ranks) == 1 and ranks[0] < len(arr):  # call_one, choose
            seq = arr[ranks[0]]
            arr[ranks[0]] = seq + 1
            return seq
        if arr is None:
            arr = self.calls.seq[mesh._actor_id] = [0] * len(mesh._ref.proc_addrs)
            self.calls.actor_mesh[mesh._actor_id] = mesh._ref.mesh_id
        elif len(arr) < len(mesh._ref.proc_addrs):  # the mesh grew
            arr.extend([0] * (len(mesh._ref.proc_addrs) - len(arr)))
        n, first = len(arr), arr[ranks[0]]
        if len(ranks) == n and arr.count(first) == n:  # every rank, all alike: the usual broadcast
            arr[:] = [first + 1] * n
            return first
        vals = list(map(arr.__getitem__, ranks))
        for r in ranks:
            arr[r] += 1
        return first if vals.count(first) == len(vals) else vals

    def _register(self, p: Pending) -> int:
        call_id = next(self._ids)
        self.calls.pending[call_id] = p
        p.call_id = call_id
        return call_id

    def _cancel(self, p: Pending, actor_id: str) -> None:
        """Forget the call and tell every proc still working on it to stop (O(ranks); cancels are rare)."""
        with self.calls.lock:
            if self.calls.pending.pop(p.call_id, None) is None:
                return
            ranks = sorted(p.outstanding)
            busy = [r for r in ranks if r not in p.progressed]  # the others are idle already
            p.outstanding.clear()
        if self.hooks.activity is not None and busy:
            self.hooks.activity(p.mesh_id, busy, -1)
        if p.stream_q is not None:  # the future itself was already cancelled by Future.cancel
            p.fail(MeshCancelledError(f"{p.actor}.{p.endpoint} was cancelled"), len(ranks))
        assert p.ref is not None
        for r in ranks:
            if (p.mesh_id, r) in self.calls.failed:
                continue
            try:
                self.transport.send(
                    self._proc_addr(p.ref, r),
                    Message({"k": Kind.CANCEL, "a": actor_id, "ci": p.call_id, "s": self.address}),
                )
            except Exception:  # noqa: BLE001 - the proc may be gone; nothing left to cancel there
                pass

    def _interrupt(self, p: Pending, cancel: Callable[[], object] | None = None, pressed: bool = True) -> BaseException:
        """Ctrl-C in ``get()`` (or in a stream; ``pressed=False``: a caller gave up at its timeout): cancel,
        wait a moment for the ranks to stop, say how it went."""
        if cancel is None:
            assert p.future is not None
            cancel = p.future.cancel
        ref, kill = p.ref, self.hooks.kill_ranks
        return cancels.report(
            p,
            cancel,
            self.cancel_acks,
            lambda r: (p.mesh_id, r) in self.calls.failed,
            (lambda ranks: kill(ref, ranks)) if kill is not None and ref is not None else None,
            pressed,
        )

    def sync_output(self, ref: ProcMeshRef, ranks: list[int], token: str) -> int:
        """Ask ``ranks`` to print an ``OUT_SYNC`` marker after their output so far; returns how many
        were asked (failed and unreachable ranks are skipped: nothing more comes from them)."""
        asked = 0
        for r in ranks:
            if (ref.mesh_id, r) in self.calls.failed or ref.mesh_id in self.calls.stopped:
                continue
            try:
                self.transport.send(self._proc_addr(ref, r), Message({"k": Kind.OUT_SYNC, "t": token}))
                asked += 1
            except Exception:  # noqa: BLE001 - the proc is gone: it prints nothing more
                pass
        return asked

    # -- calls -----------------------------------------------------------------------------------------
    def spawn_actors(self, mesh: ActorMeshRef, cls: type, args: Any, kwargs: Any) -> Future[None]:
        ranks = mesh._shape.ranks()
        self._check_targets(mesh._ref, ranks, f"spawning {mesh._name}")
        with pickling_for(mesh._ref.mesh_id, ranks):  # where a distributed tensor's shards must wait
            try:
                payload, bufs = dumps((cls, args, kwargs))
            except SerializationError as e:
                # the arguments pickle, or the class itself does not
                which = describe_unpicklable(args, kwargs) or f"the class does not pickle ({e.__cause__})"
                raise SerializationError(f"{cls.__qualname__} was not spawned: {which}. {UNPICKLABLE_HINT}") from None
        if self.hooks.spawned is not None:
            self.hooks.spawned(mesh, cls)
        fut: Future[None] = Future(f"spawn of {mesh._name}")
        p = Pending(
            fut, mesh._ref.mesh_id, "spawn", mesh._name, "__init__", mesh._shape, ranks, set(ranks), ref=mesh._ref
        )
        p.actor_id = mesh._actor_id
        if self.boxes is not None:  # the controller: Ctrl-C in initialized.get() says what still runs
            fut._on_interrupt = lambda _pressed: cancels.spawn_interrupted(p, self.calls.lock)
        header = {
            "k": Kind.SPAWN,
            "m": mesh._ref.mesh_id,
            "a": mesh._actor_id,
            "n": mesh._name,
            "sl": mesh._shape.slice.to_wire(),
            "s": self.address,
            "rm": DIRECT,  # one reply per rank, not per host: each constructor is known done when it is
            "fa": int(actor_errors.fatal()),
            "pmesh": ref_to_wire(mesh._ref),  # the actor's context().actor_instance.proc_mesh
        }
        if mesh._view is not None:  # spawned on a view of the procs: the actors number themselves in it
            header["vl"] = mesh._view.labels
        fanout.send_cast(self, mesh, ranks, header, payload, bufs, p)
        if self.hooks.on_spawn is not None:
            self.hooks.on_spawn(mesh, payload, bufs)
        return fut

    def respawn_actor(self, mesh: ActorMeshRef, rank: int, payload: bytes, bufs: list[Any]) -> Future[None]:
        """Re-create one actor on a freshly respawned proc with its original spawn payload."""
        fut: Future[None] = Future(f"respawn of {mesh._name}")
        p = Pending(fut, mesh._ref.mesh_id, "spawn", mesh._name, "__init__", None, [rank], {rank}, ref=mesh._ref)
        p.actor_id = mesh._actor_id
        with self.calls.lock:
            call_id = self._register(p)
            header = {
                "k": Kind.SPAWN,
                "m": mesh._ref.mesh_id,
                "a": mesh._actor_id,
                "n": mesh._name,
                "rk": rank,
                "s": self.address,
                "rm": DIRECT,
                "i": call_id,
                "q": self._seqs(mesh, [rank]),
                "fa": int(actor_errors.fatal()),
                "pmesh": ref_to_wire(mesh._ref),
            }
            if mesh._view is not None:
                header["vl"], header["vs"] = mesh._view.labels, mesh._view.slice.to_wire()
            try:
                self.transport.send(self._proc_addr(mesh._ref, rank), Message(header, payload, bufs))
            except BaseException:
                self._unseq(mesh, [rank])
                self.calls.pending.pop(call_id, None)
                raise
        return fut

    def _proc_addr(self, ref: ProcMeshRef, rank: int) -> str:
        return self.calls.moved.get((ref.mesh_id, rank)) or ref.proc_addrs[rank]

    def _actor_addr(self, ref: ProcMeshRef, rank: int, actor_id: str) -> str:
        return self.inboxes.address(self._proc_addr(ref, rank), actor_id)

    def forget_proc(self, address: str) -> None:
        """A proc is gone: close our sockets to it and to its actors' inboxes."""
        self.inboxes.forget_proc(address)

    def cast(self, mesh: ActorMeshRef, endpoint: str, args: Any, kwargs: Any, mode: str, op: Any = None) -> Any:
        """``mode``: call, stream, broadcast, or reduce (with ``op``: folded in the agents, one value)."""
        rd = reduce_ops.encode(op) if mode == "reduce" else None
        ranks = mesh._shape.ranks()
        self._check_targets(mesh._ref, ranks, f"calling {mesh._class_name}.{endpoint}", _site(mesh, endpoint))
        payload, bufs = self._encode_args(mesh, endpoint, args, kwargs, ranks)
        header: dict[str, Any] = {
            "k": Kind.CALL,
            "m": mesh._ref.mesh_id,
            "a": mesh._actor_id,
            "ep": endpoint,
            "sl": mesh._shape.slice.to_wire(),
            "s": self.address,
        }
        if endpoint in mesh._plain:  # as_endpoint(mesh.method): run that method although not an @endpoint
            header["plain"] = 2 if mesh._plain[endpoint] else 1
        if mesh._sliced:  # numbered in this view during the call (Monarch's current_rank)
            header["vl"] = mesh._shape.labels
        if mode == "broadcast":
            header["rm"] = NO_REPLY
            fanout.send_cast(self, mesh, ranks, header, payload, bufs, None)
            return None
        fut: Future[Any] = Future(f"{mesh._class_name}.{endpoint}")
        how = "call" if mode == "reduce" else mode
        p = Pending(fut, mesh._ref.mesh_id, how, mesh._name, endpoint, mesh._shape, ranks, set(ranks), ref=mesh._ref)
        p.cls = mesh._class_name
        p.actor_id = mesh._actor_id
        fut._on_cancel = lambda: self._cancel(p, mesh._actor_id)
        if self.boxes is not None:  # the controller: Ctrl-C reports where the call stopped (not in procs)
            fut._on_interrupt = lambda pressed: self._interrupt(p, pressed=pressed)
        if mode == "stream":
            p.stream_q = queue.SimpleQueue()
            header["rm"] = DIRECT
            fanout.send_cast(self, mesh, ranks, header, payload, bufs, p)
            return self._iter_stream(p, mesh._actor_id)
        header["rm"] = GATHER
        header["hk"] = context().host_key  # a proc on this host sends a large result through shared memory
        if rd is not None:
            header["rd"] = rd
            p.reduce = reduce_ops.op_name(op)
            p.reduce_fn = op if callable(op) else reduce_ops.NAMED[op]
        box = self.boxes.for_call() if self.boxes is not None else None
        if box is not None:
            self._reply_in_box(header, p, box)
        fanout.send_cast(self, mesh, ranks, header, payload, bufs, p)
        if self.boxes is not None and box is not None:
            self.boxes.sent()
        return fut

    def call_rank(
        self, mesh: ActorMeshRef, rank: int, endpoint: str, args: Any, kwargs: Any, of_view: bool = False
    ) -> Future[Any]:
        """``call_one`` of ``rank``, or (``of_view``) one rank of a larger view (``choose``, ``.rref``).
        The latency path (W2): keep it lean."""
        ref, calls = mesh._ref, self.calls
        what = f"{mesh._class_name}.{endpoint}"
        context = "calling " + what
        if self.hooks.before_call is not None:
            self.hooks.before_call()
        if self._deferred:
            self._drain_deferred()
        if calls.failed or ref.mesh_id in calls.stopped or rank >= len(ref.proc_addrs):  # else nothing can block it
            err = self._blocked(ref, [rank], context, _site(mesh, endpoint))
            if err is not None:
                raise err
        obj = (args, kwargs)
        payload: bytes
        bufs: list[Any]
        if is_plain(obj):  # no tensor that must know its destination (``pickling_for``): ~3 us less
            payload, bufs = pickle.dumps(obj, protocol=5), []
        else:
            payload, bufs = self._encode_args(mesh, endpoint, args, kwargs, [rank])
        fut: Future[Any] = Future(what)
        p = Pending(fut, ref.mesh_id, "one", mesh._name, endpoint, None, [rank], {rank}, ref=ref)
        p.actor_id, p.cls = mesh._actor_id, mesh._class_name
        fut._on_cancel = lambda: self._cancel(p, mesh._actor_id)
        if self.boxes is not None:
            fut._on_interrupt = lambda pressed: self._interrupt(p, pressed=pressed)
        local = _same_host(ref, rank)
        # all bookkeeping before the send: after it this thread should only wait, leaving the CPU
        # to the message's way there and back (on 2 cores that is measurable)
        if self.hooks.activity is not None:
            self.hooks.activity(ref.mesh_id, [rank], 1)
        if self.hooks.sent is not None:
            self.hooks.sent(mesh, [rank])
        box = self.boxes.for_call() if self.boxes is not None else None
        held = interrupts.hold()  # Ctrl-C waits until the call is sent and counted, or known unsent
        try:
            with calls.lock:
                # checked again under the lock: the rank may have failed while the arguments were pickled
                err = None
                if calls.failed or ref.mesh_id in calls.stopped or rank >= len(ref.proc_addrs):
                    err = self._blocked(ref, [rank], context, _site(mesh, endpoint))
                if err is None:
                    call_id = self._register(p)
                    header = {
                        "k": Kind.CALL,
                        "a": mesh._actor_id,
                        "ep": endpoint,
                        "rk": rank,
                        "s": self.address,
                        "rm": DIRECT,
                        "i": call_id,
                        "q": self._seqs(mesh, [rank]),
                    }
                    if endpoint in mesh._plain:  # as_endpoint(mesh.method)
                        header["plain"] = 2 if mesh._plain[endpoint] else 1
                    if box is not None:
                        self._reply_in_box(header, p, box)
                    if local:
                        header["l"] = 1  # data plane: the reply may come back through shared memory too
                    if mesh._sliced:  # numbered in this view during the call: call_one's one point,
                        header["vl"] = mesh._shape.labels  # or where the rank is in it
                        if of_view:
                            header["vs"] = mesh._shape.slice.to_wire()
                    try:
                        address = self._actor_addr(ref, rank, mesh._actor_id)
                        self.transport.send(address, Message(header, payload, bufs), local=local)
                    except BaseException as e:  # never sent (full /dev/shm, closed): no gap, nothing pending
                        self._unseq(mesh, [rank])
                        self.calls.pending.pop(call_id, None)
                        err = DeliveryError(
                            [Failure(ref.name, ref.coords(rank), "delivery", f"not sent: {e!r}")], context
                        )
                        if not isinstance(e, Exception):
                            self._after_unsent(ref, rank, fut, err)
                            raise
        finally:
            if held:
                interrupts.release()
        if box is not None and self.boxes is not None and err is None:
            self.boxes.sent()
        if err is not None:
            self._after_unsent(ref, rank, fut, err)
        return fut

    @staticmethod
    def _reply_in_box(header: dict[str, Any], p: Pending, box: ReplyBox) -> None:
        """Have the reply sent to this thread's box, so a ``get()`` here reads it without a hand-over."""
        header["rt"] = box.address
        p.box = box
        assert p.future is not None
        p.future._driver = box

    def _busy_boxes(self) -> set[ReplyBox]:
        with self.calls.lock:
            return {p.box for p in self.calls.pending.values() if p.box is not None}

    def _after_unsent(self, ref: ProcMeshRef, rank: int, fut: Future[Any], err: BaseException) -> None:
        if self.hooks.activity is not None:
            self.hooks.activity(ref.mesh_id, [rank], -1)
        fut._set_exception(err)

    def check_rank(self, mesh_id: str, mesh_name: str, rank: int, context: str) -> None:
        """Raise the error a call to ``rank`` of that proc mesh would raise now (stopped, failed)."""
        if mesh_id in self.calls.stopped:
            raise SupervisionError([Failure(mesh_name, {}, "stopped", STOPPED)], context)
        failure = self.calls.failed.get((mesh_id, rank))
        if failure is not None:
            raise SupervisionError([failure], context)

    def choose(self, mesh: ActorMeshRef, endpoint: str, args: Any, kwargs: Any) -> Future[Any]:
        alive = [r for r in mesh._shape.ranks() if (mesh._ref.mesh_id, r) not in self.calls.failed]
        if not alive:
            self._check_targets(mesh._ref, mesh._shape.ranks(), f"choosing an actor of {mesh._name}")
        start = next(self._ids)  # rotate ties so equal loads spread out
        n = len(alive)
        order = alive[start % n :] + alive[: start % n]
        actor_id, load = mesh._actor_id, self.calls.pending.load  # call_one/choose calls in flight, per rank
        with self.calls.lock:
            rank = min(order, key=lambda r: load.get((actor_id, r), 0))
        return self.call_rank(mesh, rank, endpoint, args, kwargs, of_view=True)

    def _iter_stream(self, p: Pending, actor_id: str) -> Iterator[Future[Any]]:
        return Stream(p, actor_id, self._cancel, self.defer_cancel, self._interrupt if self.boxes is not None else None)

    def request(self, address: str, header: dict[str, Any], obj: Any = None, what: str = "request") -> Future[Any]:
        """A control request (to an agent): the reply's payload is the future's value."""
        fut: Future[Any] = Future(what)
        lost = self.calls.lost_peers.get(address)
        if lost is not None:  # known dead: fail now, naming it, rather than wait out a timeout
            fut._set_exception(SupervisionError([Failure("", {}, "agent", lost)], f"during {what}"))
            return fut
        payload, bufs = dumps(obj)
        with self.calls.lock:
            header["i"] = self._register(Pending(fut, "", "request", peer=address))
            header["s"] = self.address
            self.transport.send(address, Message(header, payload, bufs))
        return fut

    # -- supervision -----------------------------------------------------------------------------------


STOPPED = "its proc mesh was stopped"


def _site(mesh: ActorMeshRef, endpoint: str) -> CallSite:
    return CallSite(mesh._name, mesh._class_name, endpoint)


def stopped_error(ref: ProcMeshRef, ranks: list[int], context: str, call: CallSite | None = None) -> SupervisionError:
    """What a call to a stopped proc mesh raises, as in Monarch: a SupervisionError (kind ``stopped``)."""
    shown = ranks[:16]
    fails = [Failure(ref.name, ref.coords(r) if r < len(ref.proc_addrs) else {}, "stopped", STOPPED) for r in shown]
    if len(ranks) > len(shown):  # the message lists 16 anyway; the count says the rest
        fails += [Failure(ref.name, {}, "stopped", STOPPED)] * (len(ranks) - len(shown))
    return SupervisionError(fails or [Failure(ref.name, {}, "stopped", STOPPED)], context, call)


def _same_host(ref: ProcMeshRef, rank: int) -> bool:
    """Is ``rank`` on this host? Then large buffers travel through shared memory (``_shm``)."""
    if not ref.host_keys:
        return False
    return ref.host_keys[ref.rank_host[rank]] == context().host_key
