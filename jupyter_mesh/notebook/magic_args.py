"""The arguments of ``%mesh`` and ``%%mesh``: their argparse parsers (usage, help) and argument types.

Arguments are parsed from ``shlex.split(line)`` and never evaluated; a bad argument is an IPython
``UsageError`` that ends with the usage line (:class:`Parser`), ``-h`` prints the help and raises
:class:`HelpShown`.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from IPython.core.error import UsageError

from ..jobs.warm import is_module_name
from . import debug_magic
from .torchrun import add_parser as add_torchrun_parser

__all__ = ["HelpShown", "Parser", "build_parsers", "parse_slice", "rank_or_coords"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SLICE_PART = re.compile(r"^([A-Za-z_]\w*)=(?:(-?\d+)|(-?\d*):(-?\d*))$")


class HelpShown(Exception):
    """``-h``: the help was printed; nothing to run."""


class Parser(argparse.ArgumentParser):
    """argparse that reports to IPython instead of exiting the kernel."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            print(message)
        raise HelpShown


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def _seconds(text: str) -> float:
    """A ``--timeout``: a finite number of seconds above 0 (0, a negative, nan or inf would time out at
    once or never)."""
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (0 < t < math.inf):
        raise argparse.ArgumentTypeError(f"takes seconds, a finite number above 0 (e.g. 30); got {text!r}")
    return t


def _name(text: str) -> str:
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid mesh name (letters, digits and _, like a variable)")
    return text


def _slurm_name(text: str) -> str:
    """A SLURM partition name (SlurmJob takes the same): "gpu-a100", "long.q"."""
    if not re.fullmatch(r"[\w.@+-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a SLURM partition name")
    return text


def _modules(text: str) -> list[str]:
    mods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in mods if not is_module_name(m)]
    if bad or not mods:
        raise argparse.ArgumentTypeError(f"--preload takes module names, got {text!r}")
    return mods


def _agent_list(text: str) -> list[str]:
    from .._wire.addresses import parse_tcp

    addrs = [a.strip() for a in text.split(",") if a.strip()]
    try:
        return [f"tcp://{ip}:{port}" for ip, port in (parse_tcp(a) for a in addrs)] or _no_agents(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--attach: {e}") from None


def _scheduler(text: str) -> str:
    """``NAME`` or ``NAME:SUB`` of the ``jupyter_mesh.jobs`` entry points (checked when the mesh comes up)."""
    if not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}(:[\w.-]{1,64})?", text):
        raise argparse.ArgumentTypeError(f"--scheduler takes NAME or NAME:SUB (e.g. torchx:local_cwd), got {text!r}")
    return text


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", key):
        raise argparse.ArgumentTypeError(f"--scheduler-arg takes KEY=VALUE (e.g. partition=debug), got {text!r}")
    return key, value


def _no_agents(text: str) -> list[str]:
    raise argparse.ArgumentTypeError(f"--attach takes tcp://IP:PORT,... got {text!r}")


def parse_slice(text: str) -> dict[str, int | slice]:
    """``gpus=0:2,hosts=0`` -> ``{"gpus": slice(0, 2), "hosts": 0}`` (no eval)."""
    out: dict[str, int | slice] = {}
    for part in text.split(","):
        m = _SLICE_PART.match(part.strip())
        if not m:
            raise UsageError(f"bad --on slice {part!r}: write dim=i or dim=start:stop, e.g. --on gpus=0:2")
        dim, idx, start, stop = m.groups()
        if idx is not None:
            out[dim] = int(idx)
        else:
            out[dim] = slice(int(start) if start else None, int(stop) if stop else None)
    return out


def rank_or_coords(text: str) -> int | dict[str, int]:
    if text.isdigit():
        return int(text)
    coords: dict[str, int] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.isidentifier() or not v.isdigit():
            raise argparse.ArgumentTypeError(f"RANK is a global rank (3) or coordinates (hosts=0,gpus=3), got {text!r}")
        coords[k] = int(v)
    return coords


