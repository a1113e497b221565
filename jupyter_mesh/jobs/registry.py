"""Schedulers by name: the ``jupyter_mesh.jobs`` entry-point group.

A package adds a scheduler (Kubernetes, a cloud's batch service, a site's own launcher) by declaring
one entry point, with no change here::

    [project.entry-points."jupyter_mesh.jobs"]
    myk8s = "my_package.jobs:K8sJob"

The class is a :class:`~jupyter_mesh.jobs.Job`. ``%mesh up --scheduler NAME[:SUB]`` and
:func:`make_job` construct it as ``cls(nodes=N, preload=[...], **options)``, with ``scheduler=SUB``
when the name carries one (``torchx:slurm``) and ``scheduler_args={...}`` when given, and it gives
its hosts with ``host_mesh()`` (a ``HostMesh(controller, job, Shape.from_sizes({"hosts": N}))``).

jupyter_mesh registers its own (``local``, ``slurm``, ``attach``, ``torchx``) in the same group; they
are also known without it (a source checkout whose installed metadata is older), and an entry point
of another package under one of their names does not replace them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import MeshError, MeshValueError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from .._runtime.hosts import Job

__all__ = ["GROUP", "job_class", "job_names", "make_job"]

GROUP = "jupyter_mesh.jobs"

BUILTIN = {
    "attach": "jupyter_mesh.jobs.attach:AttachJob",
    "local": "jupyter_mesh.jobs.local:LocalJob",
    "slurm": "jupyter_mesh.jobs.slurm:SlurmJob",
    "torchx": "jupyter_mesh.jobs.torchx:TorchXJob",
}


def _plugins() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


def job_names() -> list[str]:
    """Every scheduler this environment knows: ours and those of installed packages, sorted."""
    return sorted({*BUILTIN, *_plugins()})


def job_class(name: str) -> type[Job]:
    """The job class registered under ``name``; a clear error naming the installed ones if none is."""
    from .._runtime.hosts import Job

    if not isinstance(name, str) or not name:
        raise MeshValueError(f"a scheduler name is a string like 'slurm', got {name!r}")
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
        where = "jupyter_mesh"
    else:
        ep = _plugins().get(name)
        if ep is None:
            raise MeshValueError(
                f"no scheduler named {name!r}: installed are {', '.join(job_names())}. A package adds one with "
                f'an entry point in the group "{GROUP}" (e.g. `{name} = "my_package.jobs:MyJob"`); '
                f"install it in this environment"
            )
        dist = getattr(ep, "dist", None)
        where = f"{getattr(dist, 'name', None) or 'a package'} ({ep.value})"
        try:
            cls = ep.load()
        except Exception as e:  # any import error of a plugin: name it and its package
            raise MeshError(f"the scheduler {name!r} of {where} does not load: {type(e).__name__}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Job) and callable(getattr(cls, "host_mesh", None))):
        raise MeshValueError(
            f"the scheduler {name!r} of {where} is {cls!r}, not a jupyter_mesh.jobs.Job subclass with a "
            f"host_mesh() method: fix its entry point"
        )
    return cls


def make_job(spec: str, nodes: int, preload: Sequence[str] | None = None, **options: Any) -> Job:
    """A job from ``NAME`` or ``NAME:SUB`` (``torchx:local_cwd``): ``job_class(NAME)(nodes=nodes,
    preload=preload, scheduler=SUB, **options)``. ``local`` takes ``hosts=``; ``attach`` needs
    addresses, not a count (``AttachJob([...])``). ``preload=None`` is not passed: the job's own
    default applies (ours: warm, ``jobs.warm``)."""
    name, sep, sub = spec.partition(":")
    if sep and not sub:
        raise MeshValueError(f"scheduler {spec!r}: write NAME or NAME:SUB, e.g. torchx:local_cwd")
    if name == "attach":
        raise MeshValueError("the attach scheduler takes agents' addresses: %mesh up --attach tcp://IP:PORT,...")
    cls = job_class(name)
    if sub:
        options["scheduler"] = sub
    kwargs: dict[str, Any] = {"hosts" if name == "local" else "nodes": nodes, **options}
    if preload is not None:
        kwargs["preload"] = list(preload)
    try:
        sig = inspect.signature(cls)
        sig.bind(**kwargs)
        # a job taking ``**options`` names those it knows (SlurmJob: Monarch's keywords)
        extra: frozenset[str] | None = getattr(cls, "extra_keywords", None)
        unknown = sorted(set(kwargs) - set(sig.parameters) - extra) if extra is not None else []
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}")
    except TypeError as e:
        raise MeshValueError(f"the scheduler {spec!r} ({cls.__name__}) does not take {sorted(kwargs)}: {e}") from None
    return cls(**kwargs)
