"""The notebook front: the ``mesh`` kernel, the ``%mesh`` / ``%%mesh`` magics, worker output in the right
cell, and remote errors rendered like local ones.

Importing this package imports nothing from IPython (procs import :mod:`.remote_exec` from it);
``load_ipython_extension`` pulls the IPython side in when a shell loads it (``%load_ext jupyter_mesh``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from .extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .extension import unload

    unload(ipython)
