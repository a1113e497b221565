"""Jobs give host meshes: each puts one jupyter_mesh agent on every host it holds.

``LocalJob`` starts agents as children of this program (the embedded default behind ``this_host()``).
A job never manages a cluster itself: a scheduler places hosts, our agent only starts procs on the
host it runs on. A new scheduler is a subclass of :class:`Job`, registered under a name in the
``jupyter_mesh.jobs`` entry-point group (:mod:`.registry`): a plugin, not a change here.

``SlurmJob`` puts an agent on each node of a SLURM allocation; ``TorchXJob`` on each replica of a
TorchX app (any TorchX scheduler); ``AttachJob`` / ``attach_to_workers`` attach agents started by
hand (``jupyter-mesh agent --listen``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import lazy as _lazy

if TYPE_CHECKING:  # what type checkers read; at run time each name loads on first use (_core.lazy says why)
    from .._runtime.hosts import AgentHandle, Job
    from .attach import AttachJob, attach_to_workers
    from .local import BootstrapCommand, LocalJob, default_bootstrap_cmd, this_host
    from .process import JobState, ProcessJob, hosts_from_config
    from .registry import job_class, job_names
    from .singletons import get_or_spawn_controller, this_proc
    from .slurm import SlurmJob
    from .torchx import TorchXJob

_HOME = {
    **dict.fromkeys(["AgentHandle", "Job"], ".._runtime.hosts"),
    **dict.fromkeys(["AttachJob", "attach_to_workers"], ".attach"),
    **dict.fromkeys(["BootstrapCommand", "LocalJob", "default_bootstrap_cmd", "this_host"], ".local"),
    **dict.fromkeys(["JobState", "ProcessJob", "hosts_from_config"], ".process"),
    **dict.fromkeys(["job_class", "job_names"], ".registry"),
    **dict.fromkeys(["get_or_spawn_controller", "this_proc"], ".singletons"),
    "SlurmJob": ".slurm",
    "TorchXJob": ".torchx",
}

if not TYPE_CHECKING:
    __getattr__ = _lazy.loader(__name__, _HOME, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AgentHandle",
    "AttachJob",
    "BootstrapCommand",
    "Job",
    "JobState",
    "LocalJob",
    "ProcessJob",
    "SlurmJob",
    "TorchXJob",
    "attach_to_workers",
    "default_bootstrap_cmd",
    "get_or_spawn_controller",
    "hosts_from_config",
    "job_class",
    "job_names",
    "this_host",
    "this_proc",
]
