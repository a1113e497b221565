"""Jobs give host meshes: each puts one jupyter_mesh agent on every host it holds.

``LocalJob`` starts agents as children of this program (the embedded default behind ``this_host()``).
A job never manages a cluster itself: a scheduler places hosts, our agent only starts procs on the
host it runs on. A new scheduler is a subclass of :class:`Job`.
"""

from .._runtime.hosts import AgentHandle, Job
from .local import LocalJob, this_host

__all__ = ["AgentHandle", "Job", "LocalJob", "this_host"]
