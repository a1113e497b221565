"""The caller's record of its recent casts through a fan-out tree, and what it does when an agent in
the middle of one is lost (killed, or silent past the heartbeat timeout).

The ranks below a lost agent are alive, but the cast may never have reached them, and their gathered
replies went up through the lost agent. So, for each recent cast through it:

* a ``call``'s ranks below it that had not answered fail now (kind ``relay``: the proc lives on, its
  reply is lost), and the nearest live agent above it stops waiting for that subtree (``PRUNE``), so
  the rest of the tree still answers;
* every rank below it gets a ``SKIP`` for the cast's sequence number, straight to its proc: where the
  cast never arrived, that releases the number (no later call waits for it) and a ``stream`` or spawn
  rank answers that it was lost; where the cast did arrive, the proc ignores the skip.

Only casts sent from this process are known here: each process repairs its own. A proc hears of a lost
agent from the controller's notice that the agent's ranks failed (kind ``agent``: ``Client.notice_failed``).

An agent that cannot forward a cast to an agent below it (``UNFORWARDED``) gets the same repair for that
one cast, that subtree's own agent's ranks included (kind ``delivery``: the procs live on).
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.shape import Slice
from .._wire import protocol
from .._wire.protocol import BROKEN, DIRECT, GATHER, NO_REPLY, Kind
from .._wire.serialize import dumps
from .._wire.transport import Message, Transport
from ..errors import Failure
from .tree import subtree

if TYPE_CHECKING:
    from .._core.refs import ProcMeshRef
    from .calls import CallTable
    from .outcomes import Outcomes
    from .pending import Pending

__all__ = ["TreeCast", "TreeCasts"]

RECENT = 4096
"""Casts remembered: enough for what an agent stopped by SIGSTOP can hold up until its heartbeat
timeout at a high cast rate; older casts went through long ago."""


@dataclass
class TreeCast:
    ref: ProcMeshRef
    header: dict[str, Any]  # as signed (k, a, m, n, sl, q, rm, i, rt, dst, tp)
    hosts: list[int]  # the host index of each agent in ``dst``
    ranks: list[int]
    pending: weakref.ref[Pending] | None  # weak: a finished call's results must not live on here

    @property
    def p(self) -> Pending | None:
        return self.pending() if self.pending is not None else None


class TreeCasts:
    def __init__(self, transport: Transport, calls: CallTable, outcomes: Outcomes):
        self.transport, self.calls, self.outcomes = transport, calls, outcomes
        self.recent: collections.deque[TreeCast] = collections.deque(maxlen=RECENT)
        self._lock = threading.Lock()

    def record(self, cast: TreeCast) -> None:
        self.recent.append(cast)  # deque.append is atomic: no lock on the send path

    def agent_lost(self, addr: str, why: str, proc_addr: Any) -> None:
        """``addr`` is gone: repair every recent cast whose tree went through it (see the module)."""
        with self._lock:
            casts = [c for c in list(self.recent) if addr in c.header["dst"]]
        for c in casts:
            try:
                self._repair(c, addr, why, proc_addr)
            except Exception as e:  # noqa: BLE001 - one cast's repair must not stop the others'
                print(f"jupyter_mesh: could not repair a cast through the lost agent {addr}: {e!r}")

    def forget(self, cast: TreeCast) -> None:
        """A cast that no agent got (its send failed): nothing to repair, and its numbers are reused."""
        try:
            self.recent.remove(cast)
        except ValueError:
            pass

    def agent_of(self, mesh_id: str, rank: int) -> str | None:
        """The address of the agent of ``rank`` of proc mesh ``mesh_id``, if a recent cast went there."""
        for c in reversed(list(self.recent)):  # (a copy: the send path appends meanwhile)
            if c.ref.mesh_id == mesh_id and 0 <= rank < len(c.ref.rank_host):
                return c.ref.agent_addrs[c.ref.rank_host[rank]]
        return None

    def unforwarded(self, h: dict[str, Any], proc_addr: Any) -> None:
        """An agent could not forward a cast of ours to the agent ``h["up"]``: that agent's subtree, its
        own ranks included, never got it. They fail now (undelivered: their procs live on) and their
        sequence numbers are released, as for a lost agent, but the rest of the tree is untouched."""
        addr, key = h.get("up"), _cast_key(h)
        c = next((c for c in reversed(list(self.recent)) if _cast_key(c.header) == key), None)
        if c is None or not isinstance(addr, str) or addr not in c.header["dst"]:
            return  # not ours, or too old to matter
        detail = (
            f"the cast did not reach the rank: the host agent at {h.get('at', '?')} (above it in the call's "
            f"fan-out tree) could not forward it to the host agent at {addr} ({h.get('why', '?')}); the proc "
            "lives on, and later calls go through a tree that tries again"
        )
        self._repair(c, addr, "", proc_addr, own=True, kind="delivery", detail=detail)

    def _repair(
        self, c: TreeCast, addr: str, why: str, proc_addr: Any, own: bool = False, kind: str = "relay", detail: str = ""
    ) -> None:
        h, dst, tp = c.header, c.header["dst"], c.header["tp"]
        x = dst.index(addr)
        below = {c.hosts[j] for j in subtree(tp, x) if own or j != x}  # a lost x's own ranks fail with its host
        p = c.p
        if not below and (p is None or tp[x] < 0):
            return
        ranks = [r for r in c.ranks if c.ref.rank_host[r] in below]
        detail = detail or (
            f"the host agent at {addr}, which relayed this call to the rank's host (it is in the middle of "
            f"the call's fan-out tree), was lost ({why}): the call may not have reached the rank, and its "
            "reply is lost"
        )
        if p is not None and h["rm"] == GATHER:
            with self.calls.lock:
                live = p.call_id in self.calls.pending
                waiting = [r for r in ranks if r in p.outstanding]
            if live:
                if not own:  # (an agent that could not forward does not wait for that subtree)
                    self._prune(c, x)
                for r in waiting:
                    f = Failure(c.ref.name, c.ref.coords(r), kind, detail)
                    self.outcomes.add(p, p.call_id, r, BROKEN, dumps(f)[0], [])
        sl = Slice.from_wire(h["sl"])
        q = h["q"]
        for r in ranks:
            seq = q if isinstance(q, int) else q[sl.index_of(r)]
            skip = protocol.skip(h, seq, r)
            # rm: a gathered call's ranks failed above (the proc answers only a direct call itself)
            skip.update(rm=DIRECT if h["rm"] == DIRECT else NO_REPLY, i=h.get("i", 0), lost=detail)
            if h.get("rt"):
                skip["rt"] = h["rt"]
            try:
                self.transport.send(proc_addr(c.ref, r), Message(skip))
            except Exception:  # noqa: BLE001 - a proc that is gone needs no skip
                pass

    def _prune(self, c: TreeCast, x: int) -> None:
        """Tell the nearest live agent above ``x`` to stop waiting for the subtree that holds it."""
        dst, tp = c.header["dst"], c.header["tp"]
        child, a = x, tp[x]
        while a >= 0 and dst[a] in self.calls.lost_peers:
            child, a = a, tp[a]
        if a < 0:
            return
        try:
            self.transport.send(
                dst[a], Message({"k": Kind.PRUNE, "s": c.header["s"], "i": c.header["i"], "up": dst[child]})
            )
        except Exception:  # noqa: BLE001 - that one is going too: its own loss repairs the rest
            pass


def _cast_key(h: dict[str, Any]) -> tuple[Any, ...]:
    """What names one cast of ours: its mesh, actor, call id and sequence numbers (as on the wire)."""
    q = h.get("q")
    return (h.get("m"), h.get("a"), h.get("i", 0), tuple(q) if isinstance(q, (list, tuple)) else q)
