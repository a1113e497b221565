"""How replies become values or errors: the client's reply half (``client.Client`` owns one).

A reply (``r``: one rank) or a host's gathered replies (``g``) is matched to its pending call; each
rank's outcome (value, remote exception, broken rank) is recorded; the call's future completes when
no rank is left, or at once when a rank's proc died. This runs on the receive thread, or on a
caller's thread that reads its own reply box (``replies``): both at once for the same call, so every
outcome is recorded under the client's lock before completion is decided.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pickle import loads as _unpickle  # plain values: no out-of-band buffers
from typing import TYPE_CHECKING, Any

from .._core.future import Future
from .._core.value_mesh import ValueMesh
from .._wire.protocol import BROKEN, OK, RAISED, REDUCED, Kind, progress_calls
from .._wire.serialize import loads
from .._wire.transport import Message
from ..errors import (
    ActorError,
    CallSite,
    DeliveryError,
    Failure,
    MeshError,
    ReduceError,
    RemoteFailure,
    SerializationError,
    SupervisionError,
)
from . import reduce_ops
from .fn_folds import HINT, FnFolds
from .pending import Pending, remote_failure

if TYPE_CHECKING:
    from .calls import CallTable, ClientHooks
    from .inboxes import ActorInboxes

__all__ = ["Outcomes"]

_PROC_DEATH = frozenset({"exit", "signal", "heartbeat", "agent"})
_DOOMED_MAX = 1 << 16
DOOMED_S = 2 * float(os.environ.get("JUPYTER_MESH_HEARTBEAT_TIMEOUT", "3.0")) + 4
"""How long after a death failed a call the death of a rank still running it counts as part of what the
caller was told: the ranks of one incident (a lost host, a killed fork server, a scancel) die one at a
time, at most about a heartbeat timeout apart. A later death is news (the fault hook hears it). A doomed rank's late answer seldom reaches us (its
agent's gather went up already), so time is what tells the incident apart."""


