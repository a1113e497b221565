"""Actors paused in ``breakpoint()`` / ``pdb.set_trace()``, and their pdb, from Python.

An endpoint that calls ``breakpoint()`` pauses that actor only (the proc's other actors, and other
ranks, run on); its rank shows *paused at file:line* in ``ProcMesh.state()`` and the views. In the
``mesh`` kernel the cell waiting on the call shows the pdb prompt itself; anywhere else::

    from jupyter_mesh import debug
    for p in debug.paused():          # PausedActor: mesh, rank, coords, actor, where, since
        print(p, p.prompt())          # what pdb printed, up to "(Pdb) "
        print(p.send("p x"))          # one pdb command and its output
        p.cont()                      # continue
    debug.continue_all()

``prompt_while_waiting()`` (on in the notebook) makes a thread waiting on a call's ``get()`` serve
the pdb prompts of paused actors itself, through ``input()``: in a kernel, the cell's stdin.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._core import future as _future
from .errors import MeshError, MeshValueError

if TYPE_CHECKING:
    from ._core.future import Future
    from ._runtime.debugger import Debugger, PausedActor

__all__ = ["attach", "continue_all", "paused", "post_mortem", "prompt_while_waiting", "this_front"]

_PDB_PROMPT = "(Pdb) "


def paused() -> list[PausedActor]:
    """Every actor of this program's meshes paused in the debugger now, oldest first."""
    from ._runtime.controller import Controller

    return Controller.get().debugger.paused()


def continue_all() -> int:
    """Let every paused actor run on (pdb's ``continue``); how many were paused."""
    from ._runtime.controller import Controller

    return Controller.get().debugger.continue_all()


def _input(prompt: str) -> str:
    return builtins.input(prompt)  # looked up now: a kernel swaps it per cell (the cell's stdin)


def post_mortem(on: bool = True) -> int:
    """Post-mortem debugging on the procs running now: an endpoint that raises stops in pdb where it
    raised (a paused actor like any other) and its caller gets the error once it is continued.
    Procs started later do not have it: call it again. Returns how many procs were told."""
    from ._runtime.controller import Controller

    return Controller.get().debugger.set_post_mortem(on)


def this_front() -> str:
    """How other fronts name this one when it holds a prompt ("rank 3 is being debugged from ...")."""
    app = sys.modules.get("ipykernel.kernelapp")
    if app is not None and app.IPKernelApp.initialized():
        return f"the notebook (kernel pid {os.getpid()})"
    return f"the controller's own program (pid {os.getpid()})"


def attach(p: PausedActor, read: Callable[[str], str] = _input) -> None:
    """pdb's terminal for ``p`` here: its output printed, each line read with ``read`` (``input``:
    in a kernel, the cell's stdin) sent to it, until it runs on (``c``) or ``detach`` leaves it paused.
    Ctrl-C (the notebook's interrupt) propagates: the call waiting on it is then cancelled."""
    from ._runtime.controller import Controller

    dbg = Controller.get().debugger
    holder = p.claim(this_front())
    if holder:
        raise MeshValueError(
            f"{p.actor} on {p.mesh} {p.label} is attached elsewhere: it is being debugged from {holder}; "
            "type 'detach' there first"
        )
    try:
        _serve(dbg, p, read)
    finally:
        p.release()


