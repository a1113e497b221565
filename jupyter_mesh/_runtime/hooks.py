"""Two seams of the controller: what a proc lends a controller created inside it (``Embedding``), and
what happens to a failure no call was told about (the fault hook: fail fast by default)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .._core.context import context
from ..errors import MeshFailure, SupervisionError

if TYPE_CHECKING:
    from .._wire.protocol import Dispatch
    from .._wire.transport import Transport
    from .client import Client

__all__ = [
    "Embedding",
    "FaultHook",
    "embed",
    "embedding",
    "fail_fast",
    "fault_hook",
    "hold_faults_with",
    "set_fault_hook",
]


@dataclass
class Embedding:
    """What a proc lends a controller created inside it (see ``Controller.__init__``)."""

    key: bytes
    transport: Transport
    client: Client
    route: Callable[[Dispatch], None]  # the proc hands the kinds it does not handle to this table
    # the actor that is spawning (per thread), so its __supervise__ hears of its meshes' failures
    current_owner: Callable[[], Any]
    supervise: Callable[[Any, SupervisionError], None]
    # (callback): the proc calls it with (proc mesh id, rank, Failure) for every rank failure it hears of
    watch_failures: Callable[[Callable[[str, int, Any], None]], None]


def embed(value: Embedding) -> None:
    """Called once by a proc at start-up: a Controller created later in it will share its runtime."""
    context().embedding = value


def embedding() -> Embedding | None:
    """The proc's runtime to share, when this process is a proc; None in a controller's own program."""
    return cast("Embedding | None", context().embedding)


FaultHook = Callable[[MeshFailure], None]
"""Called (on the runtime's receive thread) with a failure that no pending call was told about: a
:class:`MeshFailure`, which is a ``SupervisionError`` (hooks written for one still work)."""


def fail_fast(err: SupervisionError) -> None:
    """The default in scripts: say it now, raise it at the next API call, exit non-zero if ignored."""
    print(f"jupyter_mesh: unhandled failure: {err}", file=sys.stderr)
    hold = _fault_holder
    if hold is not None:
        hold(err)


_fault_holder: Callable[[SupervisionError], None] | None = None


def hold_faults_with(holder: Callable[[SupervisionError], None] | None) -> None:
    """The controller of this program keeps failures that ``fail_fast`` saw, to raise them at the
    next API call (set when it starts, cleared when it closes)."""
    global _fault_holder
    _fault_holder = holder


_hook: FaultHook = fail_fast


def set_fault_hook(hook: FaultHook | None) -> FaultHook:
    """Install ``hook`` for unhandled failures (None restores fail-fast); returns the previous one.

    A Jupyter kernel installs one that shows the failure and never kills the kernel.
    """
    global _hook
    prev, _hook = _hook, hook or fail_fast
    return prev


def fault_hook(err: MeshFailure) -> None:
    """Hand ``err`` to the installed hook."""
    _hook(err)