def build_parsers() -> tuple[Parser, Parser]:
    line = Parser(prog="%mesh", description="Bring meshes of procs up and down, look at them, move data.")
    sub = line.add_subparsers(dest="cmd", parser_class=Parser)  # its usage lists every subcommand
    sub.required = True

    up = sub.add_parser(
        "up",
        help="start a mesh of procs: local (one host agent per --hosts), on SLURM or another scheduler, or attached",
    )
    up.add_argument("--hosts", "--nodes", dest="hosts", type=_positive, default=None, help="hosts (scheduler nodes)")
    where = up.add_mutually_exclusive_group()
    where.add_argument("--slurm", action="store_true", help="hosts from SLURM (sbatch; srun inside an allocation)")
    where.add_argument(
        "--attach",
        type=_agent_list,
        metavar="ADDRS",
        help="agents started with `jupyter-mesh agent --listen`: tcp://IP:PORT,tcp://IP:PORT",
    )
    where.add_argument(
        "--scheduler",
        type=_scheduler,
        metavar="NAME[:SUB]",
        help="hosts from a scheduler of the jupyter_mesh.jobs entry points: slurm, torchx:local_cwd, torchx:slurm, ...",
    )
    up.add_argument(
        "--scheduler-arg",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of --scheduler (TorchX: its run options, e.g. partition=debug)",
    )
    up.add_argument("--partition", type=_slurm_name, help="SLURM partition")
    up.add_argument("--time", help="SLURM time limit (HH:MM:SS; default 01:00:00)")
    up.add_argument(
        "--keep-alive",
        action="store_true",
        help="the SLURM job outlives this kernel (until its time limit or %%mesh down): %%mesh reattach takes it back",
    )
    size = up.add_mutually_exclusive_group()
    size.add_argument("--procs", type=_positive, help="procs per host (dim 'procs'; default 2)")
    size.add_argument("--gpus", type=_positive, help="procs per host, one per GPU (dim 'gpus')")
    up.add_argument("--name", type=_name, default="procs", help="mesh name, also bound as a variable")
    up.add_argument(
        "--preload",
        type=_modules,
        action="append",
        default=[],
        help="modules every proc starts with (default: torch & co. where installed)",
    )

    sub.add_parser("status", help="the meshes, their procs and failed ranks")

    stacks = sub.add_parser("stacks", help="where every rank is now: each thread's Python stack, identical ones folded")
    stacks.add_argument("--name", type=_name)
    stacks.add_argument("--rank", type=rank_or_coords, metavar="RANK", help="one rank (global, or coordinates)")
    stacks.add_argument("--all-threads", action="store_true", help="also the runtime's waiting threads and frames")
    stacks.add_argument("--timeout", type=_seconds, default=5.0, metavar="SECONDS", help="how long a rank may take")

    debug_magic.add_parser(sub, rank_or_coords)

    reattach = sub.add_parser(
        "reattach", help="take back a SLURM job an earlier kernel kept alive (--keep-alive): its meshes and actors"
    )
    reattach.add_argument("job_id", nargs="?", metavar="JOB_ID", help="which job, when several are kept")
    reattach.add_argument("--force", action="store_true", help="take it from a kernel that still runs")

    down = sub.add_parser("down", help="stop a mesh (default: the current one)")
    down.add_argument("name", nargs="?", type=_name)
    down.add_argument("--all", action="store_true", help="stop every mesh")

    scale = sub.add_parser("scale", help="resize a mesh in place (or restart it when the shape cannot grow in place)")
    scale.add_argument("name", nargs="?", type=_name)
    scale.add_argument("--hosts", type=_positive)
    ssize = scale.add_mutually_exclusive_group(required=True)
    ssize.add_argument("--procs", type=_positive)
    ssize.add_argument("--gpus", type=_positive)

    kill = sub.add_parser("kill", help="kill one proc (to try failure handling)")
    kill.add_argument("rank", type=rank_or_coords, metavar="RANK", help="global rank, or coordinates like gpus=1")
    kill.add_argument("--name", type=_name)
    kill.add_argument("--signal", choices=["KILL", "TERM", "INT"], default="KILL")

    respawn = sub.add_parser("respawn", help="new procs for failed ranks (default: all of them)")
    respawn.add_argument("ranks", nargs="*", type=int, metavar="RANK")
    respawn.add_argument("--name", type=_name)

    logs = sub.add_parser("logs", help="worker output kept by the kernel")
    logs.add_argument("--name", type=_name)
    logs.add_argument("--rank", type=int, help="global rank")
    tail = logs.add_mutually_exclusive_group()
    tail.add_argument("--tail", type=_positive, default=100, help="last N lines (default 100)")
    tail.add_argument("--all", action="store_true", help="every kept line")
    logs.add_argument("--save", metavar="PATH", help="write the lines to a file instead of the cell")

    push = sub.add_parser("push", help="copy variables from here to every proc's %%%%mesh namespace")
    push.add_argument("names", nargs="+", metavar="NAME")
    push.add_argument("--name", dest="mesh", type=_name)

    pull = sub.add_parser("pull", help="gather a variable from every proc (a ValueMesh)")
    pull.add_argument("var", metavar="NAME")
    pull.add_argument("--name", dest="mesh", type=_name)

    reload = sub.add_parser(
        "reload", help="update live actors' methods to their class's new definition (a class redefined in a cell)"
    )
    reload.add_argument("names", nargs="*", metavar="NAME", help="actor mesh names (default: every redefined one)")

    add_torchrun_parser(sub, _name, _seconds)

    cell = Parser(prog="%%mesh", description="Run the cell on every proc of a mesh (or a slice of it).")
    cell.add_argument("--on", metavar="SLICE", help="e.g. gpus=0:2 or hosts=0,gpus=1")
    cell.add_argument("--name", type=_name)
    cell.add_argument("--no-stream", action="store_true", help="show output grouped by rank at the end")
    cell.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="stop waiting after this long and cancel the cell on every proc (as an interrupt does)",
    )
    return line, cell
