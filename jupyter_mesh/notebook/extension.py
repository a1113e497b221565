"""Wiring the front into an IPython shell: magics, the output sink, cell events, traceback rendering.

One :class:`Front` per shell. In a Jupyter kernel worker output is published to the cell that is
running (as ``stream`` messages with that cell's parent header); in a terminal IPython it is printed.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import debug
from .._runtime.controller import Controller
from ..errors import SupervisionError
from ..lowlevel import on_send, set_actor_errors, set_fault_hook, sync_output
from ..ui.sidebar_comm import set_stopper
from . import long_calls, tracebacks
from .magics import MeshMagics
from .output import OutputRouter
from .reload import Redefinitions

__all__ = ["Front", "front_of", "load", "unload"]


class Front:
    """Everything the notebook front keeps for one shell (and its kernel, when there is one)."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.kernel = getattr(shell, "kernel", None)
        self.router = OutputRouter(self._publish if self.kernel is not None else _print)
        self.magics = MeshMagics(shell, self.router)
        shell.register_magics(self.magics)
        tracebacks.install(shell)
        shell.events.register("pre_execute", self.pre_execute)
        shell.events.register("post_execute", self.post_execute)
        # the kernel hosts the controller for its whole life: start it now, with output routed here
        Controller.get().output = self.router.sink
        self.redefinitions = Redefinitions(shell, self.router.notify)
        self.magics.redefinitions = self.redefinitions
        on_send(self._sent, self.redefinitions.spawned)
        self.router.sync_output = sync_output
        self._displayhook_start = self._wait_output_before_results()
        # a failure nobody waits on is shown, never raised later: the kernel must live on
        self._prev_fault_hook = set_fault_hook(self._on_fault)
        # an error no caller receives (a broadcast's) is shown, and the actor lives on: a typo in a cell
        # must not cost the notebook its actors (scripts get Monarch's way: the actor dies)
        self._prev_actor_errors = set_actor_errors("survive")
        # the sidebar's Stop mesh is `%mesh down` for the meshes the magics brought up
        self._prev_stopper = set_stopper(self.magics.down_mesh_id)
        # an actor paused in breakpoint() prompts in the cell waiting on its call (the kernel's stdin)
        debug.prompt_while_waiting(True)
        # a call waited on for long shows in its cell which ranks have not answered, and where they are
        long_calls.install()

    def _on_fault(self, err: SupervisionError) -> None:
        lines = [
            f"jupyter_mesh: {f.mesh} [{','.join(f'{k}={v}' for k, v in f.coords.items())}] {f.detail}"
            for f in err.failures
        ]
        kinds = {f.kind for f in err.failures}
        if kinds <= {"broadcast"}:  # the actor lives on; its traceback is in the cell that broadcast
            hint = "(a broadcast has no caller to raise it in; use call() to get it as an exception)"
        elif kinds <= {"init", "died"}:
            hint = "(calls to that actor mesh raise SupervisionError; its procs live on: spawn it again)"
        else:
            hint = "(calls to it raise SupervisionError; `%mesh respawn` or ProcMesh.respawn() brings it back)"
        self.router.notify("\n".join(lines) + f"\n{hint}\n")

    def _sent(self, mesh: Any, ranks: list[int]) -> None:
        """A call went to ``ranks`` (on the sending thread): their output goes to the running cell;
        actors of a class redefined since their spawn say so."""
        self.router.sent(mesh._ref.mesh_id, mesh._ref.name, ranks)
        self.redefinitions.sent(mesh, ranks)

    def _wait_output_before_results(self) -> Any:
        """A cell's result (``Out[n]``) is shown after what the ranks it called printed before it:
        the displayhook waits for their output first (the stream and the result travel apart)."""
        hook = getattr(self.shell, "displayhook", None)
        start = getattr(hook, "start_displayhook", None)
        if start is None:
            return None

        def start_displayhook() -> Any:
            self.router.barrier()
            return start()

        hook.start_displayhook = start_displayhook
        return start

    def _publish(self, parent: Any, name: str, text: str) -> None:
        if not parent:
            return
        k = self.kernel
        k.session.send(
            k.iopub_socket, "stream", {"name": name, "text": text}, parent=parent, ident=b"stream." + name.encode()
        )

    def pre_execute(self) -> None:
        parent = getattr(self.shell, "parent_header", None) if self.kernel is not None else True
        self.router.begin_cell(parent)

    def post_execute(self) -> None:
        self.router.end_cell()

    def shutdown(self) -> None:
        """Stop every mesh, agent and proc of this kernel (Shut Down, Restart, or unloading)."""
        try:
            self.magics.meshes.down_all(leave_kept=True)  # a kept job waits for %mesh reattach
        finally:
            Controller.get().shutdown()
            self.router.close()

    def detach(self) -> None:
        self.shell.events.unregister("pre_execute", self.pre_execute)
        self.shell.events.unregister("post_execute", self.post_execute)
        self.shell.set_custom_exc((), None)
        set_fault_hook(self._prev_fault_hook)
        set_actor_errors(self._prev_actor_errors)
        on_send(None)
        if self._displayhook_start is not None:
            del self.shell.displayhook.start_displayhook  # the class's method again
        set_stopper(self._prev_stopper)
        long_calls.uninstall()
        debug.prompt_while_waiting(False)
        self.shutdown()


def _print(parent: Any, name: str, text: str) -> None:
    stream = sys.stdout if name == "stdout" else sys.stderr
    stream.write(text)
    stream.flush()


def front_of(shell: Any) -> Front | None:
    return getattr(shell, "_jupyter_mesh_front", None)


def load(shell: Any) -> Front:
    front = front_of(shell)
    if front is None:
        front = Front(shell)
        shell._jupyter_mesh_front = front
    return front


def unload(shell: Any) -> None:
    front = front_of(shell)
    if front is not None:
        front.detach()
        shell._jupyter_mesh_front = None
