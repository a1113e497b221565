"""``%mesh torchrun [-m] SCRIPT [ARGS...]``: an unmodified torchrun script on every proc of a mesh.

What ``torchrun --nproc-per-node=N SCRIPT ARGS`` does, with the mesh's procs as the workers
(:func:`jupyter_mesh.spmd.run_script`): each rank's output lands in the cell, prefixed with its
coordinates; a rank that raised fails the cell with its traceback first (the ranks that only lost
it in a collective after); Interrupt (■) stops the script on every rank. A rank stuck in native code
that ignores the interrupt (a collective or the rendezvous waiting on a rank that already left) would
hold its proc until gloo's 30-minute timeout, so its proc is restarted at once (``%mesh respawn``):
the next run finds every rank free (``run_script`` does the same for ranks a failed run left behind).
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from IPython.core.error import UsageError

from .._core.future import Future
from ..errors import ActorError, MeshInterrupted, MeshTimeoutError, fold_coords
from ..spmd import root_causes_first, run_script
from ..spmd.stuck import restart_ranks
from .meshes import NamedMesh

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, mesh_name: Any, seconds: Any) -> None:
    """The ``torchrun`` subcommand: torchrun's own options where they make sense on a mesh
    (``mesh_name`` checks ``--name``, ``seconds`` checks ``--timeout``, as for the other subcommands)."""
    p = sub.add_parser(
        "torchrun",
        help="run a torchrun script, unmodified, on every proc (RANK, WORLD_SIZE, MASTER_ADDR... set as torchrun does)",
        description="Run SCRIPT on every proc of a mesh as torchrun's workers would: the mesh's shape is "
        "the job's (its last dim is the node-local one), the first proc hosts the rendezvous.",
    )
    p.add_argument("--name", type=mesh_name, help="the mesh (default: the current one)")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, run as python -m does")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, help="checked against the mesh's last dim")
    p.add_argument("--nnodes", type=int, help="checked against the mesh's size divided by --nproc-per-node")
    p.add_argument("--standalone", action="store_true", help="accepted: the rendezvous is always local to the job")
    p.add_argument("--master-addr", "--master_addr", help="rendezvous host (default: the first proc's)")
    p.add_argument("--master-port", "--master_port", type=int, help="rendezvous port (default: a free one)")
    p.add_argument(
        "--timeout", type=seconds, default=None, metavar="SECONDS", help="stop the run after this long (cancelled)"
    )
    p.add_argument("script", metavar="SCRIPT", help="the script's path (with -m: the module)")
    rest = p.add_argument("args", nargs=argparse.REMAINDER, default=[], metavar="ARGS", help="the script's own")
    rest.required = False  # argparse counts a REMAINDER as required: a missing SCRIPT named both


def _check_shape(entry: NamedMesh, args: argparse.Namespace) -> None:
    sizes = entry.procs.sizes
    local = sizes[list(sizes)[-1]]
    nodes = -(-len(entry.procs) // local)
    asked = {"--nproc-per-node": (args.nproc_per_node, local), "--nnodes": (args.nnodes, nodes)}
    for flag, (want, have) in asked.items():
        if want is not None and want != have:
            raise UsageError(
                f"{flag} {want}, but mesh '{entry.name}' {sizes} has {have}: the mesh is the job "
                f"(`%mesh scale` changes it); leave {flag} out"
            )
    if (args.master_addr is None) != (args.master_port is None):
        raise UsageError("give both --master-addr and --master-port, or neither")


def run(entry: NamedMesh, args: argparse.Namespace) -> None:
    """Run the script on ``entry``'s mesh and wait for it; print one line when every rank finished."""
    _check_shape(entry, args)
    argv = (["-m", args.script] if args.module else [args.script]) + list(args.args)
    fut = run_script(entry.procs, argv, master_addr=args.master_addr, master_port=args.master_port)
    results = _wait(entry, fut, args.timeout)
    where = fold_coords([dict(point) for point, _ in results.items()])
    print(f"torchrun {args.script}: {len(results)} ranks finished ({where})")


def _wait(entry: NamedMesh, fut: Future[Any], timeout: float | None) -> Any:
    try:
        return fut.get(timeout)
    except MeshInterrupted as e:
        if not e.still_running:
            raise
        raise MeshInterrupted(_restart_stuck(entry, str(e), e.still_running)) from None
    except KeyboardInterrupt:
        fut.cancel()
        raise
    except MeshTimeoutError as e:  # cancelled as an interrupt is, stuck ranks restarted alike
        report = fut._cancel_reported()
        still = getattr(report, "still_running", None)
        if still:
            how = _restart_stuck(entry, "it was cancelled", still)
        else:
            how = str(report).removeprefix("Interrupted: ") if report else "it was cancelled on its ranks"
        raise MeshTimeoutError(e.phase, e.seconds, f"{e.what}; {how}" if e.what else how) from None
    except ActorError as e:
        raise root_causes_first(e) from None


def _restart_stuck(entry: NamedMesh, message: str, stuck: list[dict[str, int]]) -> str:
    """Kill and respawn the procs of ranks that did not stop; the interrupt's message, amended."""
    index = {tuple(c.items()): i for i, c in enumerate(_coords(entry))}
    restart_ranks(entry.procs, [index[tuple(c.items())] for c in stuck if tuple(c.items()) in index])
    return (
        f"{message.split(';')[0]}; {fold_coords(stuck)} did not stop (native code: a collective or the "
        "rendezvous waiting for ranks that left), so their procs were restarted; their %%mesh variables "
        "start empty, and every rank is free for the next run."
    )


def _coords(entry: NamedMesh) -> list[dict[str, int]]:
    sizes = entry.procs.sizes
    return [dict(zip(sizes, c)) for c in itertools.product(*(range(n) for n in sizes.values()))]
