"""The proc: one worker process of a proc mesh, hosting one actor of each actor mesh spawned on it.

Threads: the main thread receives (``Transport.serve``), restores per-sender order and hands each
message to its actor; every actor has its own thread running an asyncio loop, so a sync endpoint that
blocks (even on ``.get()`` of a call to another actor) blocks only that actor, and ``async def``
endpoints run on a real loop. Results are sent straight from the actor's thread.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import threading
import traceback
from typing import Any

from .. import _rdma_owner as _rdma
from .._actor import EndpointDef, _set_context, endpoints_of
from .._serialize import dumps, loads
from .._shape import Point, Shape, Slice
from .._transport import Message, Transport
from ..errors import Failure, SerializationError
from .client import BROKEN, DIRECT, NO_REPLY, OK, RAISED, Client, set_current_client

__all__ = ["ProcRuntime", "main"]


def _error_info(e: BaseException, endpoint: str, skip_frames: int = 1) -> dict[str, Any]:
    tb = e.__traceback__
    for _ in range(skip_frames):  # start the traceback at the user's code, not our dispatcher
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(e), e, tb))
    try:
        exc_bytes: bytes | None = dumps(e)[0]
    except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
        exc_bytes = None
    return {"type": type(e).__qualname__, "msg": str(e), "tb": text, "exc": exc_bytes, "endpoint": endpoint}


class ActorHost:
    """One actor instance, its thread and its mailbox."""

    def __init__(self, runtime: ProcRuntime, actor_id: str, name: str):
        self.runtime, self.actor_id, self.name = runtime, actor_id, name
        self.instance: Any = None
        self.endpoints: dict[str, EndpointDef[Any]] = {}
        self.init_failure: Failure | None = None
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.thread = threading.Thread(target=self._main, name=f"actor-{name}", daemon=True)
        self.thread.start()

    def enqueue(self, msg: Message) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, msg)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        _set_context(self.runtime.point, self.name)
        set_current_client(self.runtime.client)
        self.loop.run_until_complete(self._consume())

    async def _consume(self) -> None:
        while True:
            msg = await self.queue.get()
            if msg.header["k"] == "spawn":
                self._spawn(msg)
            else:
                await self._call(msg)

    def _spawn(self, msg: Message) -> None:
        rt = self.runtime
        try:
            cls, args, kwargs = loads(msg.payload, msg.buffers)
            self.endpoints = endpoints_of(cls)
            self.instance = cls(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, the proc lives on
            info = _error_info(e, "__init__", skip_frames=1)
            self.init_failure = Failure(
                self.name, rt.coords, "init", f"{self.name}: __init__ raised {info['type']}: {info['msg']}", info["tb"]
            )
            rt.reply(msg.header, BROKEN, dumps(self.init_failure)[0], [])
            return
        rt.reply(msg.header, OK, dumps(None)[0], [])

    async def _call(self, msg: Message) -> None:
        rt, h = self.runtime, msg.header
        method = h["m"]
        if self.init_failure is not None:
            rt.reply(h, BROKEN, dumps(self.init_failure)[0], [])
            return
        try:
            args, kwargs = loads(msg.payload, msg.buffers)
            ep = self.endpoints.get(method)
            if ep is None:
                raise AttributeError(f"{type(self.instance).__qualname__} has no endpoint '{method}'")
            if ep.is_async:
                result = await ep.fn(self.instance, *args, **kwargs)
            else:
                result = ep.fn(self.instance, *args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - a raising endpoint must not kill the actor
            if h["rm"] == NO_REPLY:
                print(f"[{self.name}.{method}] broadcast raised:\n" + _error_info(e, method)["tb"], file=sys.stderr)
                return
            rt.reply(h, RAISED, dumps(_error_info(e, method))[0], [])
            return
        if h["rm"] == NO_REPLY:
            return
        try:
            payload, bufs = dumps(result)
        except SerializationError as e:
            rt.reply(h, RAISED, dumps(_error_info(SerializationError(f"the return value of {method} does not pickle: {e}"), method, 0))[0], [])
            return
        rt.reply(h, OK, payload, bufs)


class ProcRuntime:
    """Receive loop, per-sender ordering and actor registry of one proc."""

    def __init__(self, cfg: dict[str, Any], key: bytes):
        self.rank: int = cfg["rank"]
        self.mesh_id: str = cfg["mesh_id"]
        self.mesh_name: str = cfg["mesh_name"]
        self.shape = Shape.from_wire(cfg["shape"])
        self.point = Point(self.rank, self.shape.extent)
        self.coords = dict(self.point)
        self.agent_addr: str = cfg["agent"]
        self.transport = Transport(key, cfg.get("bind", "tcp://127.0.0.1"))
        self.client = Client(self.transport)
        set_current_client(self.client)
        _rdma.set_identity(self.mesh_id, self.mesh_name, self.coords, self.rank)
        self.actors: dict[str, ActorHost] = {}
        self._order: dict[tuple[str, str], list[Any]] = {}  # (sender, actor) -> [next seq, {seq: msg}]
        self._orphans: dict[str, list[Message]] = {}  # calls that overtook their actor's spawn

    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None:
        rm = h["rm"]
        if rm == NO_REPLY:
            return
        hdr = {"k": "r", "i": h["i"], "rk": self.rank, "ok": ok}
        if rm == DIRECT:
            self.transport.send(h["s"], Message(hdr, payload, bufs), local=bool(h.get("l")))
        else:
            hdr["to"] = h["s"]
            self.transport.send(self.agent_addr, Message(hdr, payload, bufs))

    def handle(self, msg: Message, frames: list[Any]) -> None:
        k = msg.header["k"]
        if k == "c" or k == "spawn":
            self._order_and_deliver(msg)
        elif k == "r" or k == "g":
            self.client.on_reply(msg)
        elif k == "rdma":
            _rdma.handle_message(self.transport, msg)
        elif k == "stats":
            payload = dumps(vars(self.transport.stats))[0]
            self.transport.send(msg.header["s"], Message({"k": "r", "i": msg.header["i"], "ok": OK}, payload))
        elif k == "stop":
            _exit(0)

    def _order_and_deliver(self, msg: Message) -> None:
        h = msg.header
        q = h["q"]
        if "rk" in h:
            if h["rk"] != self.rank:
                return
            seq = q
        else:
            idx = Slice.from_wire(h["sl"]).index_of(self.rank)
            if idx is None:
                return
            seq = q if isinstance(q, int) else q[idx]
        key = (h["s"], h["a"])
        st = self._order.get(key)
        if st is None:
            st = self._order[key] = [0, {}]
        if seq != st[0]:
            st[1][seq] = msg
            return
        self._deliver(msg)
        st[0] += 1
        while st[1]:
            nxt = st[1].pop(st[0], None)
            if nxt is None:
                break
            self._deliver(nxt)
            st[0] += 1

    def _deliver(self, msg: Message) -> None:
        h = msg.header
        actor_id = h["a"]
        if h["k"] == "spawn":
            host = self.actors[actor_id] = ActorHost(self, actor_id, h["n"])
            host.enqueue(msg)
            for m in self._orphans.pop(actor_id, []):
                host.enqueue(m)
            return
        host = self.actors.get(actor_id)
        if host is None:
            self._orphans.setdefault(actor_id, []).append(msg)
        else:
            host.enqueue(msg)

    def serve(self) -> None:
        self.transport.send(
            self.agent_addr,
            Message({"k": "proc_up", "m": self.mesh_id, "rk": self.rank, "addr": self.transport.address, "pid": os.getpid()}),
        )
        self.transport.serve(self.handle)


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
    os.environ["JUPYTER_MESH_RANK"] = str(cfg["rank"])
    try:
        for mod in cfg.get("preload") or ():
            importlib.import_module(mod)
        runtime = ProcRuntime(cfg, key)
    except BaseException:  # noqa: BLE001 - the agent sees the exit code and this traceback
        traceback.print_exc()
        _exit(3)
    runtime.serve()
    _exit(0)
