"""Running an unmodified script (or ``-m module``) as ``__main__`` inside a proc, as ``python`` would.

``sys.argv`` is the script's command line, the script's folder (for ``-m``: the working directory)
comes first on ``sys.path``, and both are put back afterwards. Whatever way the script ends —
returning, raising, ``sys.exit``, or cancelled by an interrupt — a process group it left behind is
destroyed, so the proc can run the next script (another ``init_process_group`` would fail on it),
and peers still waiting on it in a collective get an error at once instead of waiting out gloo's
30-minute timeout.

Then the script's objects are released, at a moment we choose. A gloo process group's destructor
joins its worker threads while holding the GIL, and a worker that is still letting go of its last
finished collective needs the GIL for that (tensors decref their Python objects): the proc then
hangs for good (seen with DDP, whose reducer holds the group, when the script's globals went away
right after its last ``barrier``). Under ``torchrun`` the process ends with the script; here the
proc lives on, so the workers get a moment without the GIL first: idle workers hold nothing, and the
group can then go whenever its last reference does (the script's globals right after; objects in
reference cycles at a later collection).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .._runtime import interrupts

__all__ = ["ScriptExit", "release_process_group", "run_program", "script_traceback"]

WORKER_PAUSE, WORKER_PAUSES = 0.02, 5  # seconds without the GIL for collective threads after a run, in slices


class ScriptExit(RuntimeError):
    """The script called ``sys.exit`` with a failure status (argparse does so on bad arguments)."""

    def __init__(self, program: str, code: object):
        self.program, self.code = program, code
        what = f"status {code}" if isinstance(code, int) else repr(code)
        super().__init__(f"{program} exited with {what} (sys.exit); its output above says why")


def run_program(script_args: Sequence[str]) -> None:
    """``[path, *args]`` or ``["-m", module, *args]``, run to its end in this thread."""
    args = [str(a) for a in script_args]
    if not args or (args[0] == "-m" and len(args) < 2):
        raise ValueError("no script or module to run: give [path, *args] or ['-m', module, *args]")
    module = args[1] if args[0] == "-m" else None
    if module is None and not os.path.isfile(args[0]):
        raise FileNotFoundError(
            f"no script {args[0]!r} here (working directory {os.getcwd()}); procs start in the "
            "controller's working directory: give a path that exists on every host, or an absolute one"
        )
    saved_argv, saved_path = sys.argv, list(sys.path)
    script_globals: dict[str, Any] = {}
    try:
        if module is not None:
            sys.argv = [module, *args[2:]]  # runpy puts the module's file in argv[0], as python -m does
            sys.path.insert(0, os.getcwd())
            script_globals = runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            script_globals = runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptExit(module or args[0], e.code) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        _cleanup(script_globals)


def script_traceback(tb: TracebackType | None, script_args: Sequence[str]) -> TracebackType | None:
    """``tb`` from the script's first frame on (ours and runpy's left out), or ``tb`` itself when the
    error did not come from the script (a missing file, a bad ``-m``)."""
    args = [str(a) for a in script_args]
    if not args:
        return tb
    target = args[1].replace(".", os.sep) if args[0] == "-m" else os.path.abspath(args[0])
    node = tb
    while node is not None:
        filename = os.path.abspath(node.tb_frame.f_code.co_filename)
        if filename == target or (args[0] == "-m" and os.path.splitext(filename)[0].endswith(target)):
            return node
        node = node.tb_next
    return tb


def _cleanup(script_globals: dict[str, Any]) -> None:
    """Destroy the process group, let its threads finish, drop the script's objects (a cancel is
    held off meanwhile: one that lands now waits until this is done)."""
    held = interrupts.hold()
    try:
        release_process_group()
        if "torch.distributed" in sys.modules:
            for _ in range(WORKER_PAUSES):  # each sleep hands the GIL to a collective thread waiting for it
                time.sleep(WORKER_PAUSE)
            script_globals.clear()  # what only the script held goes now; cycles at the next collection, safely
    finally:
        if held:
            interrupts.release()


def release_process_group() -> bool:
    """Destroy torch's default process group (and every other one) if a script left it; True if it did.

    Without one, torch's count of group names is put back to 0 as a destroy would: each
    ``init_process_group`` takes the next name first ("0", "1", ...) and only a destroy resets the
    count, so a rank whose ``init_process_group`` raised (a peer closed while it connected, a
    timeout) would meet the others of the next run under another name in the store, and every rank
    would wait there for gloo's 30 minutes."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:  # the script never imported it: nothing to release
        return False
    try:
        if not (dist.is_available() and dist.is_initialized()):
            _reset_group_names(dist)
            return False
        dist.destroy_process_group()
        return True
    except Exception as e:  # noqa: BLE001 - a broken group must not hide the script's own outcome
        print(f"[spmd] could not destroy the process group the script left: {e}", file=sys.stderr)
        return False


def _reset_group_names(dist: Any) -> None:
    """What ``destroy_process_group()`` does to torch's group-name count (private to torch: absent, nothing)."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    count = getattr(world, "group_count", None)
    if world is not None and isinstance(count, int) and count > 0:
        world.group_count = 0
