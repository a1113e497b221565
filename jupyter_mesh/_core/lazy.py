"""A package's public names, each loaded from its home module on first use (PEP 562).

Why: every agent, fork server and proc starts through ``jupyter_mesh/__init__``, and a script that
names one job should not import them all. ``jobs/__init__`` is lazy for a second reason: a package
whose ``__init__`` imports its submodules can deadlock CPython's per-module import locks when one thread
imports the package while another imports one of those submodules directly (the second takes the
submodule's lock first, then waits for the package's; ``_DeadlockError``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def loader(package: str, homes: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``homes`` maps each public name to its module
    (relative to ``package``; a name that is its home's last part is that module itself), and a
    name once loaded is kept in ``namespace`` (the package's globals), found directly from then on."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home, package)
        value = module if home.rpartition(".")[2] == name else getattr(module, name)
        namespace[name] = value
        return value

    return __getattr__
