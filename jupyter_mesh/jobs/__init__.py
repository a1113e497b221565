"""Jobs give host meshes: each puts one jupyter_mesh agent on every host it holds.

``LocalJob`` starts agents as children of this program (the embedded default behind ``this_host()``).
A job never manages a cluster itself: a scheduler places hosts, our agent only starts procs on the
host it runs on. A new scheduler is a subclass of :class:`Job`, registered under a name in the
``jupyter_mesh.jobs`` entry-point group (:mod:`.registry`): a plugin, not a change here.

``SlurmJob`` puts an agent on each node of a SLURM allocation; ``TorchXJob`` on each replica of a
TorchX app (any TorchX scheduler); ``AttachJob`` / ``attach_to_workers`` attach agents started by
hand (``jupyter-mesh agent --listen``).
"""

from .._runtime.hosts import AgentHandle, Job
from .attach import AttachJob, attach_to_workers
from .local import LocalJob, this_host
from .registry import job_class, job_names
from .slurm import SlurmJob
from .torchx import TorchXJob

__all__ = [
    "AgentHandle",
    "AttachJob",
    "Job",
    "LocalJob",
    "SlurmJob",
    "TorchXJob",
    "attach_to_workers",
    "job_class",
    "job_names",
    "this_host",
]