class _Returned:
    """A result that is itself a Failure or RemoteFailure (a supervisor returning what it saw): a value
    of the call, which must not be taken for that rank's failure."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _value(outcome: Any) -> Any:
    return outcome.value if type(outcome) is _Returned else outcome


class Outcomes:
    """Records each rank's reply to a call in the call table and completes the call's future."""

    def __init__(self, calls: CallTable, inboxes: ActorInboxes, hooks: ClientHooks):
        self.calls, self.inboxes, self.hooks = calls, inboxes, hooks

    def on_reply(self, msg: Message) -> None:
        """For ``r`` (one rank) and ``g`` (gathered per host) replies: on the receive thread, or on a
        caller's thread reading its reply box."""
        h = msg.header
        with self.calls.lock:
            p = self.calls.pending.get(h["i"])
        if p is None:
            return  # cancelled, timed out or already failed
        if h["k"] == Kind.REPLY:
            if p.mode == "one" and h["ok"] == OK and self._one_returned(p, h, msg):
                return
            self.add(p, h["i"], h.get("rk", 0), h["ok"], msg.payload, msg.buffers)
            return
        if p.mode == "request" or p.stream_q is not None:
            pos, bpos = 0, 0
            payload = memoryview(msg.payload)
            for rank, ok, plen, nbuf in h["n"]:
                self.add(p, h["i"], rank, ok, payload[pos : pos + plen], msg.buffers[bpos : bpos + nbuf])
                pos += plen
                bpos += nbuf
            return
        # a host's (or a subtree's) replies at once: one pass to decode, one under the lock, one
        # activity update, one completion
        ranks: list[int]
        values: list[Any]
        if p.mode == "spawn":  # each rank's reply says where its actor's inbox is
            ranks, values, parts = [], [], _entries(h["n"], msg.payload, msg.buffers)
        else:
            ranks, values, parts = _plain_values(h["n"], msg.payload, msg.buffers)
        outcomes = [
            (rank, self._decode_outcome(p, rank, ok, part, bufs)) for rank, ok, part, bufs in parts if rank >= 0
        ]
        if p.reduce and any(x[0] < 0 for x in parts):  # a subtree's folded value (rank -1): one for its ranks
            outcomes += self._partial(p, h, next(x for x in parts if x[0] < 0))
        self._record_outcomes(p, h["i"], outcomes, ranks, values)

    def _one_returned(self, p: Pending, h: dict[str, Any], msg: Message) -> bool:
        """The latency path: ``call_one``/``choose`` returned a value. What ``add`` would do for it,
        without the per-rank bookkeeping a mesh call needs; False: let ``add`` decide (it does not
        unpickle, so ``add`` reports why)."""
        try:
            value = loads(msg.payload, msg.buffers) if msg.buffers else _unpickle(msg.payload)
        except Exception:  # noqa: BLE001 - the general path turns it into that rank's error
            return False
        rank = h.get("rk", 0)
        with self.calls.lock:
            if rank not in p.outstanding:
                return True  # answered already (a failure came first): ignored, as in ``add``
            p.outstanding.discard(rank)
            self.calls.pending.pop(h["i"], None)
            busy = rank not in p.progressed
        if busy and self.hooks.activity is not None:
            self.hooks.activity(p.mesh_id, [rank], -1)
        assert p.future is not None
        p.future._set_result(value)
        return True

    def _partial(self, p: Pending, h: dict[str, Any], part: tuple[int, int, Any, list[Any]]) -> list[tuple[int, Any]]:
        """Keep a reduce's partial value (or the agent's error folding it) for the ranks it holds."""
        _, ok, payload, bufs = part
        ranks = [r for r in h.get("rr") or [] if type(r) is int]
        try:
            value = loads(payload, bufs)
        except Exception as e:  # noqa: BLE001 - a partial we cannot read fails the reduce, naming why
            value, ok = (
                {"op": p.reduce, "error": f"the partial value does not unpickle here: {e}", "where": "the caller"},
                RAISED,
            )
        with self.calls.lock:
            if ok == REDUCED:
                p.partials.append(value)
            elif p.reduce_error is None and isinstance(value, dict):
                where = str(value.get("where"))
                p.reduce_error = ReduceError(
                    p.reduce, str(value.get("error")), where if where == "the caller" else f"the host agent at {where}",
                    f"folding {p.actor}.{p.endpoint}", str(value.get("hint") or ""),
                )  # fmt: skip
        return [(r, _FOLDED) for r in ranks]

    def on_progress(self, msg: Message) -> None:
        """An agent holds the replies of these ranks until its gather is complete: they are done, so
        they stop counting as busy now (``state()``, widget and sidebar show it), not at the end.
        Only ranks that a call of ours still waits for count: ids and ranks off the wire select,
        never create."""
        for call_id, ranks in progress_calls(msg.header):
            with self.calls.lock:
                p = self.calls.pending.get(call_id)
                if p is None or p.mode == "request":
                    continue
                new = [r for r in ranks if r in p.outstanding and r not in p.progressed]
                p.progressed.update(new)
            if new and self.hooks.activity is not None:
                self.hooks.activity(p.mesh_id, new, -1)

    def add(self, p: Pending, call_id: int, rank: int, ok: int, payload: Any, bufs: list[Any]) -> None:
        if p.mode == "request":
            self.calls.finish(call_id)
            assert p.future is not None
            try:
                value = loads(payload, bufs)
            except Exception as e:  # noqa: BLE001
                p.future._set_exception(SerializationError(f"cannot unpickle the reply: {e}"))
                return
            if ok == OK:
                p.future._set_result(value)
            else:
                p.future._set_exception(value if isinstance(value, BaseException) else MeshError(str(value)))
            return
        outcome = self._decode_outcome(p, rank, ok, payload, bufs)
        if p.mode != "stream":
            self._record_outcomes(p, call_id, [(rank, outcome)])
            return
        with self.calls.lock:
            if rank not in p.outstanding:
                return
            p.outstanding.discard(rank)
            if not p.outstanding:
                self.calls.pending.pop(call_id, None)
        if self.hooks.activity is not None:
            self.hooks.activity(p.mesh_id, [rank], -1)
        assert p.stream_q is not None
        f: Future[Any] = Future(p.endpoint)
        if isinstance(outcome, RemoteFailure):
            f._set_exception(ActorError([outcome], total=len(p.ranks)))
        elif isinstance(outcome, Failure):
            f._set_exception(_broken_error([outcome], f"during {p.actor}.{p.endpoint}", p.site()))
        else:
            f._set_result(_value(outcome))
        p.stream_q.put(f)

    def _record_outcomes(
        self,
        p: Pending,
        call_id: int,
        outcomes: list[tuple[int, Any]],
        ranks: Sequence[int] = (),
        values: Sequence[Any] = (),
    ) -> None:
        """Record ranks' outcomes of a call (not a stream); complete it when nothing is left, or at
        once when a rank's proc died (the whole call is doomed: it names every broken rank).
        ``ranks`` returned ``values`` (plain values: no per-rank outcome to look at).

        Replies may be dispatched on two threads at once (a caller reading its reply box, the
        receive thread reporting a failure): outcomes are recorded before completion is decided."""
        with self.calls.lock:
            finished: list[int] = []
            deaths: dict[int, Failure] = {}
            if ranks:
                fresh = p.outstanding.intersection(ranks)
                if len(fresh) == len(ranks):  # each once, and still awaited: the usual case
                    p.outstanding -= fresh
                    p.values.update(zip(ranks, values))
                    finished = list(ranks)
                else:  # some answered already (or twice): those are ignored, as below
                    outcomes = [(r, _Returned(v)) for r, v in zip(ranks, values)] + outcomes
            for rank, outcome in outcomes:
                if rank not in p.outstanding:
                    if (
                        isinstance(outcome, Failure)
                        and outcome.kind in _PROC_DEATH
                        and self.calls.pending.get(call_id) is p
                        and rank in p.ranks
                    ):
                        deaths[rank] = outcome  # it answered, then died: the call fails now, naming it
                    continue
                p.outstanding.discard(rank)
                finished.append(rank)
                if isinstance(outcome, RemoteFailure):
                    p.raised.append(outcome)
                elif isinstance(outcome, Failure):
                    p.broken.append(outcome)
                    if outcome.kind in _PROC_DEATH:
                        deaths[rank] = outcome
                elif outcome is not _FOLDED:
                    p.values[rank] = _value(outcome)
            if not finished and not deaths:
                return
            done = not p.outstanding or bool(deaths)
            if done:
                self.calls.pending.pop(call_id, None)
            if deaths:
                known = {r: self.calls.failed[(p.mesh_id, r)] for r in p.ranks if (p.mesh_id, r) in self.calls.failed}
                known.update(deaths)
                # and what else broke before (ranks cut off by a lost relaying agent, undelivered ones)
                others = [f for f in p.broken if f.kind not in _PROC_DEATH]
                p.broken = [known[r] for r in sorted(known)] + others
                self._doom(p, deaths)
                finished += sorted(p.outstanding)
                p.outstanding.clear()
            busy = [r for r in finished if r not in p.progressed] if p.progressed else finished
        if self.hooks.activity is not None and busy:
            self.hooks.activity(p.mesh_id, busy, -1)
        if p.mode == "spawn" and self.hooks.constructed is not None:
            self.hooks.constructed(p.mesh_id, finished, p.actor_id)
        if done:
            self._complete(p)

    def _doom(self, p: Pending, deaths: dict[int, Failure]) -> None:
        """A death failed the call: the ranks still running it are doomed, and so are the dead ones
        (their agent's gather may tell of a death before its own note does), under ``calls.lock``.
        Not for a spawn: few programs look at its future, so its ranks' deaths stay news (``waits_on``)."""
        if p.mode == "spawn":
            return
        doomed = self.calls.doomed
        now = time.monotonic()
        if len(doomed) > _DOOMED_MAX:  # ranks that did not die: their time is up
            for key in [k for k, until in doomed.items() if until < now]:
                del doomed[key]
        until = now + DOOMED_S
        for r in p.outstanding | deaths.keys():
            doomed[(p.mesh_id, r)] = until

    def _decode_outcome(self, p: Pending, rank: int, ok: int, payload: Any, bufs: list[Any]) -> Any:
        try:
            value = loads(payload, bufs)
        except Exception as e:  # noqa: BLE001 - a result we cannot unpickle is that rank's error
            coords = p.ref.coords(rank) if p.ref else {}
            return RemoteFailure(
                coords, p.actor, p.endpoint, "SerializationError", f"the result does not unpickle here: {e}", ""
            )
        if ok == OK:
            if p.mode == "spawn" and isinstance(value, tuple):  # (proc inbox, actor inbox)
                self.inboxes.learn(value[0], p.actor_id, value[1])
                return None
            return _Returned(value) if isinstance(value, (Failure, RemoteFailure)) else value
        if ok == BROKEN:
            return value  # a Failure built by the agent or proc
        return remote_failure(value, p, rank)

    @staticmethod
    def _reduced(p: Pending) -> None:
        """Fold the partials into the reduce's value. A user's function folds on a thread of its own:
        where replies are read (the receive thread, or the thread waiting in ``get()`` for its own
        reply box) a slow one would hold up every later reply, and its SystemExit would end that thread.
        At most ``max_reduce_fn_folds`` of those at once in this process: past it, the reduce fails at once."""
        if p.reduce_fn in reduce_ops.NAMED.values():
            _finish_reduce(p)
            return
        why = _CALLER_FOLDS.start(_finish_reduce, p, "jupyter-mesh-fold")
        if why:
            assert p.future is not None
            p.future._set_exception(ReduceError(p.reduce, why, "the caller", f"folding {p.actor}.{p.endpoint}", HINT))

    def _complete(self, p: Pending) -> None:
        assert p.future is not None
        if p.mode == "stream":
            return
        if p.broken:
            p.future._set_exception(_broken_error(p.broken, f"during {p.actor}.{p.endpoint}", p.site()))
        elif p.raised:
            p.raised.sort(key=lambda f: tuple(f.coords.values()))
            p.future._set_exception(ActorError(p.raised, total=len(p.ranks)))
        elif p.mode == "one":
            p.future._set_result(p.values[p.ranks[0]])
        elif p.mode == "spawn":
            p.future._set_result(None)
        elif p.reduce:
            self._reduced(p)
        else:
            assert p.shape is not None
            p.future._set_result(ValueMesh(p.shape, list(map(p.values.__getitem__, p.ranks))))


