"""The ``mesh`` kernel ("Python 3 (mesh)"): IPython with the controller and the magics loaded.

    python -m jupyter_mesh.notebook.kernel -f CONNECTION_FILE      (what kernel.json runs)

Shut Down and Restart stop every mesh, agent and proc before the kernel goes. A hard kill skips that:
then the agents see their stdin (the lifeline from this process) close and take their procs with them.
Interrupt (SIGINT to the kernel's process group) never reaches agents or procs: they run in sessions
of their own; the cell waiting on a call gets KeyboardInterrupt and the call is cancelled. A cell that
``await``s a call is interrupted at once too (plain ipykernel only cancels an awaiting cell once what it
awaits is done: ipython/ipykernel#881), and says where the call stopped, as ``get()`` does.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from .._core.future import INTERRUPTED
from .._version import __version__
from .extension import front_of, load

__all__ = ["MeshKernel", "main"]


class MeshKernel(IPythonKernel):
    implementation = "jupyter_mesh"
    implementation_version = __version__
    banner = "Python 3 (mesh) - jupyter_mesh " + __version__ + ": `%mesh up` starts a mesh, `%mesh -h` lists commands"

    def __init__(self, **kwargs: Any):
        _debug_only_this_process()
        super().__init__(**kwargs)
        load(self.shell)
        from ..ui import install

        install(self)  # serve the JupyterLab sidebar over a comm (kernel kind "mesh")
        warm_up()

    @contextmanager
    def _cancel_on_sigint(self, future: asyncio.Future[Any]) -> Iterator[None]:
        """While a cell runs as a coroutine (it has a top-level ``await``): Ctrl-C / ■ cancels it.

        ipykernel's own version schedules the cancel with ``call_soon`` from the signal handler,
        which does not wake the event loop: the cancel waits until whatever the cell awaits is
        done (ipykernel#881). ``call_soon_threadsafe`` wakes it. When the signal lands while the
        cell's own code runs (a blocking ``.get()`` inside an async cell) the loop cannot run the
        cancel at all, so the cell gets ``KeyboardInterrupt`` there, as a plain cell would.
        """
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            if not future.done():
                future.cancel(msg=INTERRUPTED)

        def on_sigint(signum: int, frame: Any) -> None:
            if asyncio.current_task(loop) is future:
                raise KeyboardInterrupt
            loop.call_soon_threadsafe(cancel)

        saved = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, saved)

    async def do_shutdown(self, restart: bool) -> Any:
        front = front_of(self.shell)
        if front is not None:
            front.shutdown()
        result = super().do_shutdown(restart)
        if inspect.isawaitable(result):
            result = await result
        return result


def warm_up() -> threading.Thread | None:
    """Start this machine's host (agent and fork server, preloading torch) in the background, so the
    first ``this_host().spawn_procs(...)`` forks from a ready template. Opt out: ``JUPYTER_MESH_WARM=0``."""
    from ..jobs import warm

    if not warm.enabled():
        return None

    def start() -> None:
        from ..jobs.local import this_host

        try:
            this_host()
        except Exception as e:  # noqa: BLE001 - the first this_host() in a cell tries again and raises
            print(
                f"jupyter_mesh: warming this host failed ({e}); this_host() will start it on first use", file=sys.stderr
            )

    t = threading.Thread(target=start, name="jupyter-mesh-warm", daemon=True)
    t.start()
    return t


def _debug_only_this_process() -> None:
    """JupyterLab's debugger (debugpy, started in this kernel on its first ``debug_request``) debugs
    the controller's code, not the mesh's agents and procs: by default debugpy injects itself into
    every Python child process, and an agent started so does not report in (its spawn times out).
    Breakpoints in the frozen stdlib do not matter here, so its warning about them is off too."""
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        import debugpy
    except ImportError:  # no debugpy: ipykernel offers no debugger either
        return
    try:
        debugpy.configure(subProcess=False)
    except Exception:  # noqa: BLE001 - an older or newer debugpy: its default, said once
        print("jupyter_mesh: could not keep debugpy out of the mesh's processes", file=sys.stderr)


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=MeshKernel)


if __name__ == "__main__":
    main()
