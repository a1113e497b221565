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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._runtime.debugger import PausedActor

__all__ = ["continue_all", "paused"]


def paused() -> list[PausedActor]:
    """Every actor of this program's meshes paused in the debugger now, oldest first."""
    from ._runtime.controller import Controller

    return Controller.get().debugger.paused()


def continue_all() -> int:
    """Let every paused actor run on (pdb's ``continue``); how many were paused."""
    from ._runtime.controller import Controller

    return Controller.get().debugger.continue_all()