_FOLDED = object()  # a rank whose value is in a reduce's partial
_CALLER_FOLDS = FnFolds("the caller")  # every client of this process: the threads are the process's

# values that may be shared by the ranks that sent the same pickle: nobody can change them in place
_IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes})
_SHARED_MAX = 64  # pickles up to this size are compared with the previous rank's (None is 4 bytes)


def _entries(
    table: list[list[int]], payload: bytes | memoryview, buffers: list[Any]
) -> list[tuple[int, int, memoryview, list[Any]]]:
    """A gathered reply's (rank, ok, pickle, buffers) per entry of its table."""
    view = memoryview(payload)
    out, pos, bpos = [], 0, 0
    for rank, ok, plen, nbuf in table:
        out.append((rank, ok, view[pos : pos + plen], buffers[bpos : bpos + nbuf]))
        pos += plen
        bpos += nbuf
    return out


def _plain_values(
    table: list[list[int]], payload: bytes | memoryview, buffers: list[Any]
) -> tuple[list[int], list[Any], list[tuple[int, int, memoryview, list[Any]]]]:
    """A gathered reply decoded in one pass, as long as every rank returned a plain value (``OK``, no
    out-of-band buffers, a pickle that loads): (ranks, values, []). Equal small pickles in a row
    (every rank returned None, or the same number) are loaded once when the value is immutable.
    Anything else (an exception, a broken rank, a reduce's partial, buffers): ([], [], every entry),
    each then decoded on its own."""
    ranks = [row[0] for row in table]
    if ranks and min(ranks) < 0:
        return [], [], _entries(table, payload, buffers)
    values: list[Any] = []
    append = values.append  # (on the call path: no attribute lookups or helper calls per rank)
    last: bytes | memoryview | None = None
    last_value: Any = None
    pos = 0
    for _, ok, plen, nbuf in table:
        if ok != OK or nbuf:
            return [], [], _entries(table, payload, buffers)
        end = pos + plen
        part = payload[pos:end]
        pos = end
        if part == last:
            append(last_value)
            continue
        try:
            value = _unpickle(part)
        except Exception:  # noqa: BLE001 - that rank's error: decoded on its own, it says why
            return [], [], _entries(table, payload, buffers)
        append(value)
        if plen <= _SHARED_MAX and type(value) in _IMMUTABLE:
            last, last_value = part, value
    return ranks, values, []


