"""Monarch's job constructors, translated: ``SlurmJob(meshes={"mesh0": 2}, job_name=..., gpus_per_node=8,
time_limit=...)`` and ``LocalJob(hosts=("trainers", ...))`` as Monarch's notebooks write them.

What we can honour becomes our own arguments (``sbatch`` options, the job's name and time, the nodes);
what we cannot is refused here with why and what to do instead, before anything is submitted. Two
keywords are accepted without effect, said where they are read: ``monarch_port`` (our agents dial back to
the controller: no port is opened on the nodes) and ``log_dir`` (the job's output goes to its file in
``~/.jupyter_mesh/jobs``, which errors name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import MeshValueError

if TYPE_CHECKING:
    from .._api.host_mesh import HostMesh

__all__ = ["JobState", "MonarchSlurm", "host_names", "mesh_slices", "slurm_from_monarch"]


class JobState:
    """The host meshes of a job, by name: ``state.trainers`` is the ``HostMesh`` named "trainers"."""

    def __init__(self, hosts: Mapping[str, HostMesh]):
        self._hosts = dict(hosts)

    def __getattr__(self, name: str) -> HostMesh:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._hosts[name]
        except KeyError:
            raise AttributeError(f"'{name}' is not a host mesh of this job; it has {sorted(self._hosts)}") from None


@dataclass
class MonarchSlurm:
    """Monarch's keywords as ours: ``nodes`` in all, ``meshes`` by name (in order), more ``sbatch``
    options, and the overrides of our ``name``, ``time`` and ``python`` (None: ours stand)."""

    nodes: int
    meshes: dict[str, int]
    sbatch: list[str] = field(default_factory=list)
    name: str | None = None
    time: str | None = None
    python: str | None = None


def _positive(label: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise MeshValueError(f"SlurmJob({label}=...) takes an int >= 1, got {value!r}")
    return value


def check_meshes(meshes: Mapping[str, int], who: str) -> dict[str, int]:
    """``{"trainers": 2, ...}``: identifier names, each a number of hosts >= 1."""
    if not isinstance(meshes, Mapping) or not meshes:
        raise MeshValueError(f"{who}(meshes=...) takes {{name: hosts}}, e.g. {{'mesh0': 2}}, got {meshes!r}")
    for name, n in meshes.items():
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or isinstance(n, bool)
            or not isinstance(n, int)
            or n < 1
        ):
            raise MeshValueError(f"{who} needs {{name: hosts >= 1}} with identifier names, got {name!r}: {n!r}")
    return dict(meshes)


MONARCH_SLURM_POSITIONAL = (
    "python_exe slurm_args monarch_port job_name ntasks_per_node time_limit partition log_dir exclusive "
    "gpus_per_node cpus_per_task mem job_start_timeout account qos out_of_cluster attach_to bind_to"
).split()
"""Monarch's ``SlurmJob`` parameters after ``meshes``, in its order."""


def monarch_positional(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Monarch's ``SlurmJob(meshes, python_exe, slurm_args, ...)`` called positionally: the arguments
    after the meshes by Monarch's names (ours come in another order: ``"python3"`` second would have
    been the partition)."""
    if len(args) > len(MONARCH_SLURM_POSITIONAL):
        raise TypeError(
            f"SlurmJob() takes at most {len(MONARCH_SLURM_POSITIONAL) + 1} positional arguments in Monarch's form "
            f"(meshes first), {len(args) + 1} were given"
        )
    named = dict(zip(MONARCH_SLURM_POSITIONAL, args))
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"SlurmJob() got multiple values for argument(s) {twice}")
    return {**named, **kwargs}


def slurm_from_monarch(
    meshes: Mapping[str, int],
    *,
    job_name: str | None = None,
    time_limit: str | None = None,
    python_exe: str | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    mem: str | None = None,
    qos: str | None = None,
    exclusive: bool = False,
    ntasks_per_node: int = 1,
    job_start_timeout: int | None = None,
    out_of_cluster: bool = False,
    attach_to: str | None = None,
    bind_to: str | None = None,
) -> MonarchSlurm:
    """Check Monarch's ``SlurmJob`` keywords and give ours; refuse those we cannot honour."""
    named = check_meshes(meshes, "SlurmJob")
    if ntasks_per_node != 1:
        raise MeshValueError(
            f"SlurmJob(ntasks_per_node={ntasks_per_node!r}): here one agent per node starts every proc of that "
            "node; ask for the procs with host_mesh.spawn_procs(per_host={'gpus': N}) instead"
        )
    if out_of_cluster or attach_to is not None:
        raise MeshValueError(
            "SlurmJob(out_of_cluster=/attach_to=): here the nodes dial back to this controller, which must be "
            "reachable from them; pass bind='IP' (this host's address they reach), or run the notebook on a "
            "node of the cluster"
        )
    if bind_to is not None:
        raise MeshValueError(
            f"SlurmJob(bind_to={bind_to!r}): the agents here open no port on the nodes (they dial back); "
            "to choose the address of this controller that the nodes reach, pass bind='IP'"
        )
    if job_start_timeout is not None:
        raise MeshValueError(
            "SlurmJob(job_start_timeout=...): here the wait for the nodes is the spawn's: pass "
            "spawn_procs(..., timeout=seconds)"
        )
    sbatch: list[str] = []
    if gpus_per_node is not None:
        sbatch.append(f"--gpus-per-node={_positive('gpus_per_node', gpus_per_node)}")
    if cpus_per_task is not None:
        sbatch.append(f"--cpus-per-task={_positive('cpus_per_task', cpus_per_task)}")
    if mem is not None:
        if not isinstance(mem, str) or not re.fullmatch(r"\d+[KMGT]?B?", mem):
            raise MeshValueError(f"SlurmJob(mem={mem!r}): give SLURM's form, e.g. '64G' or '512000M'")
        sbatch.append(f"--mem={mem}")
    if qos is not None:
        if not isinstance(qos, str) or not re.fullmatch(r"[\w.@+-]{1,64}", qos):
            raise MeshValueError(f"SlurmJob(qos={qos!r}) is not a SLURM qos name")
        sbatch.append(f"--qos={qos}")
    if not isinstance(exclusive, bool):
        raise MeshValueError(f"SlurmJob(exclusive=...) is True or False, got {exclusive!r}")
    if exclusive:
        sbatch.append("--exclusive")
    return MonarchSlurm(sum(named.values()), named, sbatch, job_name, time_limit, python_exe)


def mesh_slices(meshes: Mapping[str, int]) -> dict[str, slice]:
    """Each named mesh's hosts among the job's, in order: ``{"a": 2, "b": 1}`` -> a: 0-1, b: 2."""
    out, start = {}, 0
    for name, n in meshes.items():
        out[name] = slice(start, start + n)
        start += n
    return out


def host_names(hosts: Sequence[str]) -> tuple[str, ...]:
    """Monarch's ``LocalJob(hosts=("trainers", ...))``: names of host meshes, each this machine."""
    names = tuple(hosts)
    if not names or not all(isinstance(h, str) and h.isidentifier() for h in names):
        raise MeshValueError(
            f"LocalJob(hosts=...) takes a number of hosts (ours) or names of host meshes (Monarch's, e.g. "
            f"('trainers',)), got {hosts!r}"
        )
    return names
