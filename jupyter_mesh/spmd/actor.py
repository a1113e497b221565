"""``SPMDActor``: one per proc; sets torchrun's environment and runs a training script in the proc.

Monarch's names and endpoints (``get_host_port``, ``setup_env``, ``main``), so Monarch code that
drives it ports as is. What differs: the numbers are computed at each call from the proc's current
point, so a mesh that was resized or had ranks respawned gets the right ones (an actor spawned on a
slice of a proc mesh counts its ranks from 0 within it, as in Monarch); and a script's process group
never outlives the run (see :mod:`.script`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .._core.actor import Actor, current_rank, endpoint
from .._core.context import context
from .._core.shape import Point, Shape
from .env import AddrType, free_port, host_address, torch_elastic_env
from .script import run_program, script_traceback

__all__ = ["SPMDActor"]


class SPMDActor(Actor):
    """Sets torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_*``, ``ROLE_*``, ``MASTER_ADDR``, ``MASTER_PORT``) in its proc and runs scripts there.

    ``view``: the slice of the proc mesh the actor mesh was spawned on (None: the whole mesh), as
    :func:`~jupyter_mesh.spmd.setup_torch_elastic_env` passes it; unused now that actors spawned on a
    slice count their ranks within it themselves (``current_rank()``), kept for its callers.
    """

    def __init__(self, view: Shape | None = None) -> None:
        self._view = view

    def point(self) -> Point:
        """This rank's coordinates in the mesh it runs SPMD code on: Monarch's, ``current_rank()``, its
        point in the actors the call went to (all of them: the proc mesh view they were spawned on)."""
        return current_rank()

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update(torch_elastic_env(self.point(), master_addr, master_port))
        # init_process_group returns on no rank before every rank has its group (torch's store barrier,
        # off by default since torch 2.1): else a rank that fails at once (step 0) closes its connections
        # while a slower peer still connects, and that peer's connectFullMesh fails, or waits for gloo's
        # 30 minutes for a rank that left. A user's own setting stands.
        os.environ.setdefault("TORCH_DIST_INIT_BARRIER", "1")

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None = None) -> tuple[str, int]:
        """This host's address for the other ranks, and a port free on it: the rendezvous point."""
        return host_address(use_ipaddr, _peer_ip()), free_port()

    @endpoint
    def ready(self) -> bool:
        """Answers at once when no run holds the actor (ours: how a left-over run is found)."""
        return True

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this proc (they stay for later code: ``%%mesh`` cells, actors)."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: Sequence[str]) -> bool:
        """Set the variables, then run ``[path, *args]`` or ``["-m", module, *args]`` as ``__main__``
        on this actor's thread (what each worker of ``torchrun`` runs). True when it ended well."""
        self._setup_env(master_addr, master_port)
        try:
            run_program(script_args)
        except BaseException as e:
            # the remote traceback starts at the script (a bare raise adds no frame of ours back)
            e.__traceback__ = script_traceback(e.__traceback__, script_args)
            raise
        return True


def _peer_ip() -> str | None:
    """The IP other hosts reach this proc's host by, when its mesh spans hosts (tcp); else None."""
    transport = getattr(context().actor.proc, "transport", None)
    address = str(getattr(transport, "address", "") or "")
    if not address.startswith("tcp://"):
        return None
    ip = address[len("tcp://") :].rpartition(":")[0].strip("[]")
    return None if ip in ("", "127.0.0.1", "::1") else ip
