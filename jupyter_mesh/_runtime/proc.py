"""The proc: one worker process of a proc mesh, hosting one actor of each actor mesh spawned on it.

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

import asyncio
import ctypes
import importlib
import inspect
import os
import queue
import secrets
import signal
import sys
import threading
import traceback
from collections.abc import Coroutine
from typing import Any

import zmq

from .._core.actor import Endpoint, endpoints_of
from .._core.context import ProcIdentity, context
from .._core.shape import Point, Shape, Slice
from .._data import ucx as _ucx
from .._data.owner import handle_message as handle_rdma
from .._wire.channels import CurveKeys
from .._wire.protocol import BROKEN, DIRECT, NO_REPLY, OK, OUT_SYNC_PREFIX, RAISED, Dispatch, Kind, reply_header
from .._wire.serialize import UNPICKLABLE_HINT, dumps, loads
from .._wire.transport import Message, Transport
from ..errors import Failure, SerializationError, SupervisionError
from . import cancel_signal, interrupts
from .client import Client, set_current_client
from .hooks import Embedding, embed
from .rank_env import set_rank_env
from .remote_errors import error_info, safe_str
from .stacks import thread_stacks

__all__ = ["ProcRuntime", "live_actor", "main"]

_runtime: ProcRuntime | None = None  # this proc's, once it runs


def live_actor(actor_id: str) -> ActorHost:
    """The actor ``actor_id`` of this proc (``KeyError`` if there is none): for code that must touch
    a live actor from beside it, like the notebook's ``%mesh reload``."""
    if _runtime is None:
        raise KeyError(actor_id)
    return _runtime.actors[actor_id]


