"""The ``mesh`` kernel ("Python 3 (mesh)"): IPython with the controller and the magics loaded.

    python -m jupyter_mesh.notebook.kernel -f CONNECTION_FILE      (what kernel.json runs)

Shut Down and Restart stop every mesh, agent and proc before the kernel goes. A hard kill skips that:
then the agents see their stdin (the lifeline from this process) close and take their procs with them.
Interrupt (SIGINT to the kernel's process group) never reaches agents or procs: they run in sessions
of their own; the cell waiting on a call gets KeyboardInterrupt and the call is cancelled.
"""

from __future__ import annotations

import inspect
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from .._version import __version__
from .extension import front_of, load

__all__ = ["MeshKernel", "main"]


class MeshKernel(IPythonKernel):
    implementation = "jupyter_mesh"
    implementation_version = __version__
    banner = "Python 3 (mesh) - jupyter_mesh " + __version__ + ": `%mesh up` starts a mesh, `%mesh -h` lists commands"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        load(self.shell)
        from ..ui import install

        install(self)  # serve the JupyterLab sidebar over a comm (kernel kind "mesh")

    async def do_shutdown(self, restart: bool) -> Any:
        front = front_of(self.shell)
        if front is not None:
            front.shutdown()
        result = super().do_shutdown(restart)
        if inspect.isawaitable(result):
            result = await result
        return result


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=MeshKernel)


if __name__ == "__main__":
    main()
