"""The proc: one worker process of a proc mesh, hosting one actor of each actor mesh spawned on it
(``actor_host.ActorHost``: one actor, its thread and its calls). Stopped, it finalizes like any Python
program that ends (``atexit``, finalizers), within the stop's timeout.

Threads: every actor has its own thread and its own inbox socket. Calls to one actor (``call_one``,
``choose``, and the agent's relays of ``call``) are sent to that inbox and wake the actor's thread
directly: no hand-over between threads on the latency path. The main thread receives everything else
(``Transport.serve``): spawns, control messages, calls from senders that do not know the actor's inbox
yet; it hands an actor its mail through a mailbox and rings the inbox's doorbell. The actor's thread
restores per-sender order across both ways in. A sync endpoint that blocks (even on ``.get()`` of a
call to another actor) blocks only its actor; ``async def`` endpoints run on the actor's own asyncio
loop. Results are sent straight from the actor's thread.
"""

from __future__ import annotations

import atexit
import importlib
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .._core.context import ProcIdentity, context
from .._core.shape import Point, Shape, Slice
from .._data import ucx as _ucx
from .._data.owner import handle_message as handle_rdma
from .._wire.channels import CurveKeys, FrameTooLarge
from .._wire.protocol import (
    DIRECT,
    GATHER_DIRECT_MIN,
    NO_REPLY,
    OK,
    OUT_SYNC_PREFIX,
    RAISED,
    SENT,
    Dispatch,
    Kind,
    reply_header,
)
from .._wire.serialize import dumps, loads
from .._wire.transport import Message, Transport
from ..errors import SupervisionError
from . import cancel_signal, remote_pdb
from .actor_host import ActorHost, exit_proc
from .client import Client, set_current_client
from .hooks import Embedding, embed
from .rank_env import set_rank_env
from .remote_errors import error_info
from .stacks import thread_stacks

CUT_GRACE = 2.0
"""Seconds a proc that got SIGTERM has to die before it answers the calls that SIGTERM cut itself."""

__all__ = ["ProcRuntime", "live_actor", "main"]

_runtime: ProcRuntime | None = None  # this proc's, once it runs


def _size(payload: bytes, bufs: list[Any]) -> int:
    return len(payload) + sum(memoryview(b).nbytes for b in bufs)


def live_actor(actor_id: str) -> ActorHost:
    """The actor ``actor_id`` of this proc (``KeyError`` if there is none): for code that must touch
    a live actor from beside it, like the notebook's ``%mesh reload``."""
    if _runtime is None:
        raise KeyError(actor_id)
    return _runtime.actors[actor_id]


