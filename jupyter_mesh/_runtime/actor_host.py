"""One actor in a proc: its thread, its inbox and mailbox, the order of its senders' messages, how one
call runs. How a call is cancelled is in ``actor_cancels``; what ends the actor while its proc lives on
is in ``actor_end``; how it is numbered, in ``actor_ranks``.

An endpoint that raises answers its caller with the exception (``ActorError`` there) and the actor
lives on. What no caller can receive ends the actor as Monarch does, where the spawn asked for it
(``fatal``, the default outside the ``mesh`` kernel): an exception under ``broadcast()``, and a
``BaseException`` that is not our own cancellation (``SystemExit``, a custom ``BaseException``). The
actor then answers every later call with that failure (``SupervisionError`` there) and the failure is
reported to whoever spawned it (``ACTOR_FAULT``): that process's ``__supervise__`` or fault hook. A
failed ``__init__`` is reported the same way. Where the spawn did not ask (the kernel), such errors are
reported and the actor lives on.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import secrets
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from .._core.actor import Endpoint, endpoints_of
from .._core.context import context, message
from .._core.plain_methods import plain_endpoint
from .._core.ports import DroppingPort
from .._core.refs import ref_from_wire
from .._core.shape import Point
from .._wire.lane_merge import Inbox
from .._wire.protocol import BROKEN, DIRECT, NO_REPLY, OK, RAISED, STOP_ENDPOINT, Kind
from .._wire.serialize import UNPICKLABLE_HINT, dumps, loads
from .._wire.transport import Message, Transport
from ..errors import Failure, SerializationError, SupervisionError
from . import remote_pdb
from .actor_cancels import ActorCancels
from .actor_end import ActorEnds
from .actor_ranks import ActorRanks
from .client import set_current_client
from .descendants import Descendants, supervised
from .ports import ReplyPort
from .remote_errors import error_info, safe_str

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ActorHost", "ProcSide", "exit_proc"]


class ProcSide(Protocol):
    """What an actor needs of its proc's runtime (``proc.ProcRuntime``)."""

    transport: Transport
    client: Client
    mesh_id: str
    mesh_name: str
    rank: int
    coords: dict[str, int]
    point: Point
    agent_addr: str
    terminated: bool  # stopped by SIGTERM: it dies of it

    def hold_cut(self, answer: Callable[[], None]) -> None: ...

    def claim_main_thread(self, host: ActorHost) -> bool: ...
    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None: ...
    def seq_of(self, h: dict[str, Any]) -> int | None: ...


