"""The kernel's end of the JupyterLab sidebar: a comm (target ``jupyter_mesh.sidebar``) per front end.

A channel opens either way: the sidebar opens one when it meets a kernel (and the target's absence,
a closed comm, tells it "not a mesh kernel"), and ``%load_ext jupyter_mesh.ui`` in a running kernel
opens one towards the front ends so a sidebar already showing that kernel comes alive. On a channel
the kernel sends a snapshot, then updates from the hub (at most ten a second, no polling on either
side); the front end sends actions, which run on a worker thread through the public API the magics
use (``proc_mesh(id).kill/respawn/stop/logs``), so a respawn's seconds never block the kernel.
Stop mesh is ``%mesh down`` for a mesh that ``%mesh up`` brought up (the notebook front registers it,
:func:`set_stopper`): its agents go too and the magics see it gone, so the two never disagree.

While a cell runs, the kernel's shell is busy: updates still flow (they go out on IOPub from the
hub's thread) but actions wait until the cell ends, as every comm message does.
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any, cast

from ..errors import MeshError
from .debug_channel import serve as serve_debug
from .hub import hub
from .remote import serve as serve_status
from .wire import ActionRequest, ActionResult, FrontMessage, MeshWire, SnapshotMessage, UpdateMessage, user_lines

__all__ = ["TARGET", "SidebarChannel", "install", "run_action", "set_stopper"]

TARGET = "jupyter_mesh.sidebar"
log = logging.getLogger("jupyter_mesh.ui")
_installed: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

Stopper = Callable[[str], bool]
"""mesh id -> True when it stopped that mesh its own way (``%mesh down``), False if not one of its."""
_stopper: Stopper | None = None


def set_stopper(fn: Stopper | None) -> Stopper | None:
    """Have Stop mesh go through ``fn`` first (the notebook front: ``%mesh down``); returns the previous one."""
    global _stopper
    prev, _stopper = _stopper, fn
    return prev


def run_action(req: ActionRequest) -> ActionResult:
    """Carry out one sidebar action with the public API; errors become a result, never a raise."""
    from ..lowlevel import proc_mesh

    out = ActionResult(type="result", id=req["id"], ok=True, error="", lines=[])
    try:
        pm = proc_mesh(req["mesh_id"])
        action, rank = req["action"], req.get("rank")
        if action == "kill":
            if rank is None:
                raise MeshError("kill needs a rank")
            pm.kill(int(rank))
        elif action == "respawn":
            out["lines"] = [str(r) for r in pm.respawn(None if rank is None else [int(rank)])]
        elif action == "stop":
            stopper = _stopper
            if stopper is None or not stopper(req["mesh_id"]):
                pm.stop()
        elif action == "logs":
            out["lines"] = user_lines(pm.logs(None if rank is None else int(rank), tail=200))
        else:
            raise MeshError(f"unknown action {action!r}; expected kill, respawn, stop or logs")
    except MeshError as e:
        out["ok"], out["error"] = False, str(e)
    except Exception as e:  # the sidebar shows it; the kernel carries on
        log.exception("sidebar action failed")
        out["ok"], out["error"] = False, f"{type(e).__name__}: {e}"
    return out


class SidebarChannel:
    """One open comm with one front end."""

    def __init__(self, comm: Any, kernel_name: str):
        self.comm = comm
        self.kernel_name = kernel_name
        self._lock = threading.Lock()  # one message at a time on this comm, whichever thread sends
        self._closed = False
        comm.on_msg(self._on_msg)
        comm.on_close(self._on_close)
        self._remove_view = hub().add_view(self._on_update)
        self._send_snapshot()

    def _send(self, msg: Any) -> None:
        with self._lock:
            if not self._closed:
                self.comm.send(msg)

    def _send_snapshot(self) -> None:
        self._send(SnapshotMessage(type="snapshot", kernel=self.kernel_name, meshes=hub().meshes()))

    def _on_update(self, changed: list[MeshWire], gone: list[str]) -> None:
        running = [m for m in changed if not m["stopped"]]
        removed = gone + [m["mesh_id"] for m in changed if m["stopped"]]
        self._send(UpdateMessage(type="update", meshes=running, removed=removed))

    def _on_msg(self, msg: dict[str, Any]) -> None:
        data = cast(FrontMessage, msg["content"]["data"])
        if data.get("type") == "refresh":
            self._send_snapshot()
        elif data.get("type") == "action":
            req = cast(ActionRequest, data)
            threading.Thread(
                target=lambda: self._send(run_action(req)), name="jupyter-mesh-action", daemon=True
            ).start()

    def _on_close(self, _msg: Any = None) -> None:
        with self._lock:
            self._closed = True
        self._remove_view()


def install(kernel: Any, name: str = "mesh", announce: bool = False) -> None:
    """Serve the sidebar from ``kernel`` (an ipykernel Kernel): register the comm target.

    The ``mesh`` kernel calls ``install(self)`` once it is set up; ``%load_ext jupyter_mesh.ui``
    calls it with ``announce=True``, which also opens a channel towards front ends already
    connected. It also answers ``jupyter-mesh status`` (:mod:`.remote`). Calling it again for the
    same kernel does nothing.
    """
    if kernel in _installed:
        return
    _installed[kernel] = name
    kernel.comm_manager.register_target(TARGET, lambda comm, _msg: SidebarChannel(comm, name))
    serve_status(kernel, name)  # `jupyter-mesh status`, answered on the control channel
    serve_debug(kernel)  # the sidebar's Attach and Stacks, on the control channel too
    if announce:
        from comm import create_comm

        SidebarChannel(create_comm(target_name=TARGET, data={"kernel": name}, comm_id=uuid.uuid4().hex), name)
