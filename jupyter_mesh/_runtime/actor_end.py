"""What ends an actor while its proc lives on: its failure record, dying of an error no caller
receives or of a failure of a mesh it owns that it did not handle, ``ActorMesh.stop()``,
``__cleanup__``, and telling its spawner (``ACTOR_FAULT``).

A part of ``actor_host.ActorHost`` (a base class of it), kept apart: the call path is there, the ends here.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from typing import Any, Protocol

from .._core.refs import ProcMeshRef
from .._core.shape import Point
from .._wire.protocol import BROKEN, NO_REPLY, OK, Kind
from .._wire.serialize import dumps
from .._wire.transport import Message, Transport
from ..errors import Failure
from .descendants import Descendants
from .remote_errors import error_info, safe_str

__all__ = ["ActorEnds"]


class _Runtime(Protocol):
    """What ending an actor needs of its proc's runtime (``actor_host.ProcSide`` has all of it)."""

    transport: Transport
    mesh_id: str
    mesh_name: str
    rank: int
    coords: dict[str, int]
    point: Point

    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None: ...


class ActorEnds:
    """The actor's ways to end; ``ActorHost`` sets the attributes below."""

    runtime: _Runtime
    actor_id: str
    name: str
    instance: Any
    failure: Failure | None
    spawner: str
    cls_path: str
    descendants: Descendants
    closing: bool
    loop: asyncio.AbstractEventLoop
    cleanup_due: Exception | None = None  # it died: ``__cleanup__`` gets this once the message that killed it ends
    constructing = False  # its ``__init__`` runs now
    unsupervised = False  # a failure of a mesh it owns went unhandled: it failed (a call running then too)
    stop_due = False  # it stops itself (``Instance.stop()``) once the message that runs now ends
    proc_ref: ProcMeshRef | None = None  # the proc mesh it was spawned on (``Instance.proc_mesh``)
    _bell: Any  # the actor's doorbell (``ActorHost``): a frame of ``_bell_token`` wakes its thread
    _bell_lock: threading.Lock
    _bell_token: bytes

    # -- what ends the actor (its proc lives on) ----------------------------------------------------
    def abort(self, reason: str | None) -> None:
        """``context().actor_instance.abort(reason)``: the actor fails now (its proc lives on); later calls
        get the failure, and its spawner (its ``__supervise__`` or fault hook) hears of it."""
        if self.failure is not None:
            return
        if self.constructing:  # in ``__init__``: its spawn fails with this (``initialized`` raises it), as
            # with an ``__init__`` that raised; ``ActorHost._spawn`` reports it once ``__init__`` returns
            self.failure = self._failure("init", f"{self.name}: __init__ aborted: {reason or 'no reason provided'}")
            return
        cls = type(self.instance).__qualname__
        self.failure = self._failure("died", f"{cls} {self.name} aborted: {reason or 'no reason provided'}")
        self._report(self.failure, told=False, untold=True)  # the call running now still ends normally
        self._cleanup_after(self.failure)

    def stop_self(self) -> None:
        """``context().actor_instance.stop()``: once the message that runs now ends, the actor stops as
        on ``ActorMesh.stop()`` (``__cleanup__(None)``, its meshes stopped, later calls answered as
        stopped); no failure: its spawner is not told."""
        self.stop_due = True
        self._ring()

    def _ring(self) -> None:
        """Wake the actor's thread, with no message (its loop then sees ``cleanup_due``, ``stop_due``)."""
        with self._bell_lock:
            self._bell.send(self._bell_token)

    def _failure(self, kind: str, detail: str, info: dict[str, Any] | None = None) -> Failure:
        rt = self.runtime
        who = f"{self.cls_path or 'actor'} {self.name}{rt.point}"  # Monarch's: module.Class name{'gpus': 0/4}
        return Failure(
            rt.mesh_name, rt.coords, kind, detail, info["tb"] if info else "", actor=self.name, who=who, rank=rt.rank
        )

    def _die(self, h: dict[str, Any], e: BaseException, how: str) -> None:
        """An error no caller receives (or a BaseException) ends the actor, as in Monarch: a caller
        waiting gets the failure, later calls too, and the spawner hears of it."""
        info = error_info(e, h["ep"])
        self.failure = self._failure("died", f"{self.name}.{h['ep']} raised {info['type']}: {info['msg']} {how}", info)
        told = h["rm"] != NO_REPLY
        if told:
            self.runtime.reply(h, BROKEN, dumps(self.failure)[0], [])
        self._report(self.failure, told)
        self.descendants.end()
        self._cleanup_after(self.failure, e)

    def _cleanup_after(self, failure: Failure, cause: BaseException | None = None) -> None:
        """It died: ``__cleanup__`` runs with an ``Exception`` that says why (Monarch's: its error text in
        an ``Exception``; here the failure's, its cause as ``__cause__``), once the message that killed it
        ends (the loop may be running it now)."""
        exc = Exception(failure.describe())
        exc.__cause__ = cause
        self.cleanup_due = exc
        self._ring()

    def _fail_unsupervised(self, err: Exception, raised: BaseException | None = None) -> None:
        """A failure of a mesh it owns went unhandled (no ``__supervise__``, it said no, or it raised): the
        actor fails, as in Monarch, not its proc. Later calls get the failure, its spawner hears of it
        (``mesh_name``: this actor's mesh) and the meshes it spawned are stopped."""
        print(f"[{self.name}] unhandled failure of a mesh it owns, so this actor fails:\n{err}", file=sys.stderr)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        detail = f"{self.name} did not handle a failure of a mesh it owns: {first}"
        tb = str(err)
        if raised is not None:  # its __supervise__ raised: that is the news (Monarch's report carries it)
            info = error_info(raised, "__supervise__")
            detail = f"{self.name}.__supervise__ raised {info['type']}: {info['msg']} handling a failure of a mesh it owns: {first}"
            tb = f"{info['tb']}\nwhile handling:\n{err}"
        self.failure, self.unsupervised = self._failure("died", detail, {"tb": tb}), True
        self._report(self.failure, told=False, untold=True)  # the call running now (if any) gets it as it ends
        self.descendants.end()
        self._cleanup_after(self.failure, err)

    def _end_after_message(self) -> None:
        """What the last message left due: ``__cleanup__(exc)`` after a death, or its own stop."""
        if self.cleanup_due is not None:
            self._clean_up(self.cleanup_due)
        if self.stop_due:
            self.stop_due = False
            if self.failure is None:
                self._clean_up()
                self.failure = self._failure("stopped", f"actor '{self.name}' stopped itself")
                self.instance = None
                self.descendants.end()

    def _stop(self, h: dict[str, Any]) -> None:
        """``ActorMesh.stop()``: the tasks it left running are cancelled, ``__cleanup__(None)`` runs, and
        every later call is answered as stopped; the stop itself succeeds."""
        if self.failure is None:
            self._clean_up()
            self.failure = self._failure("stopped", f"actor mesh '{self.name}' was stopped")
            self.instance = None  # its resources go now, as its proc's would
            self.descendants.end()
        self.runtime.reply(h, OK, dumps(None)[0], [])

    def _clean_up(self, exc: Exception | None = None) -> None:
        """Cancel its leftover tasks and run ``__cleanup__(exc)`` (``None``: stopped, not died); once."""
        self.cleanup_due = None
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        cleanup = getattr(self.instance, "__cleanup__", None)
        try:
            if cleanup is not None:
                out = cleanup(exc)
                if inspect.isawaitable(out):
                    self.loop.run_until_complete(out)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - the actor stops anyway; say why it did not clean up
            print(f"[{self.name}] __cleanup__ raised:\n" + error_info(e, "__cleanup__")["tb"], file=sys.stderr)

    def _report(self, failure: Failure, told: bool, untold: bool = False) -> None:
        """Tell the spawner (``told``: a caller got it already, so only an owning actor must hear;
        ``untold``: no caller will get it, even one waiting now, as with ``abort()``)."""
        rt = self.runtime
        if self.closing and failure.kind != "init":
            return  # the proc stops: what its end interrupted is no failure
        header = {"k": Kind.ACTOR_FAULT, "m": rt.mesh_id, "rk": rt.rank, "a": self.actor_id, "told": int(told)}
        if untold:
            header["ut"] = 1
        try:
            rt.transport.send(self.spawner, Message(header, dumps(failure)[0]))
        except Exception as e:  # noqa: BLE001 - the spawner is gone: the log is all that is left
            print(f"[{self.name}] {failure.detail} (its spawner could not be told: {safe_str(e)})", file=sys.stderr)
