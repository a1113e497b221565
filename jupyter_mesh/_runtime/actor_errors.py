"""What an error that no caller receives does to an actor: Monarch's way by default, the kernel's where
a notebook needs it. Each spawn carries the mode its spawner had (the ``fa`` header key), so an actor
mesh keeps the behaviour it was spawned with.

``fatal`` (the default, Monarch's): an exception under ``broadcast()``, or a ``BaseException`` that is
not our own cancellation (``SystemExit``, a custom ``BaseException``), ends the actor; its later calls
raise ``SupervisionError`` and the failure reaches the spawner's ``__supervise__`` or fault hook.
``survive`` (the ``mesh`` kernel's, where a typo must not cost the notebook its actors): the broadcast's
error is reported the same way but the actor lives on, and a ``BaseException`` is the caller's
``ActorError``.
"""

from __future__ import annotations

from ..errors import MeshValueError

__all__ = ["MODES", "fatal", "set_actor_errors"]

MODES = ("fatal", "survive")
_mode = "fatal"


def set_actor_errors(mode: str) -> str:
    """The mode for actor meshes spawned from now on (in this process); returns the previous one."""
    global _mode
    if mode not in MODES:
        raise MeshValueError(f"the actor errors mode must be one of {MODES}, got {mode!r}")
    prev, _mode = _mode, mode
    return prev


def fatal() -> bool:
    """Whether a spawn asks its actors to end on errors no caller receives."""
    return _mode == "fatal"