def print_sync_marker(token: str) -> None:
    """After what this proc printed so far, a marker on stdout and on stderr: the controller waits
    for both to know that the output before them has reached it (the pipes keep their order)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.write(f"{OUT_SYNC_PREFIX}{token}\n")
            stream.flush()
        except (OSError, ValueError):  # closed by the user's code: nothing more will come from it
            pass


class ProcRuntime:
    """Receive loop, per-sender ordering and actor registry of one proc."""

    def __init__(self, cfg: dict[str, Any], key: bytes):
        global _runtime
        _runtime = self
        self.rank: int = cfg["rank"]
        self.mesh_id: str = cfg["mesh_id"]
        self.mesh_name: str = cfg["mesh_name"]
        self.shape = Shape.from_wire(cfg["shape"])
        self.point = Point(self.rank, self.shape.extent)
        self.coords = dict(self.point)
        self.agent_addr: str = cfg["agent"]
        self.transport = Transport(key, cfg["bind"], CurveKeys.from_wire(cfg["curve"]) if cfg.get("curve") else None)
        _ucx.follow_bind(cfg["bind"])  # UCX, if used, on the interface our host's peers reach us by
        # casts come through our agent as their sender signed them; none it relayed before we existed
        self.transport.accept_via(cfg["agent"], cfg.get("floors"))
        # controllers that lost this (kept-alive) job to another: whatever they still send is dropped
        self.deposed: set[str] = {e for e in cfg.get("deposed") or [] if isinstance(e, str)}
        self.client = Client(self.transport)
        set_current_client(self.client)
        # an actor here may spawn meshes of its own: the controller made for that shares our runtime,
        # and gets (as the fallback of our table) the kinds only a controller handles
        self.dispatch = self._table()
        self._failure_watchers: list[Callable[[str, int, Any], None]] = []  # an embedded controller's
        embed(
            Embedding(
                key,
                self.transport,
                self.client,
                self._route_to_controller,
                lambda: context().actor.host,
                self._supervise,
                self._failure_watchers.append,
            )
        )
        context().identity = ProcIdentity(self.mesh_id, self.mesh_name, tuple(self.coords.items()), self.rank)
        self.actors: dict[str, ActorHost] = {}
        self._orphans: dict[str, list[Message]] = {}  # calls that overtook their actor's spawn
        self._early_cancels: dict[str, list[tuple[str, int]]] = {}  # and cancels of such calls
        self._main_host: queue.SimpleQueue[ActorHost | None] = queue.SimpleQueue()
        self._main_claimed = False
        self.stopping = False
        self.terminated = False  # stopped by SIGTERM: it dies of it, and the cut calls get that cause
        self._cut: list[Callable[[], None]] = []  # answers to calls SIGTERM cut (``hold_cut``)
        self._cut_lock = threading.Lock()
        self._cut_due = False
        remote_pdb.install(self._debug_event)  # breakpoint() pauses the calling actor for the controller

    def hold_cut(self, answer: Callable[[], None]) -> None:
        """A call SIGTERM cut: its caller hears of the proc's death from the agent (an answer now would
        race that report and tell of an interrupt on a live actor). Only a proc still alive
        ``CUT_GRACE`` seconds later (a slow ``atexit`` handler, ``__cleanup__``) answers it after
        all (``answer_cut``), so that no caller waits on a proc that does not end."""
        with self._cut_lock:
            if not self._cut_due:
                self._cut.append(answer)
                return
        answer()

    def answer_cut(self) -> None:
        with self._cut_lock:
            self._cut_due = True
            cut, self._cut = self._cut, []
        for answer in cut:
            try:
                answer()
            except Exception:  # noqa: BLE001 - the caller is gone: nobody to tell
                pass

    def _debug_event(self, h: dict[str, Any]) -> None:
        self.transport.send(self.agent_addr, Message({**h, "m": self.mesh_id, "rk": self.rank}))

    def claim_main_thread(self, host: ActorHost) -> bool:
        """The first actor gets the main thread (``serve`` hands it over); later ones get threads."""
        if self._main_claimed:
            return False
        self._main_claimed = True
        cancel_signal.set_main_actor(host)
        self._main_host.put(host)
        return True

    def _route_to_controller(self, table: Dispatch) -> None:
        self.dispatch.fallback = table

    def _supervise(self, host: ActorHost, err: SupervisionError) -> None:
        host.supervise(err)

    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None:
        rm = h["rm"]
        if rm == NO_REPLY:
            return
        hdr = reply_header(h["i"], ok, self.rank)
        if rm == DIRECT:  # to the caller's reply box if it has one (``replies``), else to its inbox
            to = h.get("rt") or h["s"]
            try:
                self.transport.send(to, Message(hdr, payload, bufs), local=bool(h.get("l")))
            except FrameTooLarge as e:
                self._too_large(h, to, e)
            return
        if "rd" not in h and _size(payload, bufs) >= GATHER_DIRECT_MIN and self._reply_direct(h, hdr, payload, bufs):
            hdr = reply_header(h["i"], SENT, self.rank)  # the agent's gather: answered, nothing to carry
            payload, bufs = b"", []
        hdr["to"] = h["s"]
        self.transport.send(self.agent_addr, Message(hdr, payload, bufs))

    def _reply_direct(self, h: dict[str, Any], hdr: dict[str, Any], payload: bytes, bufs: list[Any]) -> bool:
        """A large result of a gathered call, straight to the caller (``GATHER_DIRECT_MIN``); False if
        it could not go (the gather carries it then, as any other)."""
        local = h.get("hk") == context().host_key  # the caller said where it runs: shared memory
        to = h.get("rt") or h["s"]
        try:
            self.transport.send(to, Message(dict(hdr), payload, bufs), local=local)
        except FrameTooLarge as e:  # (the agent's way would end at the same limit)
            self._too_large(h, to, e)
        except Exception as e:  # noqa: BLE001 - e.g. /dev/shm full: the agent's way still works
            print(f"jupyter-mesh proc {self.rank}: a large result goes through the agent: {e!r}", file=sys.stderr)
            return False
        return True

    def _too_large(self, h: dict[str, Any], to: str, e: FrameTooLarge) -> None:
        """The result cannot cross to its caller in one message: the caller gets that, as this rank's error."""
        err = FrameTooLarge(f"the result of {h.get('ep', 'the call')} cannot be sent to its caller: {e}")
        hdr = reply_header(h["i"], RAISED, self.rank)
        self.transport.send(to, Message(hdr, dumps(error_info(err, str(h.get("ep", "")), 0))[0]))

    def _table(self) -> Dispatch:
        return Dispatch(
            f"proc {self.rank} of {self.mesh_name}",
            {
                Kind.CALL: lambda msg, _: self._deliver(msg),
                Kind.SPAWN: lambda msg, _: self._deliver(msg),
                Kind.SKIP: lambda msg, _: self._deliver(msg),
                Kind.REPLY: lambda msg, _: self.client.on_reply(msg),
                Kind.GATHERED: lambda msg, _: self.client.on_reply(msg),
                Kind.UNFORWARDED: lambda msg, _: self.client.unforwarded(msg),  # a tree relay failed
                Kind.PROGRESS: lambda msg, _: self.client.on_progress(msg),  # ranks done, reply held
                Kind.NOTICE: self._on_notice,
                Kind.RESHAPE: self._on_reshape,
                Kind.PING: lambda msg, _: self.transport.send(
                    self.agent_addr, Message({"k": Kind.PONG, "m": self.mesh_id, "rk": self.rank})
                ),
                Kind.CANCEL: self._on_cancel,
                Kind.RDMA: lambda msg, _: handle_rdma(self.transport, msg),
                # an actor here cancelled a call of another actor: that rank stopped
                Kind.CANCELLED: lambda msg, _: self.client.cancel_acks.acked(msg.header["i"], msg.header["rk"]),
                Kind.STATS: lambda msg, _: self.transport.send(
                    msg.header["s"], Message(reply_header(msg.header["i"], OK), dumps(vars(self.transport.stats))[0])
                ),
                Kind.STACKS: lambda msg, _: self.transport.send(
                    msg.header["s"], Message(reply_header(msg.header["i"], OK), dumps(thread_stacks())[0])
                ),
                Kind.STOP: lambda msg, _: self.stop(),
                Kind.OUT_SYNC: lambda msg, _: print_sync_marker(msg.header["t"]),
                Kind.PORT: lambda msg, _: self.client.ports.on_message(msg),
                Kind.DEBUG_IN: lambda msg, _: remote_pdb.deliver(msg.header, self.transport),
            },
        )

    def stop(self) -> None:
        """Asked to stop (the agent's ``STOP``, or SIGTERM): every actor ends its loop once the call it
        runs ends (that call is cancelled), the main thread returns from ``serve``, and the proc exits
        the normal way, running ``atexit`` handlers and finalizers. The agent kills a proc that takes
        longer than the stop's timeout."""
        if self.stopping:
            return
        self.stopping = True
        for host in list(self.actors.values()):
            host.close()
        self._main_host.put(None)  # the main thread may still wait for a first actor

    def handle(self, msg: Message, frames: list[Any]) -> None:
        if self.deposed and msg.header.get("se") in self.deposed:
            self.transport.stats.dropped_deposed += 1
            return
        self.dispatch(msg, frames)

    def _on_notice(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        if h["what"] == "deposed":  # our agent was taken over (keep_alive): its old controller's calls stop here
            if isinstance(h.get("ep"), str):
                self.deposed.add(h["ep"])
        elif h["what"] == "failed":
            failure = loads(msg.payload, msg.buffers)
            self.client.notice_failed(h["m"], h["rk"], failure)  # first: a lost agent in our casts' trees
            self.client.mark_failed({h["rk"]: failure}, h["m"])
            for watch in self._failure_watchers:  # actors here that spawned actor meshes on it
                watch(h["m"], h["rk"], failure)
        elif h["what"] == "stopped":
            self.client.mark_stopped(h["m"])
        else:
            self.client.rank_moved(h["m"], h["rk"], h["addr"])

    def _on_reshape(self, msg: Message, frames: list[Any]) -> None:
        """The mesh grew or shrank: same rank, new extent."""
        self.shape = Shape.from_wire(msg.header["shape"])
        self.point = Point(self.rank, self.shape.extent)

    def _on_cancel(self, msg: Message, frames: list[Any]) -> None:
        host = self.actors.get(msg.header["a"])
        if host is not None:
            host.cancel(msg.header["s"], msg.header["ci"])
        elif msg.header["a"] in self._orphans:  # its call overtook the spawn: it is skipped when it comes up
            self._early_cancels.setdefault(msg.header["a"], []).append((msg.header["s"], msg.header["ci"]))

    def seq_of(self, h: dict[str, Any]) -> int | None:
        """This rank's sequence number in a call or spawn header; None if it is not for this rank."""
        q = h["q"]
        if "rk" in h:
            return q if h["rk"] == self.rank else None
        idx = Slice.from_wire(h["sl"]).index_of(self.rank)
        if idx is None:
            return None
        return q if isinstance(q, int) else q[idx]

    def _deliver(self, msg: Message) -> None:
        """Hand a call or spawn to its actor, whose thread runs it in its sender's order."""
        h = msg.header
        if self.stopping:  # nothing new starts in a proc that is finalizing
            return
        m = h.get("m")  # casts name their mesh (relayed as signed, they could be replayed to another's procs);
        if m is not None and m != self.mesh_id:  # a direct call is bound to its inbox by its destination
            self.transport.stats.dropped_misaddressed += 1
            return
        seq = self.seq_of(h)
        if seq is None:
            return
        h["_q"] = seq
        actor_id = h["a"]
        if h["k"] == Kind.SPAWN or (h["k"] == Kind.SKIP and h.get("ck") == Kind.SPAWN and actor_id not in self.actors):
            host = self.actors[actor_id] = ActorHost(self, actor_id, h.get("n", actor_id))
            host.enqueue(msg)
            for sender, call_id in self._early_cancels.pop(actor_id, []):
                host.cancel(sender, call_id)
            for m in self._orphans.pop(actor_id, []):
                host.enqueue(m)
            return
        target = self.actors.get(actor_id)
        if target is None:  # a call that overtook its actor's spawn (another sender, another way)
            self._orphans.setdefault(actor_id, []).append(msg)
        else:
            target.enqueue(msg)

    def serve(self) -> None:
        """Receive on a thread of its own; the main thread runs the proc's first actor, once spawned."""
        self.transport.send(
            self.agent_addr,
            Message(
                {
                    "k": Kind.PROC_UP,
                    "m": self.mesh_id,
                    "rk": self.rank,
                    "addr": self.transport.address,
                    "pid": os.getpid(),
                }
            ),
        )
        threading.Thread(target=self._receive, name="recv", daemon=True).start()
        host = self._main_host.get()
        if host is not None:
            host._main()  # until the proc stops
        for other in list(self.actors.values()):  # the others clean up on their threads (a bounded wait)
            if other is not host and other.thread.is_alive():
                other.thread.join(5.0)
        # the receive thread (a daemon, frozen at exit) still holds this runtime: let go of the actors, so
        # their modules' globals are freed at interpreter exit (their __del__ runs, as in any program)
        for other in list(self.actors.values()):
            if other is host or not other.thread.is_alive():
                other.instance, other.endpoints = None, {}
        self.actors.clear()

    def _receive(self) -> None:
        self.transport.serve(self.handle)
        exit_proc(0)


def _watch_lifeline(fd: int) -> None:
    """The agent holds the write end; EOF means the agent (and so the controller) is gone."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    os._exit(70)


def main(cfg: dict[str, Any], key: bytes, lifeline_fd: int) -> int:
    """Entry point in a freshly forked child of the template. Returns (the exit code) only when the
    proc was stopped: the template then lets the interpreter exit the normal way (``atexit``,
    finalizers); every other end is ``os._exit``."""
    threading.Thread(target=_watch_lifeline, args=(lifeline_fd,), name="lifeline", daemon=True).start()
    os.environ.update(cfg.get("env") or {})
    if cfg.get("cwd"):
        try:
            os.chdir(cfg["cwd"])
        except OSError:
            pass
    for entry in cfg.get("path") or ():
        if entry not in sys.path:
            sys.path.append(entry)
    set_rank_env(cfg)
    cancel_signal.install()
    try:
        for mod in cfg.get("preload") or ():
            importlib.import_module(mod)
        runtime = ProcRuntime(cfg, key)
    except BaseException:  # noqa: BLE001 - the agent sees the exit code and this traceback
        traceback.print_exc()
        exit_proc(3)
    # SIGTERM (the agent's shutdown, ProcMesh.kill) stops the proc like STOP: finalized, if it is quick
    # about it, and then it dies of that SIGTERM (its rank's failure says so). The handler only starts a
    # thread: it runs on the main thread, maybe inside the runtime's own locks
    terminated = threading.Event()

    def on_sigterm(*_: Any) -> None:
        terminated.set()
        runtime.terminated = True
        # one thread, started last: the stop interrupts this (main) thread, maybe still in this handler.
        # A daemon: the interpreter's exit does not wait for it, and it runs beside the atexit handlers
        threading.Thread(target=_stop_for_sigterm, args=(runtime,), name="sigterm", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    atexit.register(_die_of_sigterm, terminated)  # registered first, so it runs after the user's handlers
    runtime.serve()
    return 0


def _stop_for_sigterm(runtime: ProcRuntime) -> None:
    runtime.stop()
    time.sleep(CUT_GRACE)  # the proc is dead by now, unless its exit handlers take long
    runtime.answer_cut()


def _die_of_sigterm(terminated: threading.Event) -> None:
    """Last of the atexit handlers (the user's ran): a proc that was sent SIGTERM dies of it."""
    if terminated.is_set():
        if "logging" in sys.modules:  # its own atexit handler, registered before ours, would not run
            sys.modules["logging"].shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