class ActorHost:
    """One actor instance, its thread, its inbox and its mailbox."""

    def __init__(self, runtime: ProcRuntime, actor_id: str, name: str):
        self.runtime, self.actor_id, self.name = runtime, actor_id, name
        self.instance: Any = None
        self.endpoints: dict[str, Endpoint[..., Any]] = {}
        self.init_failure: Failure | None = None
        self.loop = asyncio.new_event_loop()
        # direct calls land in this inbox and wake the actor thread itself (a thread hop costs
        # 50-90 us on 2 cores); mail from the receive thread goes into a C-level queue, announced by
        # a doorbell frame on the same inbox, so the thread waits on one socket only. The bell
        # carries a secret: a one-frame message from the wire is not mistaken for one.
        inproc = f"inproc://actor-{actor_id}"
        self._inbox, self.address = runtime.transport.bind_inbox(inproc)
        self._bell = runtime.transport.doorbell(inproc)
        self._bell_token = secrets.token_bytes(16)
        self._bell_lock = threading.Lock()
        self._mailbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        # (sender's reply address, its epoch) -> [next seq, {seq: message}]: a controller that takes a kept
        # job over may get an address an old one had, and starts its sequence afresh
        self._order: dict[tuple[str, str], list[Any]] = {}
        # cancellation: which call runs now, and calls cancelled before they started
        self._lock = threading.Lock()
        self._current: tuple[str, int] | None = None
        self._stopping: tuple[str, int] | None = None  # the running call a cancel was aimed at
        self._task: asyncio.Task[Any] | None = None
        self._cancelled: set[tuple[str, int]] = set()
        self._started: dict[str, int] = {}  # sender -> id of its last call that started here
        self._interrupted = False  # an async KeyboardInterrupt was aimed at this thread
        self._used_loop = False  # only then can tasks be left running between messages
        # the proc's first actor runs on its main thread, where signals are handled: a cancel then
        # interrupts even a blocking call (sleep, select, socket, lock waits) — see ``cancel``
        self.on_main = runtime.claim_main_thread(self)
        if self.on_main:
            self.thread = threading.main_thread()
        else:
            self.thread = threading.Thread(target=self._main, name=f"actor-{name}", daemon=True)
            self.thread.start()

    def cancel(self, sender: str, call_id: int) -> None:
        """From the receive thread: stop call ``(sender, call_id)`` if it runs, skip it if queued."""
        key = (sender, call_id)
        with self._lock:
            if self._current != key:
                # a sender's call ids grow in the order its calls run here: at or below the last one
                # started, this call already ran (its cancel came late), so there is nothing to skip
                if call_id > self._started.get(sender, 0):
                    self._cancelled.add(key)  # skipped when it comes up: nothing of it will run
                done = True
            else:
                done = False
                self._stopping = key  # acknowledged when it ends (``_leave``)
                if self._task is not None:
                    self.loop.call_soon_threadsafe(self._task.cancel)
                elif self.on_main:  # a sync endpoint on the main thread: a signal ends even a blocking call
                    self._interrupted = True
                    signal.pthread_kill(self.thread.ident or 0, cancel_signal.CANCEL_SIGNAL)
                else:  # a sync endpoint on its own thread: KeyboardInterrupt at its next Python instruction
                    self._interrupted = True
                    self._raise_in_thread()
        if done:
            self._ack_cancel(key)

    def _raise_in_thread(self) -> None:
        """KeyboardInterrupt in this actor's own thread, unless it is in a critical stretch of the
        runtime or inside an import right now: then a moment later (caller holds ``_lock``)."""
        ident = self.thread.ident or 0
        if not self._interrupted:
            return
        if interrupts.held_by(ident) or cancel_signal.importing(sys._current_frames().get(ident)):
            cancel_signal.retry_later(self._retry_raise)
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))

    def _retry_raise(self) -> None:
        with self._lock:
            self._raise_in_thread()

    def enqueue(self, msg: Message) -> None:
        """From any other thread: hand the actor a message (in order) and wake it."""
        self._mailbox.put(msg)
        with self._bell_lock:
            self._bell.send(self._bell_token)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        context().actor.proc, context().actor.host = self.runtime, self
        set_current_client(self.runtime.client)
        while True:
            try:
                if not self._serve_one():
                    return  # the proc is going away
            except BaseException:  # noqa: BLE001 - a bug here must not silently stop the actor
                print(f"[{self.name}] internal error while receiving:\n{traceback.format_exc()}", file=sys.stderr)

    def _serve_one(self) -> bool:
        """Wait for the next message (running leftover tasks meanwhile) and handle it."""
        # tasks can be alive only if the loop ever ran, or a task was just created (it is then
        # ready to run); checking that first spares asyncio.all_tasks (~2 us) on every message
        if (
            (self._used_loop or self.loop._ready)  # type: ignore[attr-defined]
            and not self._has_mail()
            and any(not t.done() for t in asyncio.all_tasks(self.loop))
        ):
            self._used_loop = True
            self.loop.run_until_complete(self._run_tasks_until_mail())
        try:
            frames = Transport.recv_frames(self._inbox)
        except zmq.ZMQError:
            return False
        if len(frames) == 1:
            if frames[0] != self._bell_token:
                self.runtime.transport.stats.dropped_malformed += 1
                return True
            while True:  # one ring may announce several messages (and later rings none)
                try:
                    mail = self._mailbox.get_nowait()
                except queue.Empty:
                    return True
                self._in_order(mail, mail.header.get("_q"))
        msg = self.runtime.transport.decode(frames, self.address)
        if msg is None:
            return True
        h = msg.header
        if h.get("k") != "c" or h.get("a") != self.actor_id:
            self.runtime.transport.stats.dropped_malformed += 1
            return True
        seq = self.runtime.seq_of(h)
        if seq is not None:
            self._in_order(msg, seq)
        return True

    def _has_mail(self) -> bool:
        events: int = self._inbox.getsockopt(zmq.EVENTS)  # type: ignore[assignment]
        return bool(events & zmq.POLLIN)

    def _in_order(self, msg: Message, seq: int | None) -> None:
        """Run ``msg`` when it is its sender's next; run the ones it was holding up after it."""
        if seq is None:  # local mail (supervision events) carries no sequence number
            self._run(msg)
            return
        sender = (msg.header["s"], msg.header.get("oe") or msg.header.get("se", ""))  # "oe": a skip's caller
        st = self._order.get(sender)
        if st is None:
            st = self._order[sender] = [0, {}]
        if seq != st[0]:
            st[1][seq] = msg
            return
        while msg is not None:
            st[0] += 1
            self._run(msg)
            msg = st[1].pop(st[0], None)

    def _run(self, msg: Message) -> None:
        try:
            self._handle(msg)
        except BaseException as e:  # noqa: BLE001 - the actor must outlive any one message
            self._last_resort(msg.header, e)

    def _handle(self, msg: Message) -> None:
        k = msg.header["k"]
        if k == Kind.SPAWN:
            self._spawn(msg)
        elif k == Kind.SKIP:  # a message the agent could not relay: its number is released, nothing runs
            if msg.header.get("ck") == Kind.SPAWN:  # and this actor never came to be: say so to its callers
                self.init_failure = Failure(
                    self.name,
                    self.runtime.coords,
                    "init",
                    f"{self.name} was never created on this proc (its spawn could not be relayed); "
                    "spawn the actor mesh again",
                )
        elif k == "supervise":
            self._used_loop = True
            self.loop.run_until_complete(self._supervise(msg.payload))  # type: ignore[arg-type]
        else:
            ep = self.endpoints.get(msg.header["ep"])
            if ep is not None and ep.is_async:
                self._used_loop = True
                self.loop.run_until_complete(self._call(msg, ep))
            else:
                _run_now(self._call(msg, ep))

    def _last_resort(self, h: dict[str, Any], e: BaseException) -> None:
        """Replying itself failed (a broken exception, a full /dev/shm...): release the caller with a
        plain-text error so nothing waits forever, and keep the actor serving."""
        print(f"[{self.name}] could not reply to {h.get('ep', h.get('k'))}: {safe_str(e)}", file=sys.stderr)
        if h.get("k") not in ("c", "spawn") or not h.get("i"):
            return
        info = {"type": type(e).__qualname__, "msg": safe_str(e), "tb": "", "exc": None, "endpoint": h.get("ep", "")}
        try:
            self.runtime.reply(h, RAISED, dumps(info)[0], [])
        except BaseException:  # noqa: BLE001 - nothing more can be done from here
            pass

    async def _run_tasks_until_mail(self) -> None:
        """Tasks an async endpoint left running keep running while the actor waits for mail."""
        waiter: asyncio.Future[None] = self.loop.create_future()

        def readable() -> None:  # ZeroMQ's descriptor is edge-triggered: ask the socket itself
            if not waiter.done() and self._has_mail():
                waiter.set_result(None)

        fd = int(self._inbox.getsockopt(zmq.FD))  # type: ignore[arg-type]
        self.loop.add_reader(fd, readable)
        try:
            readable()  # mail that came before the reader was armed raises no new edge
            await waiter
        finally:
            self.loop.remove_reader(fd)

    async def _supervise(self, err: SupervisionError) -> None:
        """A mesh this actor spawned lost ranks: ask ``__supervise__``; unhandled means this proc fails.

        Our unit of failure is the proc, so escalation is the proc exiting: its own supervisor (the
        controller, or the actor that owns *its* mesh) then sees the failure, with this message as
        the proc's last output.
        """
        hook = getattr(self.instance, "__supervise__", None)
        for failure in err.failures:
            handled = False
            if hook is not None:
                try:
                    handled = hook(failure)
                    if inspect.isawaitable(handled):
                        handled = await handled
                except BaseException as e:  # noqa: BLE001 - a raising supervisor did not handle it
                    print(
                        f"[{self.name}] __supervise__ raised:\n" + error_info(e, "__supervise__")["tb"],
                        file=sys.stderr,
                    )
                    handled = False
            if not handled:
                print(f"[{self.name}] unhandled failure of a mesh it owns, so this proc fails:\n{err}", file=sys.stderr)
                _exit(75)

    def _spawn(self, msg: Message) -> None:
        rt = self.runtime
        try:
            cls, args, kwargs = loads(msg.payload, msg.buffers)
            self.endpoints = endpoints_of(cls)
            self.instance = cls(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, the proc lives on
            info = error_info(e, "__init__", skip_frames=1)
            self.init_failure = Failure(
                self.name, rt.coords, "init", f"{self.name}: __init__ raised {info['type']}: {info['msg']}", info["tb"]
            )
            rt.reply(msg.header, BROKEN, dumps(self.init_failure)[0], [])
            return
        # callers and the agent send this actor's calls straight to its inbox from now on
        up = {  # the agent's liveness checks look at this thread when the proc stops answering
            "k": Kind.ACTOR_UP,
            "a": self.actor_id,
            "pa": rt.transport.address,
            "addr": self.address,
            "tid": threading.get_native_id(),
        }
        rt.transport.send(rt.agent_addr, Message(up))
        rt.reply(msg.header, OK, dumps((rt.transport.address, self.address))[0], [])

    def _begin(self, h: dict[str, Any]) -> bool:
        """Before an endpoint runs: False (and the reply sent) if the actor is broken."""
        if self.init_failure is not None:
            self.runtime.reply(h, BROKEN, dumps(self.init_failure)[0], [])
            return False
        return True

    def _enter(self, h: dict[str, Any]) -> None:
        """Mark the call as running (so a cancel can reach it), unless it was cancelled while queued."""
        key = (h["s"], h["i"])
        with self._lock:
            if h["i"]:
                self._started[h["s"]] = h["i"]
            if self._cancelled and key in self._cancelled:
                self._cancelled.discard(key)
                raise asyncio.CancelledError(f"{h['ep']} was cancelled before it started")
            self._current = key if h["i"] else None

    def _ack_cancel(self, key: tuple[str, int]) -> None:
        """Tell the canceller that this rank no longer works on its call (it waits to report that)."""
        try:
            self.runtime.transport.send(key[0], Message({"k": Kind.CANCELLED, "i": key[1], "rk": self.runtime.rank}))
        except Exception:  # noqa: BLE001 - the canceller is gone: nobody to tell
            pass

    def _leave(self) -> None:
        with self._lock:
            stopped = self._stopping if self._stopping == self._current else None
            self._current, self._task, self._stopping = None, None, None
            if self._interrupted:  # drop a KeyboardInterrupt that arrived too late
                self._interrupted = False  # (a late cancel signal finds this False and does nothing)
                if not self.on_main:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread.ident or 0), None)
        if stopped is not None:
            self._ack_cancel(stopped)

    async def _call(self, msg: Message, ep: Endpoint[..., Any] | None) -> None:
        """Run one call and reply. For a sync endpoint this coroutine never suspends, so the actor
        thread drives it by hand (``_run_now``) without an event-loop turn."""
        h = msg.header
        if not self._begin(h):
            return
        try:
            # arguments first: unpickling may import modules (torch), which a cancel must not cut
            args, kwargs = loads(msg.payload, msg.buffers)
            self._enter(h)
            try:
                if ep is None:
                    raise AttributeError(f"{type(self.instance).__qualname__} has no endpoint '{h['ep']}'")
                if ep.is_async:
                    self._task = self.loop.create_task(ep.fn(self.instance, *args, **kwargs))
                    result = await self._task
                else:
                    result = ep.fn(self.instance, *args, **kwargs)
            finally:
                self._leave()
        except BaseException as e:  # noqa: BLE001 - a raising endpoint must not kill the actor
            self._respond_error(h, e)
            return
        self._respond(h, result)

    def _respond_error(self, h: dict[str, Any], e: BaseException) -> None:
        method = h["ep"]
        if h["rm"] == NO_REPLY:
            print(f"[{self.name}.{method}] broadcast raised:\n" + error_info(e, method)["tb"], file=sys.stderr)
            return
        self.runtime.reply(h, RAISED, dumps(error_info(e, method))[0], [])

    def _respond(self, h: dict[str, Any], result: Any) -> None:
        if h["rm"] == NO_REPLY:
            return
        try:
            payload, bufs = dumps(result)
        except SerializationError as e:
            err = SerializationError(
                f"{type(self.instance).__qualname__}.{h['ep']} ran, but its return value "
                f"({type(result).__name__}) does not pickle ({e.__cause__ or e}). {UNPICKLABLE_HINT}"
            )
            self.runtime.reply(h, RAISED, dumps(error_info(err, h["ep"], 0))[0], [])
            return
        self.runtime.reply(h, OK, payload, bufs)


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
        self.client = Client(self.transport)
        set_current_client(self.client)
        # an actor here may spawn meshes of its own: the controller made for that shares our runtime,
        # and gets (as the fallback of our table) the kinds only a controller handles
        self.dispatch = self._table()
        embed(
            Embedding(
                key,
                self.transport,
                self.client,
                self._route_to_controller,
                lambda: context().actor.host,
                self._supervise,
            )
        )
        context().identity = ProcIdentity(self.mesh_id, self.mesh_name, tuple(self.coords.items()), self.rank)
        self.actors: dict[str, ActorHost] = {}
        self._orphans: dict[str, list[Message]] = {}  # calls that overtook their actor's spawn
        self._main_host: queue.SimpleQueue[ActorHost] = queue.SimpleQueue()
        self._main_claimed = False

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
        host.enqueue(Message({"k": Kind.SUPERVISE}, err))  # type: ignore[arg-type]

    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None:
        rm = h["rm"]
        if rm == NO_REPLY:
            return
        hdr = reply_header(h["i"], ok, self.rank)
        if rm == DIRECT:  # to the caller's reply box if it has one (``replies``), else to its inbox
            self.transport.send(h.get("rt") or h["s"], Message(hdr, payload, bufs), local=bool(h.get("l")))
        else:
            hdr["to"] = h["s"]
            self.transport.send(self.agent_addr, Message(hdr, payload, bufs))

    def _table(self) -> Dispatch:
        return Dispatch(
            f"proc {self.rank} of {self.mesh_name}",
            {
                Kind.CALL: lambda msg, _: self._deliver(msg),
                Kind.SPAWN: lambda msg, _: self._deliver(msg),
                Kind.SKIP: lambda msg, _: self._deliver(msg),
                Kind.REPLY: lambda msg, _: self.client.on_reply(msg),
                Kind.GATHERED: lambda msg, _: self.client.on_reply(msg),
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
                Kind.STOP: lambda msg, _: _exit(0),
                Kind.OUT_SYNC: lambda msg, _: print_sync_marker(msg.header["t"]),
            },
        )

    def handle(self, msg: Message, frames: list[Any]) -> None:
        self.dispatch(msg, frames)

    def _on_notice(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        if h["what"] == "failed":
            self.client.mark_failed({h["rk"]: loads(msg.payload, msg.buffers)}, h["m"])
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
        self._main_host.get()._main()

    def _receive(self) -> None:
        self.transport.serve(self.handle)
        _exit(0)


def _run_now(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends to its end, on this thread, without an event loop."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a sync endpoint's call suspended; it must not await")


def _exit(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _watch_lifeline(fd: int) -> None:
    """The agent holds the write end; EOF means the agent (and so the controller) is gone."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    os._exit(70)


def main(cfg: dict[str, Any], key: bytes, lifeline_fd: int) -> None:
    """Entry point in a freshly forked child of the template. Never returns."""
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
        _exit(3)
    runtime.serve()
    _exit(0)
