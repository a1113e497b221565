"""The wire between jupyter_mesh processes: the protocol version, every message kind by name, the codes
that headers carry, the reply header, and the dispatch table each process routes its messages through.

A message is a signed header dict plus an optional pickled payload and out-of-band buffers
(``transport.Message``). Every header has ``k``, its kind (one of :class:`Kind`, short on the wire
because a call's header is sent once per call). The keys the kinds share:

====  =======================================================================================
k     the kind
s     the sender's inbox address (where replies go)
i     a request or call id, chosen by the sender, echoed by the reply
m     a proc mesh id            rk   a global rank in it          a    an actor id
ep    the endpoint a call runs  n    a spawn's actor name
q     a call's sequence number(s) (per sender and actor; ``_q`` after delivery: this rank's)
sl    the ranks a cast reaches, as a ``Slice``                    rm   the reply mode (below)
rt    a reply box address (replies that bypass the caller's receive thread)
ok    a reply's status (below)                                    to   where a gathered reply goes
fa    a spawn asks its actors to end on errors no caller receives (Monarch's way; 0 or absent: live on)
told  an ``actor_fault``'s failure already reached a caller (only an owning actor must still hear it)
tp    a cast's tree: each agent's parent as an index into ``dst`` (-1: the caller); absent: direct
up    a gathered reply from an agent below (its address): its subtree's replies, for its parent
rd    a reduce: the op's name, or a pickled function; ``rr``: the ranks a ``REDUCED`` entry folds
vl    the labels of the view a call was sent to, when not the view its actors were spawned on (a slice:
      ``current_rank()`` there numbers the actor in ``sl``, or ``vs`` for one chosen rank, or as the one
      point of a ``call_one``); in a spawn, of the proc mesh view the actors are spawned on (absent: the
      whole mesh, as it grows), with its ``sl`` (``vs`` in a respawn)
====  =======================================================================================

Every header also carries what the transport adds, signed with the rest: ``v`` the protocol version,
``nb`` the size of each buffer frame, ``sh`` shared-memory segments, and against replays ``se`` the
sender's epoch (random, new with every process: a respawned proc or a new controller is a new epoch),
``sn`` its counter, ``dst`` the destination address (or, for a cast, the agents it goes through).
A receiver takes a message once, only if one of its inboxes (or its agent, for casts) is ``dst``,
and its ``sn`` was not taken before (``transport.Transport._admit``).

Version: the controller passes :data:`VERSION` to each agent it starts and each agent says its own
in ``agent_up``; a mismatch on either side fails with both versions named (see ``check_version``).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError

__all__ = [
    "BROKEN",
    "DIRECT",
    "GATHER",
    "GATHER_DIRECT_MIN",
    "NO_REPLY",
    "OK",
    "OUT_SYNC_PREFIX",
    "RAISED",
    "REDUCED",
    "SENT",
    "STOP_ENDPOINT",
    "VERSION",
    "Dispatch",
    "Kind",
    "check_version",
    "debug_forward",
    "progress",
    "progress_calls",
    "reply_header",
]

VERSION = 7
"""Bump on any change a peer of the previous version would misread (a kind, a key, a code)."""

STOP_ENDPOINT = "__stop__"
"""The endpoint a call of ``ActorMesh.stop()`` names: it runs in its sender's order, after the calls
sent before it (no user's endpoint is called so: a mesh's attributes starting with ``_`` are not)."""

# reply modes a call header carries ("rm")
NO_REPLY, DIRECT, GATHER = 0, 1, 2

OUT_SYNC_PREFIX = "\x00jupyter-mesh-sync "
"""Starts a marker line a proc prints on stdout and stderr (``OUT_SYNC``, or a ``%%mesh`` cell's end):
once both arrived, everything the proc printed before has too. Never shown, never kept in the logs."""
# a reply's per-rank status ("ok"); REDUCED: the folded value of the ranks in ``rr`` (a reduce's
# gathered reply carries at most one such entry, its rank -1); SENT: to its agent only, the rank's
# large result went straight to the caller (``GATHER_DIRECT_MIN``), so the gather holds no entry for it
RAISED, OK, BROKEN, REDUCED, SENT = 0, 1, 2, 3, 4

GATHER_DIRECT_MIN = 1 << 20
"""A gathered call's result this large (pickle and buffers) goes from the proc straight to the caller,
through shared memory when both are on one host, instead of through its host agent: an agent that
took in every rank's large result would hold them all at once, copy each once more, and answer its
heartbeats late."""


class Kind:
    """Every message kind. Who sends it -> who receives it, and what it means."""

    # calls and their replies
    CALL = "c"  # client -> proc (direct) or agent (to relay to its local procs): run an endpoint
    SPAWN = "spawn"  # client -> proc / agent: construct an actor (numbered like a call)
    SKIP = "skip"  # agent -> proc: a call it could not relay; its sequence number is released
    REPLY = "r"  # any -> requester: the answer to a call or request (``reply_header``)
    GATHERED = "g"  # agent -> caller (or its parent agent: ``up``): the replies of its subtree's ranks to a cast
    PRUNE = "prune"  # caller -> agent: stop waiting for the subtree of agent ``up`` in the gather of call ``i``
    UNFORWARDED = "unforwarded"  # agent -> caller: it could not forward cast (m, a, i, q) to the agent ``up``
    PROGRESS = "progress"  # agent -> caller: ranks whose replies it holds for a gather, at most ~20 a second
    CANCEL = "cancel"  # client -> proc: cancel a running call of one actor
    CANCELLED = "cancelled"  # proc -> caller: a rank stopped working on a cancelled call
    SUPERVISE = "supervise"  # proc runtime -> actor: a mesh this actor spawned failed
    ACTOR_FAULT = "actor_fault"  # proc -> an actor mesh's spawner: one of its actors failed (a Failure)
    RDMA = "rdma"  # reader -> buffer owner: a data-plane request (get, put, drop, ucx)
    STATS = "stats"  # any -> agent / proc: transport counters, as a reply
    STACKS = "stacks"  # controller -> proc: every thread's Python stack now, as a reply (from its receive thread)
    OUT_SYNC = "out_sync"  # controller -> proc: print a marker (``t``) after what it printed so far
    PORT = "port"  # any -> the process that opened port ``p``: a value (``ok``) or an exception for it
    SINGLETON = "singleton"  # any -> the root controller: get or spawn the named controller actor
    # remote pdb (``_runtime/remote_pdb``, ``_runtime/debugger``): ``sid`` names one paused debugger
    DEBUG = "debug"  # proc -> agent -> controller: ``ev`` paused (at ``where``), out (pdb's output up to its
    #                  prompt, ``out``), resumed (it let the actor run on; ``step``: to stop again soon);
    #                  ``pm``: a post-mortem stop (the endpoint raised)
    DEBUG_IN = "debug_in"  # controller -> proc: to a paused debugger, a command ``line``, or ``src`` (the
    #                        controller's source lines of files the proc cannot read: notebook cells); without
    #                        ``sid``, ``pm``: post-mortem debugging on or off
    # procs and their agent
    PROC_UP = "proc_up"  # proc -> agent: the proc runs and listens at ``addr``
    ACTOR_UP = "actor_up"  # proc -> agent: an actor's inbox and thread id
    PING = "ping"  # agent -> proc: are you there?
    PONG = "pong"  # proc -> agent: yes
    RESHAPE = "reshape"  # agent -> proc: the mesh grew or shrank (same rank, new extent)
    STOP = "stop"  # agent -> proc: exit now
    NOTICE = "notice"  # controller -> agents -> procs: a rank failed, stopped or moved
    OUT = "out"  # agent -> controller: lines a proc printed
    # agents and the controller
    AGENT_UP = "agent_up"  # agent -> controller: the hello (address, host key, version), or why it refuses
    AGENT_GONE = "agent_gone"  # agent -> controller: it exits now (``why``: a scheduler's SIGTERM)
    ATTACH = "attach"  # controller -> a listening agent (under the mesh key): serve this session
    DETACH = "detach"  # controller -> a kept-alive agent: this controller goes; keep the procs for the next
    REATTACH = "reattach"  # a new controller (the session's keys) -> a kept-alive agent: report to me now
    HEARTBEAT = "hb"  # controller -> agent: alive?
    HEARTBEAT_ACK = "hb_ack"  # agent -> controller's heartbeat socket
    SPAWN_PROCS = "spawn_procs"  # controller -> agent: fork the procs of a mesh on this host
    START_PROCS = "start_procs"  # controller -> agent: more procs for a growing mesh, or a respawn
    STOP_PROCS = "stop_procs"  # controller -> agent: stop (some) procs of a mesh
    KILL_PROC = "kill_proc"  # controller -> agent: kill one rank now
    SHUTDOWN = "shutdown"  # controller -> agent: the job ends
    PROC_READY = "proc_ready"  # agent -> controller: a rank is up (its pid)
    PROC_NOTE = "proc_note"  # agent -> controller: why a rank does not answer (busy), or ""
    PROC_EXIT = "proc_exit"  # agent -> controller: a rank died, with its Failure as payload


# -- builders: the controller's requests to agents, and its notices to procs ----------------------------


def spawn_procs(mesh_id: str, name: str, ranks: list[int], shape: Any, env: dict[str, str],
                preload: list[str], host_dims: int = 1, warm_wait: bool = True) -> dict[str, Any]:  # fmt: skip
    """Fork ``ranks`` of a new proc mesh (``shape``: its wire form) on the agent's host; its first
    ``host_dims`` dims are the hosts' (torchrun's LOCAL_* variables count the others). ``warm_wait``:
    a fork waits for the host's warm imports (torch...) rather than go before them."""
    return {"k": Kind.SPAWN_PROCS, "m": mesh_id, "name": name, "ranks": ranks, "shape": shape, "env": env,
            "preload": preload, "host_dims": host_dims, "warm_wait": warm_wait}  # fmt: skip