def _serve(dbg: Debugger, p: PausedActor, read: Callable[[str], str]) -> None:
    print(f"--- {p.actor} on {p.mesh} {p.label} paused at {p.where} ('detach' leaves it paused) ---")
    try:
        text = p.prompt(timeout=None) if p.has_output() else ""  # "": at a prompt a front showed already
        while True:
            body = text[: -len(_PDB_PROMPT)] if text.endswith(_PDB_PROMPT) else text
            if body:
                print(body, end="" if body.endswith("\n") else "\n")
            if p.ended:
                print(f"--- {p.actor} on {p.mesh} {p.label} runs on ---")
                return
            more = len([x for x in dbg.paused() if x is not p and not x.detached])
            try:
                line = read(f"[{p.mesh} rank {p.label}{f' ({more} more paused)' if more else ''}] (Pdb) ")
            except (EOFError, OSError, MeshError, RuntimeError) as e:  # no stdin here (allow_stdin off)
                p.detached = True
                print(f"--- cannot read a pdb command here ({type(e).__name__}); {p.actor} stays paused: ")
                print("    `%mesh debug attach` or jupyter_mesh.debug.paused()[i].send('c') resumes it ---")
                return
            if line.strip() == "detach":
                p.detached = True
                print(f"--- detached; {p.actor} on {p.mesh} {p.label} stays paused (`%mesh debug`) ---")
                return
            text = p.send(line, timeout=None)
    except MeshError as e:  # the proc died while paused: the call waiting on it says how
        print(f"--- {p.actor} on {p.mesh} {p.label}: {e} ---")
    except KeyboardInterrupt:  # a live pause ends with the cancel of its call; a post-mortem one is let go
        if p.post_mortem and not p.ended:
            dbg.send_line(p, "c")
        raise


class _Prompter:
    """The pause hook of ``get()``: pauses wake the main thread waiting on a call, which then
    serves the pdb prompts (oldest pause first) until no actor it may serve is paused."""

    def __init__(self, read: Callable[[str], str]):
        from ._runtime.controller import Controller

        self._controller, self.read = Controller, read
        self.dbg = Controller.get().debugger
        self._watched: Future[Any] | None = None
        self._serving = False
        self._told: set[tuple[str, int, str]] = set()  # pauses held by another front this wait was told of
        self.unsubscribe = self.dbg.subscribe(self._on_change)

    def _follow(self) -> None:
        """A session whose controller was replaced (``Controller.reachable_from``): its debugger now."""
        inst = self._controller._instance
        if inst is not None and inst.debugger is not self.dbg:
            self.unsubscribe()
            self.dbg = inst.debugger
            self.unsubscribe = self.dbg.subscribe(self._on_change)

    def _waiting(self) -> list[PausedActor]:
        if not self.dbg.any_paused():  # every get() on the main thread asks: spare the lock and sort
            return []
        return [p for p in self.dbg.paused() if not p.detached and not p.attached]

    def watch(self, fut: Future[Any]) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        self._follow()
        self._watched = fut
        self._told.clear()
        if self._waiting():
            fut._poke()
        return self._unwatch

    def _unwatch(self) -> None:
        self._watched = None

    def _on_change(self, p: PausedActor) -> None:  # receive thread
        fut = self._watched
        if fut is not None and p.paused and not p.detached and not p.attached:
            fut._poke()
        elif fut is not None and p.paused and p.attached and not self._serving:
            key = (p.mesh_id, p.rank, p.sid)
            if key not in self._told:  # another front (jupyter-mesh debug) took it: say so once
                self._told.add(key)
                print(
                    f"jupyter_mesh: {p.actor} on {p.mesh} {p.label} is being debugged from {p.attached_by}; "
                    "this cell waits for it (interrupt to cancel the call)",
                    file=sys.stderr,
                )
        elif fut is None and not self._serving and p.paused and p._prompts == 0:  # a new pause nobody waits on
            print(
                f"jupyter_mesh: {p.actor} on {p.mesh} {p.label} paused at {p.where}; a cell waiting on a call "
                "with .get() prompts for it, or `%mesh debug attach` (an `await` does not prompt: interrupt it)",
                file=sys.stderr,
            )

    def serve(self) -> None:
        self._serving = True  # pauses meanwhile queue here: no notice for them
        try:
            while True:
                waiting = self._waiting()
                if not waiting:
                    return
                attach(waiting[0], self.read)
        finally:
            self._serving = False


def prompt_while_waiting(on: bool = True, read: Callable[[str], str] | None = None) -> None:
    """While the main thread waits on a call, an actor that pauses in the debugger prompts there
    (``attach``), with ``read`` (default ``input``) reading its commands. Off: nothing prompts by itself."""
    old = _future.pause_hook
    if isinstance(old, _Prompter):
        old.unsubscribe()
    _future.pause_hook = _Prompter(read or _input) if on else None
