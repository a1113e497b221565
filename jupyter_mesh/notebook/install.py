"""Installing the ``mesh`` kernelspec (``jupyter-mesh install-kernel``).

``pip install`` already puts it in ``<prefix>/share/jupyter/kernels/mesh`` (wheel shared-data, also for
editable installs); this command is for making it visible elsewhere, e.g. to a JupyterLab that runs
from another environment (``--user``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

__all__ = ["KERNEL_SPEC", "install_kernel"]

KERNEL_SPEC = {
    "argv": ["python", "-m", "jupyter_mesh.notebook.kernel", "-f", "{connection_file}"],
    "display_name": "Python 3 (mesh)",
    "language": "python",
    "interrupt_mode": "signal",
    "metadata": {"debugger": True},
}


def install_kernel(user: bool = False, prefix: str | None = None) -> str:
    """Install the spec; returns where. Outside this environment the spec names this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec: dict[str, Any] = dict(KERNEL_SPEC)
    if user or (prefix and os.path.realpath(prefix) != os.path.realpath(sys.prefix)):
        spec["argv"] = [sys.executable, *spec["argv"][1:]]
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=2)
        return KernelSpecManager().install_kernel_spec(d, "mesh", user=user, prefix=prefix)