def start_procs(mesh_id: str, ranks: list[int], shape: Any = None) -> dict[str, Any]:
    """Start ``ranks`` again (a respawn), or anew on a grown mesh of ``shape``."""
    h: dict[str, Any] = {"k": Kind.START_PROCS, "m": mesh_id, "ranks": ranks}
    if shape is not None:
        h["shape"] = shape
    return h


def stop_procs(mesh_id: str, grace: float, ranks: list[int] | None = None, shape: Any = None) -> dict[str, Any]:
    """Stop every proc of a mesh on the host, or only ``ranks`` (a shrink to ``shape``)."""
    h: dict[str, Any] = {"k": Kind.STOP_PROCS, "m": mesh_id, "grace": grace}
    if ranks is not None:
        h["ranks"], h["shape"] = ranks, shape
    return h


def kill_proc(mesh_id: str, rank: int, sig: int) -> dict[str, Any]:
    return {"k": Kind.KILL_PROC, "m": mesh_id, "rk": rank, "sig": sig}


def notice(what: str, mesh_id: str, rank: int | None = None, addr: str | None = None) -> dict[str, Any]:
    """To every proc: a rank ``failed`` (the Failure is the payload), ``respawned`` at ``addr``, or the
    mesh ``stopped``."""
    h: dict[str, Any] = {"k": Kind.NOTICE, "what": what, "m": mesh_id}
    if rank is not None:
        h["rk"] = rank
    if addr is not None:
        h["addr"] = addr
    return h


