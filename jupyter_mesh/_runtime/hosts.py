"""What a scheduler gives jupyter_mesh: one agent per host (the ``Job`` base class every job implements).

The controller only ever talks to a job through this class, so a new scheduler (SLURM, Kubernetes, …)
is one subclass in ``jupyter_mesh.jobs`` and no change here.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from ..errors import MeshValueError

__all__ = ["AgentHandle", "Job"]


@dataclass
class AgentHandle:
    index: int
    addr: str
    pid: int
    host_key: str


class Job(abc.ABC):
    """What a scheduler gives jupyter_mesh: one agent per host. The controller calls these (spawning
    proc meshes, growing them, supervising agents); the optional ones say clearly what a job cannot do."""

    keep_alive: bool = False
    """Whether the job outlives its controller (``detach`` at shutdown instead of ``stop``)."""

    @abc.abstractmethod
    def agents(self, timeout: float) -> list[AgentHandle]:
        """The agents of every host, waiting (at most ``timeout``) for them to come up."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every agent of the job (and so every proc on its hosts)."""

    def describe(self) -> dict[str, Any]:
        """What views show of the job (the widget, the sidebar, ``jupyter-mesh status``): its ``kind``
        (``local``, ``slurm``, ``attach``: the class's name without "Job"), the scheduler's ``id`` of
        it (None when there is none) and ``keep_alive`` (it outlives this controller). Read at every
        snapshot: keep it cheap, no I/O."""
        name = type(self).__name__
        kind = name[: -len("Job")] if name.endswith("Job") and len(name) > 3 else name
        return {"kind": kind.lower(), "id": None, "keep_alive": bool(getattr(self, "keep_alive", False))}

    def running(self) -> bool:
        """Whether the job still has (or is starting) agents; a stopped job says False."""
        return True

    def explain_loss(self, addr: str) -> str | None:
        """What the scheduler knows about a lost agent of this job (e.g. "SLURM job 12 is CANCELLED"),
        added to the cause its ranks fail with; None when it is not ours or there is nothing to add."""
        return None

    def add_hosts(self, n: int, timeout: float) -> list[AgentHandle]:
        """``n`` more hosts for a proc mesh that grows along ``hosts``; their agents."""
        raise MeshValueError(f"{self!r} cannot add hosts; spawn a new proc mesh on a larger host mesh")

    def agent_lost(self, addr: str) -> None:
        """The controller gave up on the agent at ``addr`` (it died, or went silent past the heartbeat
        timeout). A job that can replace the host does it here (on next use); by default nothing."""
        return None

    def meshes_changed(self) -> None:
        """The controller's proc or actor meshes on this job changed (spawned, stopped, resized): a job
        that remembers them for a later controller (``keep_alive``) saves them here."""
        return None

    def detach(self) -> None:
        """The controller goes and a kept-alive job stays: tell its agents to wait for the next one."""
        raise MeshValueError(f"{self!r} cannot outlive its controller")
