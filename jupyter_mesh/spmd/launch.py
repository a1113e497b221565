"""From the controller: torchrun's environment on a whole proc mesh, and scripts run on it.

``setup_torch_elastic_env(procs)`` is Monarch's function; ``run_script(procs, [path, *args])`` is
what ``torchrun --nproc-per-node=N path args`` does, with the mesh in place of torchrun's workers:
every proc runs the script, the first rank hosts the rendezvous, and the call's future gives one
``True`` per rank or raises what the ranks raised (:func:`root_causes_first` puts the rank that failed
first at the head). One ``SPMDActor`` mesh per proc mesh (or slice) is spawned on first use and kept:
respawned ranks get theirs back with the rest of the mesh's actors. Ranks that a failed run still
holds in native code are restarted before the next run (:mod:`.stuck`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.future import Future
from .._core.shape import Shape
from .._core.value_mesh import ValueMesh
from ..errors import ActorError, MeshCancelledError, MeshValueError, RemoteFailure
from .actor import SPMDActor
from .env import AddrType
from .stuck import busy_ranks, describe, note, restart_ranks

__all__ = [
    "root_causes_first",
    "run_script",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
    "spmd_actors",
]

_lock = threading.Lock()
_Key = tuple[str, Shape | None]
_actors: dict[_Key, tuple[ProcMesh, ActorMesh[SPMDActor]]] = {}
_last_run: dict[_Key, Future[ValueMesh[bool]]] = {}


def _key(proc_mesh: ProcMesh) -> _Key:
    return (proc_mesh._ref.mesh_id, proc_mesh._view)  # view None: the whole mesh, as it grows or shrinks


def spmd_actors(proc_mesh: ProcMesh) -> ActorMesh[SPMDActor]:
    """The ``SPMDActor`` mesh of ``proc_mesh`` (spawned on first use, then kept for the mesh's life)."""
    key = _key(proc_mesh)
    with _lock:
        for k in [k for k, (pm, _) in _actors.items() if pm.stopped]:
            del _actors[k]  # meshes stopped since: their actors went with them
            _last_run.pop(k, None)
        found = _actors.get(key)
        if found is None:
            am = proc_mesh.spawn("spmd", SPMDActor, proc_mesh._view)
            found = _actors[key] = (proc_mesh, am)
    return found[1]


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise MeshValueError(
            "give both master_addr and master_port, or neither (then the first rank's host and a free port there are used)"
        )


def _first(am: ActorMesh[SPMDActor]) -> ActorMesh[SPMDActor]:
    """The rank with every coordinate 0: it hosts the rendezvous, as in torchrun and Monarch."""
    return am.slice(**dict.fromkeys(am.sizes, 0))


def _master(
    am: ActorMesh[SPMDActor], master_addr: str | None, master_port: int | None, use_ipaddr: AddrType | None
) -> tuple[str, int]:
    _check_master(master_addr, master_port)
    if master_addr is not None and master_port is not None:
        return master_addr, master_port
    addr, port = _first(am).get_host_port.call_one(use_ipaddr).get()
    return addr, port


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Set torchrun's variables in every proc of ``proc_mesh``, so code run there afterwards (actors,
    ``%%mesh`` cells) can ``init_process_group()`` as under torchrun. Without ``master_addr`` and
    ``master_port``, the first proc's host and a port free there are chosen."""
    am = spmd_actors(proc_mesh)
    addr, port = _master(am, master_addr, master_port, use_ipaddr)
    am.setup_env.call(addr, port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for async code."""
    _check_master(master_addr, master_port)
    am = spmd_actors(proc_mesh)
    if master_addr is None or master_port is None:
        master_addr, master_port = await _first(am).get_host_port.call_one(use_ipaddr)
    await am.setup_env.call(master_addr, master_port)


def run_script(
    proc_mesh: ProcMesh,
    script_args: Sequence[str],
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
    restart_stuck: bool = True,
) -> Future[ValueMesh[bool]]:
    """Run ``[path, *args]`` (or ``["-m", module, *args]``) on every proc, as torchrun's workers would.

    Returns at once; ``.get()`` waits (Ctrl-C / ■ there stops the script on every rank). A rank
    that raised makes it raise :class:`~jupyter_mesh.ActorError` for every rank that failed; a proc
    that died, :class:`~jupyter_mesh.SupervisionError`.

    After a run that lost a rank or was cancelled, ranks still held by it in native code (waiting in
    the rendezvous for the rank that is gone) get new procs first when ``restart_stuck`` (torchrun
    too restarts the whole group when a worker fails); a line on stderr says which. A run still in
    progress is not touched: the new one queues behind it.
    """
    args = [str(a) for a in script_args]
    if not args:
        raise MeshValueError("run_script needs a script: [path, *args] or ['-m', module, *args]")
    am = spmd_actors(proc_mesh)
    if restart_stuck:
        _restart_leftovers(proc_mesh, am)
    addr, port = _master(am, master_addr, master_port, use_ipaddr)
    fut = am.main.call(addr, port, args)
    with _lock:
        _last_run[_key(proc_mesh)] = fut
    return fut


def _restart_leftovers(proc_mesh: ProcMesh, am: ActorMesh[SPMDActor]) -> None:
    """New procs for ranks that the previous run (failed, or cancelled) still holds."""
    with _lock:
        prev = _last_run.get(_key(proc_mesh))
    if prev is None or not prev.done():
        return
    err = prev.exception(0)
    if err is None or isinstance(err, ActorError):  # every rank answered: none is held
        return
    stuck = busy_ranks(am)
    if stuck:
        restart_ranks(proc_mesh, stuck)
        note(
            f"{describe(proc_mesh, stuck)} were still in the run that "
            f"{'was cancelled' if isinstance(err, MeshCancelledError) else 'failed'} (native code: the rendezvous "
            "or a collective waiting for a rank that is gone); their procs were restarted"
        )


# What a rank reports when a collective broke because *another* rank left it (gloo, NCCL, the store).
_PEER_LOST = re.compile(
    r"Check the logs of the remote worker|Connection closed by peer|Connection reset by peer|Broken pipe|Socket Timeout|"
    r"Read error|Write error|Timed out|timed out|"
    r"connection refused|Connection refused|NCCL communicator was aborted|ProcessGroup.*(aborted|shut ?down)",
)


def _followed(f: RemoteFailure) -> bool:
    """Did this rank fail only because another one did (a collective lost its peer)?"""
    return f.exc_type in ("DistBackendError", "DistNetworkError", "DistStoreError") or bool(
        _PEER_LOST.search(f.message)
    )


def root_causes_first(err: ActorError) -> ActorError:
    """The same error with the ranks that failed on their own first (a rank's ``ValueError``), and
    those whose collectives only lost that rank (gloo's "Connection closed by peer") after them, so the
    message and the first traceback are the cause. Unchanged when nothing tells them apart."""
    causes = [f for f in err.failures if not _followed(f)]
    if not causes or len(causes) == len(err.failures) or err.failures[0] in causes:
        return err
    return ActorError(causes + [f for f in err.failures if _followed(f)], err.total)