DEBUG_KEYS = ("k", "m", "rk", "sid", "ev", "an", "where", "out", "step", "pm")
"""What a ``debug`` event carries: the agent forwards only these to the controller."""


def debug_forward(header: dict[str, Any]) -> dict[str, Any]:
    """A proc's ``debug`` event as its agent passes it on (its own transport fields dropped)."""
    return {key: header[key] for key in DEBUG_KEYS if key in header}


def progress(calls: dict[int, list[int]]) -> dict[str, Any]:
    """Ranks that answered casts whose gathered reply is not complete yet: {call id: ranks}."""
    return {"k": Kind.PROGRESS, "p": [[i, ranks] for i, ranks in calls.items()]}


def progress_calls(header: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """A ``progress`` header's (call id, ranks), its malformed entries left out: a receiver then
    looks each id up among its own calls and keeps only ranks that call still waits for."""
    out = []
    entries = header.get("p")
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, list) and len(e) == 2 and type(e[0]) is int and isinstance(e[1], list):
            out.append((e[0], [r for r in e[1] if type(r) is int]))
    return out


def reply_header(req_id: int, ok: int, rank: int | None = None) -> dict[str, Any]:
    """The header of a reply to request ``req_id`` (``rank``: which rank of a cast answers)."""
    h: dict[str, Any] = {"k": Kind.REPLY, "i": req_id, "ok": ok}
    if rank is not None:
        h["rk"] = rank
    return h