def _finish_reduce(p: Pending) -> None:
    assert p.future is not None
    try:
        value = _reduce_result(p)
    except ReduceError as e:
        p.future._set_exception(e)
        return
    p.future._set_result(value)


def _reduce_result(p: Pending) -> Any:
    """The partials of the subtrees folded into the reduce's value (its error, if folding raised)."""
    if p.reduce_error is not None:
        raise p.reduce_error
    values = p.partials + [p.values[r] for r in p.ranks if r in p.values]  # ranks no agent folded
    if not values:
        raise ReduceError(p.reduce, "no rank returned a value", "the caller", f"folding {p.actor}.{p.endpoint}")
    try:
        return reduce_ops.fold(p.reduce_fn, values)
    except BaseException as e:
        if not isinstance(e, Exception) and threading.current_thread() is threading.main_thread():
            raise  # a Ctrl-C while a named op folds in get(); a function's SystemExit comes on its own thread
        raise ReduceError(
            p.reduce, f"{type(e).__qualname__}: {e}", "the caller", f"folding {p.actor}.{p.endpoint}"
        ) from e


def _broken_error(broken: list[Failure], context: str, call: CallSite | None = None) -> MeshError:
    """Dead or failed ranks make a :class:`SupervisionError`; if every rank that did not answer is
    alive and only missed the message, it is a :class:`DeliveryError` (a retry will do)."""
    if all(f.kind == "delivery" for f in broken):
        return DeliveryError(broken, context)
    return SupervisionError(sorted(broken, key=lambda f: f.kind == "delivery"), context, call)  # deaths first
