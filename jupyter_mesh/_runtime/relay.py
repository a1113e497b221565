"""The agent's half of a cast: relay a signed call (or spawn) to the targeted procs of its host, and
gather their replies into one message back to the caller (``call``: O(hosts) messages for the
controller, not O(procs)), telling the caller meanwhile which ranks answered (``progress``). A relay that fails is reported as undelivered, never as a death, and the
rank's sequence number is released there so no later call waits for it.

Past the fan-out (``tree``), the cast also names agents below this one: it is forwarded to them as
signed, first, and the gather waits for their subtrees' gathered replies too, sending the whole to its
parent agent (or to the caller at the top). A reduce folds what it holds into one value on the way.
A forward that fails is not waited for: the caller hears of it at once (``UNFORWARDED``) and fails that
subtree's ranks as undelivered, releasing their sequence numbers (it knows their procs; we do not)."""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Protocol

from .._core.shape import Slice
from .._wire import protocol
from .._wire.channels import FrameTooLarge
from .._wire.protocol import BROKEN, DIRECT, GATHER, NO_REPLY, OK, RAISED, REDUCED, SENT, Kind
from .._wire.serialize import dumps
from .._wire.transport import Message
from ..errors import Failure
from .agent_state import Gather, ProcEntry, kill
from .fn_folds import HINT, FnFolds
from .pending import pack_gathered
from .progress import ProgressSender
from .reduce_ops import agent_loads, fold, resolve
from .remote_errors import error_info
from .tree import children

if TYPE_CHECKING:
    from .._wire.transport import Transport
    from .agent_state import HostedMesh
    from .inboxes import ActorInboxes


class RelayHost(Protocol):
    """What a relay needs of its host agent."""

    transport: Transport
    inboxes: ActorInboxes
    lock: threading.RLock
    procs: dict[tuple[str, int], ProcEntry]
    meshes: dict[str, HostedMesh]

    def failure(
        self, p: ProcEntry, kind: str, detail: str, code: int | None = None, sig: int | None = None
    ) -> Failure: ...


__all__ = ["Relay"]