def skip(call: dict[str, Any], seq: int, rank: int) -> dict[str, Any]:
    """To a proc: the message ``call`` (its header) that was meant for ``rank`` with sequence number
    ``seq`` will not come; the actor moves past that number instead of waiting for it."""
    return {"k": Kind.SKIP, "m": call["m"], "a": call["a"], "n": call.get("n", ""), "s": call["s"], "q": seq,
            "rk": rank, "ck": call["k"]}  # fmt: skip


def check_version(theirs: object, who: str) -> None:
    """Raise if a peer speaks another protocol version, naming both."""
    if theirs != VERSION:
        raise ProtocolError(
            f"{who} speaks jupyter_mesh wire protocol {theirs!r}, this process speaks {VERSION}: "
            "install the same jupyter_mesh version on every host"
        )


Handler = Callable[[Any, list[Any]], object]  # what it returns is ignored


class Dispatch:
    """One process's message table: kind -> handler(message, raw frames).

    A kind with no handler is not silently dropped: it is counted (``unknown``) and the first of each
    kind is reported on stderr, naming the process and the sender, since it means a peer of another
    version or a bug. ``fallback`` (a proc whose actors spawned meshes: the controller's table) gets
    what this table does not handle."""

    def __init__(self, where: str, handlers: dict[str, Handler], fallback: Dispatch | None = None):
        unknown = set(handlers) - set(vars(Kind).values())
        if unknown:
            raise ValueError(f"{where}: handlers for kinds that do not exist: {sorted(unknown)}")
        self.where = where
        self.handlers = handlers
        self.fallback = fallback
        self.unknown: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, kind: str, handler: Handler) -> None:
        """Serve one more kind: for a layer above the runtime that answers requests of its own."""
        if kind not in set(vars(Kind).values()):
            raise ValueError(f"{self.where}: no message kind {kind!r}")
        self.handlers[kind] = handler

    def __call__(self, msg: Any, frames: list[Any]) -> None:
        kind = msg.header.get("k")
        handler = self.handlers.get(kind)
        if handler is not None:
            handler(msg, frames)
        elif self.fallback is not None and kind in self.fallback.handlers:
            self.fallback(msg, frames)
        else:
            self.report_unknown(kind, msg.header.get("s"))

    def report_unknown(self, kind: Any, sender: Any) -> None:
        key = repr(kind)[:40]
        with self._lock:
            self.unknown[key] += 1
            first = self.unknown[key] == 1
        if first:
            print(
                f"jupyter_mesh ({self.where}): ignored a message of unknown kind {key}"
                + (f" from {str(sender)[:80]}" if sender else "")
                + "; a peer of another jupyter_mesh version, or a bug (further ones are only counted)",
                file=sys.stderr,
            )
