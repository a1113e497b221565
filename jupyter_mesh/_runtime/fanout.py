"""Sending a cast (``call``, ``stream``, ``broadcast``, ``reduce``, spawn) through the host agents.

One signed message per host: the host's agent relays it to its procs. Past the fan-out (``tree``) the
caller sends to the top agents only and they relay down the tree, so the caller's record of the cast
(``tree_casts``) is kept before the send, for repairs if an agent in the middle is lost. Sequence
numbers are taken under the call table's lock with the call's registration, and given back for the
hosts the message never reached, so no rank waits on a gap.
"""

from __future__ import annotations

import pickle
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from .._wire.frame_send import owned
from .._wire.protocol import BROKEN
from .._wire.transport import Message, Transport
from ..errors import CallSite, DeliveryError, Failure, MeshError
from . import interrupts, tree
from .tree_casts import TreeCast

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef, ProcMeshRef
    from .calls import CallTable, ClientHooks
    from .outcomes import Outcomes
    from .pending import Pending
    from .tree_casts import TreeCasts

__all__ = ["Caster", "send_cast"]


class Caster(Protocol):
    """What a cast needs of the client that sends it (``client.Client``)."""

    transport: Transport
    calls: CallTable
    hooks: ClientHooks
    trees: TreeCasts
    outcomes: Outcomes
    cast_sends: int

    def _blocked(
        self, ref: ProcMeshRef, ranks: list[int], context: str, call: CallSite | None = None
    ) -> MeshError | None: ...
    def _register(self, p: Pending) -> int: ...
    def _seqs(self, mesh: ActorMeshRef, ranks: list[int]) -> int | list[int]: ...
    def _unseq(self, mesh: ActorMeshRef, ranks: list[int]) -> None: ...


def send_cast(
    c: Caster,
    mesh: ActorMeshRef,
    ranks: list[int],
    header: dict[str, Any],
    payload: bytes,
    bufs: list[Any],
    p: Pending | None,
) -> None:
    """Number, register, sign once and send ``header`` to the agents of ``ranks``' hosts; ``p``: the
    call waiting for replies (None for a broadcast). Undelivered ranks fail as ``delivery``."""
    ref = mesh._ref
    if c.hooks.sent is not None:  # before the send: the ranks' first output may beat the return
        c.hooks.sent(mesh, ranks)
    hosts = sorted(set(map(ref.rank_host.__getitem__, ranks)))
    agents = [ref.agent_addrs[h] for h in hosts]
    tp = tree.parents(len(hosts), tree.fanout()) if len(hosts) > 2 else None
    if tp is not None:  # past the fan-out: we send to the top agents, they relay (signed, like the rest)
        header["tp"] = tp
        tops = [i for i, parent in enumerate(tp) if parent < 0]
    else:
        tops = list(range(len(hosts)))
    sent = 0  # top agents the cast went to
    undelivered: list[tuple[int, Failure]] = []
    interrupted: BaseException | None = None
    # busy before the send: a fast reply (the ranks' -1) must not come before the +1
    counted = p is not None and c.hooks.activity is not None
    if counted:
        c.hooks.activity(ref.mesh_id, ranks, 1)  # type: ignore[misc]
    held = interrupts.hold()  # Ctrl-C waits until the call is sent and counted, or known unsent
    try:
        with c.calls.lock:
            # checked again under the lock: a rank may have failed while the arguments were pickled
            call = _site(mesh, header["ep"]) if "ep" in header else None
            err = c._blocked(ref, ranks, f"calling {mesh._class_name}.{header.get('ep', '__init__')}", call)
            if err is not None:
                if p is None:
                    raise err
                assert p.future is not None
                p.future._set_exception(err)
                return
            header["i"] = c._register(p) if p is not None else 0
            header["q"] = c._seqs(mesh, ranks)
            rec = None
            if tp is not None:  # recorded before the send: an agent's UNFORWARDED may come at once
                rec = TreeCast(ref, header, hosts, ranks, weakref.ref(p) if p is not None else None)
                c.trees.record(rec)
            try:
                # signed once for the agents it goes through (each relays it to its procs as is), its
                # buffers copied once for all of them
                frames = c.transport.encode(Message(header, payload, bufs), agents)
                frames = owned(frames) if len(tops) > 1 else frames
                for i in tops:
                    c.transport.send_raw(agents[i], frames)
                    sent += 1
            except BaseException as e:
                if not sent:  # nobody got it: as if it never happened
                    c._unseq(mesh, ranks)
                    if rec is not None:
                        c.trees.forget(rec)
                    if p is not None:
                        c.calls.pending.pop(header["i"], None)
                    if isinstance(e, Exception):
                        raise DeliveryError(
                            [
                                Failure(ref.name, ref.coords(r), "delivery", f"not sent to any host: {e!r}")
                                for r in ranks
                            ],
                            f"calling {mesh._class_name}.{header.get('ep', '__init__')}",
                        ) from e
                    raise
                # some hosts have it: the others' ranks get their numbers back and fail as undelivered
                unsent_hosts = {hosts[j] for i in tops[sent:] for j in (tree.subtree(tp, i) if tp else [i])}
                unsent = [r for r in ranks if ref.rank_host[r] in unsent_hosts]
                c._unseq(mesh, unsent)
                if rec is not None:  # their numbers go to later calls: no repair may skip them
                    rec.ranks = [r for r in ranks if ref.rank_host[r] not in unsent_hosts]
                undelivered = [
                    (r, Failure(ref.name, ref.coords(r), "delivery", f"not sent to its host agent: {e!r}"))
                    for r in unsent
                ]
                if not isinstance(e, Exception):  # an interrupt: raised once the books are right
                    interrupted = e
    finally:
        c.cast_sends += sent
        if held:
            interrupts.release()
        if counted and not sent:  # not sent (blocked, or no host got it): not busy after all
            c.hooks.activity(ref.mesh_id, ranks, -1)  # type: ignore[misc]
    if undelivered and p is not None:
        for r, f in undelivered:
            c.outcomes.add(p, p.call_id, r, BROKEN, pickle.dumps(f), [])
    if interrupted is not None:
        raise interrupted


def _site(mesh: ActorMeshRef, endpoint: str) -> CallSite:
    return CallSite(mesh._name, mesh._class_name, endpoint)