class ActorHost(ActorCancels, ActorEnds, ActorRanks):
    """One actor instance, its thread, its inbox and its mailbox."""

    runtime: ProcSide

    def __init__(self, runtime: ProcSide, actor_id: str, name: str):
        self.runtime, self.actor_id, self.name = runtime, actor_id, name
        self.instance: Any = None
        self.endpoints: dict[str, Endpoint[..., Any]] = {}
        self.failure: Failure | None = None  # the actor is gone (its __init__ raised, it died, it was
        # stopped): every call is answered with this
        self.spawner = ""  # who spawned it (the spawn's sender): it hears of the actor's failures
        self.cls_path = ""  # ``module.Class`` of the actor, for the failures that name it as Monarch does
        self.descendants = Descendants(name)  # the meshes it spawned: they end with it
        self.fatal = False  # the spawn asked that errors no caller receives end the actor (Monarch's way)
        self.closing = False  # the proc stops: the loop ends after the message it handles
        self.loop = asyncio.new_event_loop()
        # direct calls land in this inbox and wake the actor thread itself (a thread hop costs
        # 50-90 us on 2 cores); mail from the receive thread goes into a C-level queue, announced by
        # a doorbell frame on the same inbox, so the thread waits on one socket only. The bell
        # carries a secret: a one-frame message from the wire is not mistaken for one.
        inproc = f"inproc://actor-{actor_id}"
        self._inbox, self.address, self._lane = runtime.transport.bind_inbox_with_lane(inproc)
        # small calls from this host may come over the inbox's lane (no ZeroMQ I/O threads), the
        # others over its socket: ``_in_order`` puts one sender's calls in order whichever way each came
        self._reader = Inbox(self._inbox, self._lane)
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
        self._busy = False  # a call runs (a broadcast has no key in ``_current``)
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

    def close(self) -> None:
        """From the receive thread, the proc stopping: interrupt the call that runs (a broadcast's
        too), then end the loop."""
        with self._lock:
            self.closing = True
            if self._busy:
                self._interrupt()
        with self._bell_lock:
            self._bell.send(self._bell_token)

    def supervise(self, err: SupervisionError) -> None:
        """From the receive thread: a mesh this actor owns failed. An async endpoint awaiting now (on the
        actor's loop) does not hold ``__supervise__`` up: it runs beside it, as in Monarch (the endpoint
        may be waiting for exactly that); otherwise it comes in turn, like any message."""
        if self.loop.is_running():
            try:
                self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._supervise(err)))
                return
            except RuntimeError:  # the loop closed meanwhile
                pass
        self.enqueue(Message({"k": Kind.SUPERVISE}, err))  # type: ignore[arg-type]

    def own(self, kind: str, mesh: Any) -> None:
        """The actor spawned ``mesh`` (an actor mesh or a proc mesh): it ends with the actor."""
        self.descendants.own(kind, mesh)

    def enqueue(self, msg: Message) -> None:
        """From any other thread: hand the actor a message (in order) and wake it."""
        self._mailbox.put(msg)
        with self._bell_lock:
            self._bell.send(self._bell_token)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        context().actor.proc, context().actor.host = self.runtime, self
        set_current_client(self.runtime.client)
        while not self.closing:
            try:
                if self.cleanup_due is not None or self.stop_due:  # it died of (or stopped in) the last message
                    self._end_after_message()
                if not self._serve_one():
                    break  # the proc is going away
            except BaseException:  # noqa: BLE001 - a bug here must not silently stop the actor
                print(f"[{self.name}] internal error while receiving:\n{traceback.format_exc()}", file=sys.stderr)
        if self.closing:
            self._construct_before_stop()
            if self.instance is not None and (self.failure is None or self.cleanup_due is not None):
                self._clean_up(self.cleanup_due)  # its proc stops: the actor stops too (tasks cancelled, __cleanup__)
            # closed here, not by the garbage collector at exit, which may close its self-pipe first
            # ("Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor: -1")
            self.loop.close()

    def _construct_before_stop(self) -> None:
        """The proc stops: a constructor already delivered still runs (Monarch, too, lets pending
        spawns finish before a stop), so a failing one is reported; the calls behind it do not run."""
        if self.instance is not None or self.failure is not None:
            return
        while True:
            try:
                mail = self._mailbox.get_nowait()
            except queue.Empty:
                return
            if mail.header.get("k") == Kind.SPAWN:
                self._run(mail)
                return

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
            frames = self._reader.recv()
        except zmq.ZMQError:
            return False
        if len(frames) == 1:
            if frames[0] != self._bell_token:
                self.runtime.transport.stats.dropped_malformed += 1
                return True
            while not self.closing:  # one ring may announce several messages (and later rings none)
                try:
                    mail = self._mailbox.get_nowait()
                except queue.Empty:
                    return True
                self._in_order(mail, mail.header.get("_q"))
            return False
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
        return self._reader.pending()

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
            if seq < st[0]:  # its number was taken (a skip that came first: the caller was told it is lost)
                return
            held = st[1].get(seq)
            if held is None or held.header["k"] == Kind.SKIP:  # the message itself wins over a skip of it
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
                self.failure = self._failure(
                    "init",
                    f"{self.name} was never created on this proc (its spawn could not be relayed); "
                    "spawn the actor mesh again",
                )
            h = msg.header
            if h.get("lost") and h.get("rm") == DIRECT and h.get("i"):  # from the caller: an agent relaying
                f = Failure(self.runtime.mesh_name, self.runtime.coords, "relay", str(h["lost"]))  # it was lost
                self.runtime.reply(h, BROKEN, dumps(f)[0], [])
        elif k == "supervise":
            self._used_loop = True
            self.loop.run_until_complete(self._supervise(msg.payload))  # type: ignore[arg-type]
        elif msg.header["ep"] == STOP_ENDPOINT:
            self._stop(msg.header)
        else:
            ep = self.endpoints.get(msg.header["ep"])
            if ep is None and msg.header.get("plain"):  # a plain method, called through as_endpoint()
                ep = plain_endpoint(type(self.instance), msg.header["ep"], msg.header["plain"] == 2)
            if ep is not None and ep.concurrent:  # a task beside the next messages (``_run_tasks_until_mail``)
                self._used_loop = True
                self.loop.create_task(self._call_concurrently(msg, ep))
            elif ep is not None and ep.is_async:
                self._used_loop = True
                self.loop.run_until_complete(self._call(msg, ep))
            else:
                self._call_sync(msg, ep)

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
        if self._lane is not None:
            self.loop.add_reader(self._lane.fd, readable)
        try:
            readable()  # mail that came before the reader was armed raises no new edge
            await waiter
        finally:
            self.loop.remove_reader(fd)
            if self._lane is not None:
                self.loop.remove_reader(self._lane.fd)

    async def _supervise(self, err: SupervisionError) -> None:
        """A mesh this actor spawned lost ranks: ask ``__supervise__``; unhandled means this actor fails
        (``_fail_unsupervised``), as in Monarch: its proc and the other actors there live on, and its
        own supervisor (the owner of its mesh, else the fault hook) hears of it.
        """
        if self.failure is not None:  # this actor is gone (stopped, dead): what it owned is not its care
            print(f"[{self.name}] a mesh it spawned failed after it ended:\n{err}", file=sys.stderr)
            return
        outcome = await supervised(self.name, self.instance, err)
        if outcome is not True:
            self._fail_unsupervised(err, outcome if isinstance(outcome, BaseException) else None)

    def _spawn(self, msg: Message) -> None:
        rt = self.runtime
        self.spawner, self.fatal = msg.header["s"], bool(msg.header.get("fa"))
        self.proc_ref = ref_from_wire(msg.header.get("pmesh"))
        try:
            cls, args, kwargs = loads(msg.payload, msg.buffers)
            self.cls_path = f"{cls.__module__}.{cls.__qualname__}"
            self.endpoints = endpoints_of(cls)
            self.spawned_on(msg.header)
            self.constructing = True
            try:
                self.instance = cls(*args, **kwargs)
            finally:
                self.constructing = False
        except BaseException as e:  # noqa: BLE001 - reported to the caller, the proc lives on
            info = error_info(e, "__init__", skip_frames=1)
            self.failure = self._failure("init", f"{self.name}: __init__ raised {info['type']}: {info['msg']}", info)
        if self.failure is not None:  # __init__ raised, or aborted (``context().actor_instance.kill()``)
            rt.reply(msg.header, BROKEN, dumps(self.failure)[0], [])
            self._report(self.failure, told=False)  # a spawn's future is rarely waited on: its owner must hear
            if self.instance is not None:
                self._cleanup_after(self.failure)  # (it was built: ``__cleanup__(exc)``, as any death)
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
        if self.failure is not None:
            self.runtime.reply(h, BROKEN, dumps(self.failure)[0], [])
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
            if self.closing:  # the proc stops: nothing more starts
                raise asyncio.CancelledError(f"{h['ep']} did not start: the proc is stopping")
            self._current = key if h["i"] else None
            self._busy = True

    def _leave(self) -> bool:
        """The call ended; True if a cancel was aimed at it (what it raised then is our interrupt)."""
        with self._lock:
            stopped = self._stopping if self._stopping == self._current else None
            self._current, self._task, self._stopping, self._busy = None, None, None, False
            if self._interrupted:  # drop a KeyboardInterrupt that arrived too late
                self._interrupted = False  # (a late cancel signal finds this False and does nothing)
                if not self.on_main:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread.ident or 0), None)
        if stopped is not None:
            self._ack_cancel(stopped)
        return stopped is not None

    async def _call(self, msg: Message, ep: Endpoint[..., Any]) -> None:
        """Run one call of an async endpoint and reply (``_call_sync`` for the others)."""
        h = msg.header
        if not self._begin(h):
            return
        ours = True  # what is raised before the endpoint runs (unpickling, a cancel while queued) is ours
        port: ReplyPort | None = None
        try:
            # arguments first: unpickling may import modules (torch), which a cancel must not cut
            args, kwargs = loads(msg.payload, msg.buffers)
            if ep.explicit_port:
                args, port = self._with_port(h, args)
            self._enter(h)
            ours = False
            message.set(h)  # in this task's context, which the endpoint's task copies
            try:
                self._task = self.loop.create_task(ep.fn(self.instance, *args, **kwargs))
                result = await self._task
            finally:
                ours = self._leave() or self.closing  # cancelled, or interrupted by the proc's stop
        except BaseException as e:  # noqa: BLE001 - an endpoint's error is its caller's, not the proc's
            self._call_failed(h, e, ours, port)
            return
        if not ep.explicit_port:
            self._respond(h, result)

    def _call_sync(self, msg: Message, ep: Endpoint[..., Any] | None) -> None:
        """:meth:`_call` for a sync endpoint (or none by that name): the same steps, run on this thread
        with no coroutine to drive (the latency path)."""
        h = msg.header
        if not self._begin(h):
            return
        ours = True
        port: ReplyPort | None = None
        try:
            args, kwargs = loads(msg.payload, msg.buffers)
            if ep is not None and ep.explicit_port:
                args, port = self._with_port(h, args)
            self._enter(h)
            ours = False
            token = message.set(h)  # what current_rank() numbers the actor in (``actor_ranks``)
            try:
                if ep is None:
                    raise AttributeError(f"{type(self.instance).__qualname__} has no endpoint '{h['ep']}'")
                result = ep.fn(self.instance, *args, **kwargs)
            finally:
                message.reset(token)
                ours = self._leave() or self.closing
        except BaseException as e:  # noqa: BLE001 - an endpoint's error is its caller's, not the proc's
            self._call_failed(h, e, ours, port)
            return
        if ep is None or not ep.explicit_port:
            self._respond(h, result)

    def _call_failed(self, h: dict[str, Any], e: BaseException, ours: bool, port: ReplyPort | None) -> None:
        """A call raised ``e`` (``ours``: before its endpoint ran, or our cancel / the proc's stop).

        A call cut by SIGTERM (its agent going: scancel, a listener stopped; ``ProcMesh.kill``) is not
        answered with the interrupt: the proc dies of that signal and the caller hears why from the
        rank's failure (the agent's "it is exiting: it got SIGTERM", or the proc's exit). An answer
        here would race that report on another socket and, arriving first, tell of a
        KeyboardInterrupt on a live actor (``ProcSide.hold_cut``)."""
        if ours and self.closing and self.runtime.terminated:
            self._cut_by_sigterm(h)
            return
        if not ours:
            remote_pdb.post_mortem(e)  # only if asked (``jupyter_mesh.debug.post_mortem``)
        if self.fatal and not ours and not isinstance(e, Exception):
            self._die(h, e, "(a BaseException ends the actor)")
        elif h["rm"] != NO_REPLY or not ours:  # a broadcast cut by a cancel or a stop: no error of its own
            self._respond_error(h, e, port)

    # -- Monarch's explicit response ports and concurrent endpoints --------------------------------
    def _with_port(self, h: dict[str, Any], args: tuple[Any, ...]) -> tuple[tuple[Any, ...], ReplyPort | None]:
        """An explicit-response-port endpoint's arguments: its reply port first (one that drops what it
        is sent when nobody waits for the reply)."""
        if h["rm"] == NO_REPLY:
            return (DroppingPort(), *args), None
        port, entry = ReplyPort.open(self.runtime.client.ports, self.runtime.reply, h)
        return (port, *args), entry

    async def _call_concurrently(self, msg: Message, ep: Endpoint[..., Any]) -> None:
        """A ``concurrent_endpoint`` call: a task of its own, so no cancel bookkeeping of the current call."""
        h = msg.header
        if not self._begin(h):
            return
        port: ReplyPort | None = None
        try:
            args, kwargs = loads(msg.payload, msg.buffers)
            if ep.explicit_port:
                args, port = self._with_port(h, args)
            message.set(h)  # this call's own task
            result = await ep.fn(self.instance, *args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - an endpoint's error is its caller's, not the proc's
            if self.closing and self.runtime.terminated:  # cut by SIGTERM, as in ``_call_failed``
                self._cut_by_sigterm(h)
            else:
                self._respond_error(h, e, port)
            return
        if not ep.explicit_port:
            self._respond(h, result)

    def _respond_error(self, h: dict[str, Any], e: BaseException, port: ReplyPort | None = None) -> None:
        method = h["ep"]
        if port is not None and port.used:  # the reply went out already: the error can only be told here
            print(f"[{self.name}.{method}] raised after replying:\n" + error_info(e, method)["tb"], file=sys.stderr)
            return
        if port is not None and self.fatal:  # it answers through its port, not by raising: as in Monarch, an
            self._die(h, e, "instead of answering through its response port")  # error there ends the actor
            return
        if h["rm"] != NO_REPLY:
            self.runtime.reply(h, RAISED, dumps(error_info(e, method))[0], [])
        elif self.fatal:
            self._die(h, e, "under broadcast(), where no caller can receive it, so the actor died")
        else:  # the kernel's way: the actor lives on; its traceback shows in the cell that broadcast
            info = error_info(e, method)
            print(f"[{self.name}.{method}] broadcast raised:\n" + info["tb"], file=sys.stderr)
            detail = f"{self.name}.{method} raised {info['type']}: {info['msg']} under broadcast() (the actor lives on)"
            self._report(self._failure("broadcast", detail, info), told=False)

    def _respond(self, h: dict[str, Any], result: Any) -> None:
        if h["rm"] == NO_REPLY:
            return
        if self.unsupervised:  # it failed during this call (a failure of a mesh it owns went unhandled,
            # seen beside an awaiting endpoint): the caller gets that, as in Monarch, not a result
            self.runtime.reply(h, BROKEN, dumps(self.failure)[0], [])
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


def exit_proc(code: int) -> None:
    """End this proc now, its output flushed (no interpreter finalization: for failures)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
