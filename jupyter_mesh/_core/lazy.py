"""A package's public names, each loaded from its home module on first use (PEP 562).

Why: every agent, fork server and proc starts through ``jupyter_mesh/__init__``, and a script that
names one job should not import them all. ``jobs``, ``spmd`` and ``ui`` are lazy for a second reason: a
package whose ``__init__`` imports its submodules can deadlock CPython's per-module import locks when
one thread imports the package while another imports one of those submodules directly (the second
takes the submodule's lock first, then waits for the package's; ``_DeadlockError``)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any


def loader(package: str, homes: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``homes`` maps each public name to its module,
    relative to ``package`` (never a name that is also a submodule's: importing that submodule sets
    the package's attribute to it). A name once loaded is kept in ``namespace`` (the package's
    globals), found directly from then on. Any other name that is a submodule of ``package`` (the
    facade's ``config``, ``jobs.slurm``) is imported, as eager imports made them attributes."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        namespace[name] = value
        return value

    return __getattr__