class Relay:
    def __init__(self, agent: RelayHost):
        self.agent = agent
        self.gathers: dict[tuple[str, int], Gather] = {}  # (caller, call id) -> replies so far
        # ranks that answered a gather still open, batched to their callers (to the inbox its
        # receive thread reads, not a reply box: the caller's state, not its waiting thread, wants them)
        # reduces to fold, off the receive thread: named ops in turn on one thread; a user's function
        # on a thread of its own (``_fold_later``), so a slow one holds up no other reduce; a bounded
        # number of those at once (``fn_folds``): one that never returns keeps its thread
        self._folds: queue.SimpleQueue[Gather] = queue.SimpleQueue()
        self._folder: threading.Thread | None = None
        self.fn_folds = FnFolds("this host agent")
        self.progress = ProgressSender(lambda to, header: self.agent.transport.send(to, Message(header)))
        # fault injection, for tests of the undelivered path: "c:2,spawn:1" fails the next two relays of
        # calls and the next one of a spawn, as a send error would; "c>6:1" fails the next forward of a
        # call (through the tree) to the agent at position 6 of its layout
        self._failing = {
            kind: int(n)
            for kind, _, n in (x.partition(":") for x in os.environ.get("JUPYTER_MESH_FAIL_RELAYS", "").split(",") if x)
        }

    def waiting_on(self, p: ProcEntry) -> list[tuple[str, int]]:
        """The gathers still waiting for ``p``'s reply (caller holds the agent's lock)."""
        return [k for k, g in self.gathers.items() if g.mesh_id == p.mesh_id and p.rank in g.outstanding]

    def relay(self, h: dict[str, Any], frames: list[Any]) -> None:
        sl = Slice.from_wire(h["sl"])
        parent, kids = self._forward(h, frames) if "tp" in h else ("", [])
        empty: Gather | None = None
        with self.agent.lock:
            mesh = self.agent.meshes.get(h["m"])
            if mesh is None and not kids:  # stopped (or never here): say so rather than leave the caller waiting
                self._gone(h, sl, parent)
                return
            targets = (
                [self.agent.procs[(mesh.mesh_id, r)] for r in mesh.ranks if sl.index_of(r) is not None] if mesh else []
            )
            if not targets and not kids and not (parent and h["rm"] == GATHER):
                return  # (a parent agent waits for our gather, even an empty one: forwards failed)
            if h["rm"] == GATHER:
                g = Gather(
                    h["m"], parent or h.get("rt") or h["s"], h["i"], {p.rank for p in targets}, children=set(kids)
                )
                if parent:
                    g.up, g.caller = self.agent.transport.address, h["s"]
                g.op, g.endpoint = h.get("rd"), str(h.get("ep", ""))
                if mesh is None:  # our ranks answer "stopped"; the subtrees below answer for theirs
                    g.entries = self._stopped_entries(h, sl)
                if not targets and not kids:  # nothing to wait for: answer our parent now, outside the lock
                    empty = g
                else:
                    self.gathers[(h["s"], h["i"])] = g
            elif mesh is None:
                self._gone(h, sl)
        if empty is not None:
            self._send_gathered(empty)
            return
        dead = []
        undelivered: list[tuple[ProcEntry, BaseException]] = []
        actor_id = h["a"] if h["k"] == Kind.CALL else ""  # a spawn goes to the proc: its actor has no inbox yet
        for p in targets:
            if not (p.alive and p.up):  # dead, or not up yet (a respawn or grow under way)
                dead.append(p)
                continue
            try:
                if self._failing.get(h["k"], 0) > 0:
                    self._failing[h["k"]] -= 1
                    raise OSError("injected relay failure (JUPYTER_MESH_FAIL_RELAYS)")
                self.agent.transport.send_raw(self.agent.inboxes.address(p.addr, actor_id), frames)
            except Exception as e:  # noqa: BLE001 - one bad peer must not starve the others
                undelivered.append((p, e))
        for p in dead:
            self._broken(h, p)
        for p, exc in undelivered:
            self._undelivered(h, p, exc)

    def _undelivered(self, h: dict[str, Any], p: ProcEntry, err: BaseException) -> None:
        """A relay to a live proc failed: release its sequence number there (or the actor would wait
        for it forever) and tell the caller what happened, as what it is, not as a death."""
        seq = h["q"] if "rk" in h or isinstance(h["q"], int) else h["q"][Slice.from_wire(h["sl"]).index_of(p.rank)]
        skip = protocol.skip(h, seq, p.rank)
        skip["oe"] = h.get("se", "")  # the caller's epoch: its calls are ordered per (address, epoch)
        try:
            self.agent.transport.send(p.addr, Message(skip))
        except Exception as e2:  # noqa: BLE001 - not even a header gets through: the proc is unusable
            print(f"jupyter-mesh agent: cannot reach proc {p.pid} ({e2!r}); killing it", file=sys.stderr)
            kill(p.pid, signal.SIGKILL)  # its exit is reported as a failure, with this line as cause
        what = "spawn" if h["k"] == Kind.SPAWN else f"call of {h.get('ep', '?')}"
        f = self.agent.failure(p, "delivery", f"the host agent could not relay the {what} to proc {p.pid}: {err!r}")
        self._reply_failure(h, p, f)

    def _stopped_entries(self, h: dict[str, Any], sl: Slice) -> list[tuple[int, int, Any, list[Any]]]:
        f = Failure(h["m"], {}, "stopped", "its proc mesh was stopped (or never ran on this host)")
        payload = dumps(f)[0]
        return [(r, BROKEN, payload, []) for r in sl.ranks()]

    def _gone(self, h: dict[str, Any], sl: Slice, parent: str = "") -> None:
        """A call for a proc mesh this agent does not have: every targeted rank answers "stopped"."""
        if h["rm"] == NO_REPLY or not h.get("i"):
            return
        entries = self._stopped_entries(h, sl)
        to = h.get("rt") or h["s"]
        if h["rm"] == GATHER:
            g = Gather(h["m"], parent or to, h["i"], set(), entries, caller=h["s"])
            if parent:
                g.up = self.agent.transport.address
            self._send_gathered(g)
        else:
            for r, ok, pl, _ in entries:
                self.agent.transport.send(to, Message({"k": Kind.REPLY, "i": h["i"], "rk": r, "ok": ok}, pl))

    def _broken(self, h: dict[str, Any], p: ProcEntry) -> None:
        """Answer for a rank whose proc is dead (or not up yet). A dead one's answer is its death as
        reported, cause included: the caller may not have heard of that yet (the report and this answer
        travel apart), and then this is all it is told ("proc 12 is not running" did not say why)."""
        if p.alive:
            f = self.agent.failure(p, "start", f"proc {p.pid} is still starting (a respawn or grow is under way)")
        else:
            kind, detail = p.ended or ("exit", f"proc {p.pid} is not running")
            f = self.agent.failure(p, kind, detail, p.exit_code, p.exit_signal)
        self._reply_failure(h, p, f)

    def _reply_failure(self, h: dict[str, Any], p: ProcEntry, f: Failure) -> None:
        """Answer for rank ``p`` of a relayed call with ``f`` (in its gather, or straight to the caller)."""
        if h["rm"] == GATHER:
            self.add_to_gather((h["s"], h["i"]), p.rank, BROKEN, dumps(f)[0], [])
        elif h["rm"] == DIRECT:
            to = h.get("rt") or h["s"]
            self.agent.transport.send(
                to, Message({"k": Kind.REPLY, "i": h["i"], "rk": p.rank, "ok": BROKEN}, dumps(f)[0])
            )

    def gathered(self, h: dict[str, Any], msg: Message) -> None:
        self.add_to_gather((h["to"], h["i"]), h["rk"], h["ok"], msg.payload, msg.buffers)

    def add_to_gather(self, key: tuple[str, int], rank: int, ok: int, payload: Any, bufs: list[Any]) -> None:
        with self.agent.lock:
            g = self.gathers.get(key)
            if g is None or rank not in g.outstanding:
                return
            g.outstanding.discard(rank)
            if ok != SENT:  # (SENT: its large result went straight to the caller)
                g.entries.append((rank, ok, payload, bufs))
            if g.outstanding or g.children:
                self.progress.done(key[0], key[1], rank)
                return
            del self.gathers[key]
        self.progress.forget(key[0], key[1])
        self._send_gathered(g)

    # -- the tree ----------------------------------------------------------------------------------
    def _forward(self, h: dict[str, Any], frames: list[Any]) -> tuple[str, list[str]]:
        """Pass the cast on, as signed, to the agents its signed layout puts below us; returns our
        parent (where our gathered reply goes; "" at the top: the caller) and those agents."""
        dst, tp = h["dst"], h["tp"]
        me = dst.index(self.agent.transport.address)  # admitted: the signed ``dst`` names us
        kids = []
        for j in children(tp, me):
            try:
                if self._failing.get(f"{h['k']}>{j}", 0) > 0:
                    self._failing[f"{h['k']}>{j}"] -= 1
                    raise OSError("injected forward failure (JUPYTER_MESH_FAIL_RELAYS)")
                self.agent.transport.send_raw(dst[j], frames)
                kids.append(dst[j])
            except Exception as e:  # noqa: BLE001 - one bad peer must not starve the others
                self._unforwarded(h, dst[j], e)
        return (dst[tp[me]] if tp[me] >= 0 else ""), kids

    def _unforwarded(self, h: dict[str, Any], addr: str, err: BaseException) -> None:
        """A forward to the agent at ``addr`` failed: its subtree never gets the cast. Our gather does not
        wait for it, and the caller hears of it at once: it fails that subtree's ranks (undelivered)
        and releases their sequence numbers (it alone knows their procs)."""
        print(f"jupyter-mesh agent: cannot forward a cast to the agent at {addr}: {err!r}", file=sys.stderr)
        note = {"k": Kind.UNFORWARDED, "m": h["m"], "a": h["a"], "i": h.get("i", 0), "q": h["q"], "up": addr}
        note["why"], note["at"] = f"{err!r}"[:500], self.agent.transport.address
        try:
            self.agent.transport.send(h["s"], Message(note))
        except Exception as e2:  # noqa: BLE001 - the caller is gone: nobody waits for those ranks
            print(f"jupyter-mesh agent: cannot tell the caller {h['s']} either: {e2!r}", file=sys.stderr)

    def subtree_gathered(self, msg: Message) -> None:
        """A gathered reply from an agent below us: its subtree's ranks, or their folded value."""
        h = msg.header
        key = (h["to"], h["i"])
        with self.agent.lock:
            g = self.gathers.get(key)
            if g is None or h["up"] not in g.children:
                return
            g.children.discard(h["up"])
            pos, bpos = 0, 0
            done: list[int] = []
            payload = memoryview(msg.payload)
            for rank, ok, plen, nbuf in h["n"]:
                part, bufs = payload[pos : pos + plen], msg.buffers[bpos : bpos + nbuf]
                pos, bpos = pos + plen, bpos + nbuf
                if rank < 0:  # a reduce's partial value (or the error that folding it raised)
                    g.partials.append((ok, part, bufs))
                    g.folded.extend(h.get("rr") or [])
                    done.extend(h.get("rr") or [])
                else:
                    g.entries.append((rank, ok, part, bufs))
                    done.append(rank)
            if g.outstanding or g.children:
                for r in done:
                    self.progress.done(key[0], key[1], r)
                return
            del self.gathers[key]
        self.progress.forget(key[0], key[1])
        self._send_gathered(g)

    def prune(self, h: dict[str, Any]) -> None:
        """The caller lost an agent below us: stop waiting for its subtree (the caller fails its ranks)."""
        key = (h["s"], h["i"])
        with self.agent.lock:
            g = self.gathers.get(key)
            if g is None or h.get("up") not in g.children:
                return
            g.children.discard(h["up"])
            if g.outstanding or g.children:
                return
            del self.gathers[key]
        self.progress.forget(key[0], key[1])
        self._send_gathered(g)

    def _send_gathered(self, g: Gather, folding: bool = False) -> None:
        if g.op is not None and not folding:
            self._fold_later(g)
            return
        entries, header = g.entries, {"k": Kind.GATHERED, "i": g.call_id}
        if g.op is not None:
            entries, header["rr"] = self._fold(g)
        if g.up:
            header["to"], header["up"] = g.caller, g.up
        try:
            self._send_entries(g, header, entries)
        except FrameTooLarge as e:  # one message too large for a peer over TCP: each rank says so instead
            self._send_entries(g, header, [self._too_large(g, rank, e) for rank, *_ in entries])

    def _send_entries(self, g: Gather, header: dict[str, Any], entries: list[tuple[int, int, Any, list[Any]]]) -> None:
        table, payload_all, bufs_all = pack_gathered(entries)
        self.agent.transport.send(g.sender, Message({**header, "n": table}, payload_all, bufs_all))

    def _too_large(self, g: Gather, rank: int, e: FrameTooLarge) -> tuple[int, int, Any, list[Any]]:
        what = (
            f"the gathered results of {'this subtree' if g.up else 'this host'} cannot be sent on in one message: {e}"
        )
        if rank < 0:  # a reduce's partial value
            info = {"op": "reduce op", "error": f"FrameTooLarge: {what}", "where": self.agent.transport.address}
            return (rank, RAISED, dumps(info)[0], [])
        return (rank, RAISED, dumps(error_info(FrameTooLarge(what), g.endpoint))[0], [])

    def _fold_later(self, g: Gather) -> None:
        """Folding unpickles results (a first tensor imports torch: seconds) and runs the op: never on
        the receive thread, which must go on answering heartbeats and relaying. Named ops take turns on
        one thread; a user's function gets a thread of its own, which it holds for as long as it runs
        (one that never returns holds it until the agent ends), so it delays no other reduce. Past
        ``max_reduce_fn_folds`` of those at once, the reduce fails at once instead (here, on the
        receive thread: no user code runs)."""
        if not isinstance(g.op, str):
            why = self.fn_folds.start(self._fold_and_send, g, "jupyter-mesh-fold-fn")
            if why:
                g.refused = why
                self._fold_and_send(g)
            return
        with self.agent.lock:
            if self._folder is None:
                self._folder = threading.Thread(target=self._folding, name="jupyter-mesh-fold", daemon=True)
                self._folder.start()
        self._folds.put(g)

    def _folding(self) -> None:
        while True:
            self._fold_and_send(self._folds.get())

    def _fold_and_send(self, g: Gather) -> None:
        try:
            self._send_gathered(g, folding=True)
        except BaseException:  # noqa: BLE001 - not even the op's SystemExit ends the thread: later reduces need it
            import traceback

            traceback.print_exc()

    def _fold(self, g: Gather) -> tuple[list[tuple[int, int, Any, list[Any]]], list[int]]:
        """A reduce: the results that came back OK, and the partials from below, become one entry
        (rank -1, REDUCED); errors and broken ranks stay as they are. What the op raises becomes that
        entry's error (RAISED), naming it: a user's function never harms the agent."""
        rest = [e for e in g.entries if e[1] != OK]
        ranks = [e[0] for e in g.entries if e[1] == OK] + g.folded
        if not ranks:
            return rest, []
        failed = next((p for p in g.partials if p[0] != REDUCED), None)
        if failed is not None:  # folding failed below: that error stands for the whole subtree
            return [*rest, (-1, RAISED, failed[1], failed[2])], ranks
        name = "reduce op"
        if g.refused:  # too many folds of functions run here already (``fn_folds``)
            info = {"op": name, "error": g.refused, "where": self.agent.transport.address, "hint": HINT}
            return [*rest, (-1, RAISED, dumps(info)[0], [])], ranks
        try:
            name, fn = resolve(g.op)
            named = isinstance(g.op, str)
            values = [agent_loads(e[2], e[3], named) for e in g.entries if e[1] == OK]
            values += [agent_loads(p[1], p[2], named) for p in g.partials]
            payload, bufs = dumps(fold(fn, values))
            return [*rest, (-1, REDUCED, payload, bufs)], ranks
        except BaseException as e:  # noqa: BLE001 - the op's error (SystemExit too) goes to the caller, the agent lives on
            info = {"op": name, "error": f"{type(e).__qualname__}: {e}"[:2000], "where": self.agent.transport.address}
            return [*rest, (-1, RAISED, dumps(info)[0], [])], ranks
