"""Monarch's per-program singletons: ``this_proc()`` and ``get_or_spawn_controller(name, Class)``.

``get_or_spawn_controller`` gives one actor per name for the whole program, wherever it is asked from:
the root controller (the program's own, not one a proc made for its actors) keeps the table. Procs
learn its address from their environment (``ROOT``, set for every proc mesh this program spawns) and ask
it with a signed ``SINGLETON`` request; the root spawns a controller once, on a proc of its own, and
answers everyone with the same ``ActorMesh``.
"""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

from .._api import host_mesh as _host_mesh
from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.actor import Actor
from .._core.context import context
from .._core.future import Future
from .._wire.protocol import OK, RAISED, Kind, reply_header
from .._wire.serialize import dumps, loads
from ..errors import MeshValueError
from .local import this_host

__all__ = ["ROOT", "get_or_spawn_controller", "root_address", "this_proc"]

A = TypeVar("A", bound=Actor)

ROOT = "JUPYTER_MESH_ROOT"
"""The root controller's address, in the environment of every proc of the program."""

_lock = threading.Lock()
_this_proc: ProcMesh | None = None
_controllers: dict[str, ActorMesh[Any]] = {}
_serving: object = None  # the controller whose dispatch answers SINGLETON requests


def this_proc() -> ProcMesh:
    """Monarch's "the current proc". In an actor: its own proc, as a proc mesh of that one proc
    (``context().actor_instance.proc``), so what it spawns there runs in its process. In the program:
    one proc of this host, spawned on first use and kept (the program itself hosts no actors), so
    ``this_proc().spawn(...)`` puts actors beside it."""
    if context().actor.host is not None:
        from .._core.instance import context as actor_context

        return actor_context().actor_instance.proc  # type: ignore[no-any-return]
    global _this_proc
    with _lock:
        if _this_proc is None or _this_proc.stopped:
            _this_proc = this_host().spawn_procs(name="this_proc")
        return _this_proc


def _controller() -> Any:
    from .._runtime.controller import Controller

    return Controller.get()


def root_address() -> str:
    """Where singleton requests go: the program's root controller."""
    return os.environ.get(ROOT) or _controller().client.address


def _procs_env(ctl: Any) -> dict[str, str]:
    """For every proc mesh spawned: serve singletons here if we are the root, and tell the procs where."""
    _serve(ctl)
    return {ROOT: os.environ.get(ROOT) or ctl.client.address}


_host_mesh.singleton_server = _procs_env


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[ActorMesh[A]]:
    """The actor mesh (one actor) registered under ``name`` in this program, spawning ``cls(*args,
    **kwargs)`` on a proc of its own the first time. Works from the program and from inside actors."""
    if not isinstance(name, str) or not name:
        raise MeshValueError("get_or_spawn_controller() needs a non-empty name")
    if ROOT in os.environ:  # in a proc: ask the root
        what = f"controller '{name}'"
        return context().client().request(os.environ[ROOT], {"k": Kind.SINGLETON}, (name, cls, args, kwargs), what)
    fut: Future[ActorMesh[A]] = Future(f"controller '{name}'")
    try:
        fut._set_result(_get_or_spawn(name, cls, args, kwargs))
    except BaseException as e:  # noqa: BLE001 - the future carries it
        fut._set_exception(e)
    return fut


def _get_or_spawn(name: str, cls: type[Any], args: Any, kwargs: Any) -> ActorMesh[Any]:
    with _lock:
        mesh = _controllers.get(name)
        if mesh is None:
            procs = this_host().spawn_procs(name=f"controller_{name}")
            mesh = _controllers[name] = procs.spawn(name, cls, *args, **kwargs)
        return mesh


def _serve(ctl: Any) -> None:
    """Answer SINGLETON requests of procs at this controller (once per controller)."""
    global _serving
    if _serving is ctl or ROOT in os.environ:
        return
    _serving = ctl
    ctl.dispatch.add(
        Kind.SINGLETON, lambda msg, _: threading.Thread(target=_answer, args=(ctl, msg), daemon=True).start()
    )


def _answer(ctl: Any, msg: Any) -> None:
    """On a thread of its own (spawning takes a while): the request's mesh, or why not."""
    from .._wire.transport import Message

    h = msg.header
    try:
        name, cls, args, kwargs = loads(msg.payload, msg.buffers)
        ok, payload = OK, dumps(_get_or_spawn(name, cls, args, kwargs))[0]
    except BaseException as e:  # noqa: BLE001 - the asking actor gets it
        ok, payload = RAISED, dumps(RuntimeError(f"get_or_spawn_controller failed: {type(e).__name__}: {e}"))[0]
    ctl.transport.send(h["s"], Message(reply_header(h["i"], ok), payload))
