"""Jobs give host meshes: each puts one jupyter_mesh agent on every host it holds.

``LocalJob`` starts agents as children of this program (the embedded default behind ``this_host()``).
A job never manages a cluster itself: a scheduler places hosts, our agent only starts procs on the
host it runs on. A new scheduler is a subclass of :class:`Job`.

``SlurmJob`` puts an agent on each node of a SLURM allocation; ``AttachJob`` / ``attach_to_workers``
attach agents started by hand (``jupyter-mesh agent --listen``).
"""

from .._runtime.hosts import AgentHandle, Job
from .attach import AttachJob, attach_to_workers
from .local import LocalJob, this_host
from .slurm import SlurmJob

__all__ = ["AgentHandle", "AttachJob", "Job", "LocalJob", "SlurmJob", "attach_to_workers", "this_host"]
