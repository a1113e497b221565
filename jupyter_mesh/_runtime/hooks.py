"""Two seams of the controller: what a proc lends a controller created inside it (``Embedding``), and
what happens to a failure no call was told about (the fault hook: fail fast by default).

Two hooks may see such a failure: ours (``set_fault_hook``: gets the ``SupervisionError``) and Monarch's
(``jupyter_mesh.unhandled_fault_hook = f``: gets a ``MeshFailure`` per failed rank). Monarch's, when set,
goes first: returning means handled, raising means unhandled, and the failure then goes to ours.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import traceback
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
    "DRAIN_AT_EXIT_S",
    "Embedding",
    "FaultHook",
    "drain_fault_hooks",
    "embed",
    "embedding",
    "fail_fast",
    "fault_hook",
    "hold_faults_with",
    "monarch_fault_hook",
    "set_fault_hook",
    "set_monarch_fault_hook",
    "unhandled_fault_hook",
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
"""Called with a failure that no pending call was told about: a :class:`MeshFailure`, which is a
``SupervisionError`` (hooks written for one still work). A hook the user installed runs on a thread of
its own (``jupyter-mesh-faults``), one failure after the other, so it may respawn, call and wait."""


def fail_fast(err: SupervisionError) -> None:
    """The default in scripts: say it now and stop the program where it is (Monarch's default: a
    ``KeyboardInterrupt`` in the main thread); a program that catches that gets the failure raised
    at its next API call; it exits 1 if it never looked."""
    print(f"jupyter_mesh: unhandled failure: {err}", file=sys.stderr)
    hold = _fault_holder
    if hold is not None and hold(err):
        _interrupt_main()


def _interrupt_main() -> None:
    """A ``KeyboardInterrupt`` in the main thread now, even in a ``sleep`` or a lock's wait (a signal
    aimed at that thread wakes it): the program stops where it is, its ``finally`` blocks and atexit
    handlers run. Not in a proc (there a mesh's failures are its owner's to supervise), not in a kernel
    (whose hook shows the failure: the kernel lives), not when the main thread is the one that saw it
    (it raises at the next API call) or has ended, nor where the program handles SIGINT no Python way."""
    main = threading.main_thread()
    if embedding() is not None or threading.current_thread() is main or not main.is_alive():
        return
    app = sys.modules.get("ipykernel.kernelapp")
    if app is not None and app.IPKernelApp.initialized():
        return
    if not callable(signal.getsignal(signal.SIGINT)) or main.ident is None:
        return  # ignored (SIG_IGN) or left to the OS: exit 1 at the end, as before
    print(
        "jupyter_mesh: stopping the program (KeyboardInterrupt in its main thread); to handle such "
        "failures instead, set jupyter_mesh.unhandled_fault_hook = f (or lowlevel.set_fault_hook)",
        file=sys.stderr,
        flush=True,
    )
    signal.pthread_kill(main.ident, signal.SIGINT)


_fault_holder: Callable[[SupervisionError], bool] | None = None


def hold_faults_with(holder: Callable[[SupervisionError], bool] | None) -> None:
    """The controller of this program keeps failures that ``fail_fast`` saw, to raise them at the
    next API call (set when it starts, cleared when it closes). It says whether the failure is the
    first one held since the program last saw one (only that one interrupts the main thread)."""
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


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default of ``jupyter_mesh.unhandled_fault_hook``: the failure goes to our fault hook (in a
    script: fail fast, as Monarch's default exits; in a kernel: shown, the kernel lives)."""
    _hook(failure)


_monarch_hook: Callable[[MeshFailure], object] = unhandled_fault_hook


def monarch_fault_hook() -> Callable[[MeshFailure], object]:
    return _monarch_hook


def set_monarch_fault_hook(hook: Callable[[MeshFailure], object] | None) -> None:
    """What ``jupyter_mesh.unhandled_fault_hook = hook`` does (None restores the default)."""
    global _monarch_hook
    _monarch_hook = hook or unhandled_fault_hook


DRAIN_AT_EXIT_S = 10.0
"""How long the program's exit waits for the user's fault hook to finish the failures it was handed."""


def fault_hook(err: MeshFailure) -> None:
    """Hand ``err`` to the installed hooks: Monarch's first (once per failed rank), if the user set it.

    Called on the receive thread, which alone reads replies: a hook run there that respawns or calls
    and waits (the natural thing to do about a failure) could never be answered (``MeshDeadlockError``),
    and a slow one would hold every other message up. So hooks the user installed run on a thread of
    their own, in order; the default (fail fast) stays inline, so that the next API call already
    raises what it holds."""
    if _monarch_hook is unhandled_fault_hook and _hook is fail_fast:
        _call_hooks(err)
        return
    global _hook_thread
    with _hook_lock:
        if _hook_thread is None or not _hook_thread.is_alive():  # (a forked child has none running)
            _hook_thread = threading.Thread(target=_run_hooks, name="jupyter-mesh-faults", daemon=True)
            _hook_thread.start()
        _hook_queue.put(err)


_hook_queue: queue.SimpleQueue[MeshFailure | threading.Event] = queue.SimpleQueue()
_hook_lock = threading.Lock()
_hook_thread: threading.Thread | None = None


def drain_fault_hooks(timeout: float = DRAIN_AT_EXIT_S) -> bool:
    """Wait until the failures handed to the hook thread so far were delivered (a test that asserts
    the hook heard nothing asks this first); False if a hook still runs after ``timeout``."""
    with _hook_lock:
        if _hook_thread is None or not _hook_thread.is_alive():
            return True
        done = threading.Event()
        _hook_queue.put(done)
    return done.wait(timeout)


def _run_hooks() -> None:
    while True:
        err = _hook_queue.get()
        if isinstance(err, threading.Event):  # ``drain_fault_hooks``: everything before it is delivered
            err.set()
            continue
        try:
            _call_hooks(err)
        except BaseException:  # noqa: BLE001 - a broken hook (even sys.exit) must not end the next ones
            traceback.print_exc()


def _call_hooks(err: MeshFailure) -> None:
    mh = _monarch_hook
    if mh is not unhandled_fault_hook:
        try:
            for failure in err.failures:
                mh(MeshFailure([failure], err.context))
            return
        except BaseException as e:  # noqa: BLE001 - a raising hook (even sys.exit) leaves it unhandled
            print(f"jupyter_mesh: unhandled_fault_hook raised {type(e).__name__}: {e}", file=sys.stderr)
    _hook(err)
