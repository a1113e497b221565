"""Warm by default: what a local host's fork server (template) imports before anyone asks.

A proc forked from a template that already imported torch starts in milliseconds; one that imports it
itself takes seconds (four at once on a small machine: several). So unless told otherwise a
``LocalJob`` (and with it ``this_host()``) preloads torch when it is installed, plus the heavy
libraries this program has already imported, and the ``mesh`` kernel starts its host at kernel start,
so the template is ready by the time the first cell spawns.

A ``LocalJob`` of several hosts imports the list once, in its seed (``_runtime/seed.py``), rather than
once per host on the same cores.

Whether torch is installed is asked with ``importlib.util.find_spec``, which never imports it here.
Opt out with ``JUPYTER_MESH_WARM=0`` (or ``configure(warm=False)``); ``preload=[...]`` on the job or
``this_host`` (or ``$JUPYTER_MESH_PRELOAD``) names the list itself.

Hosts that agents bring up elsewhere (``SlurmJob``, ``TorchXJob``, ``AttachJob``, ``%mesh up``) may not
have what this machine has: their agents get :func:`remote_warm`'s list as ``warm`` in their
configuration, and each host's template imports those of them installed *there* (asked the same way),
in the background, while its agent has already reported in.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

from .. import config

__all__ = ["WARM_CANDIDATES", "default_preload", "enabled", "is_module_name", "remote_warm", "split"]

WARM_CANDIDATES = (
    "numpy",
    "scipy",
    "pandas",
    "torch",
    "torchvision",
    "torchaudio",
    "safetensors",
    "einops",
    "sklearn",
)
"""Libraries preloaded when this program has already imported them: import-only, no threads or
sockets at import (a template must stay safe to fork), and slow enough to be worth it."""


def enabled() -> bool:
    """Warm unless ``warm`` is set false (``configure(warm=False)`` or ``JUPYTER_MESH_WARM=0``)."""
    value = config.get_global_config().get("warm")
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None  # a top-level name: its parent is not imported
    except (ImportError, ValueError):
        return False


def default_preload() -> list[str]:
    """torch when installed, and the candidates this program imported already; [] when opted out."""
    if not enabled():
        return []
    out = [m for m in WARM_CANDIDATES if m in sys.modules]
    if "torch" not in out and _installed("torch"):
        out.append("torch")
    return out


def remote_warm() -> list[str]:
    """What an agent on another host preloads when installed there: torch and the candidates this
    program imported already; [] when opted out. Nothing is asked about this machine's installs."""
    if not enabled():
        return []
    out = [m for m in WARM_CANDIDATES if m in sys.modules]
    return out if "torch" in out else [*out, "torch"]


def is_module_name(name: str) -> bool:
    """``torch``, ``numpy.linalg``: what an import statement takes (not a path, not code)."""
    return all(part.isidentifier() for part in name.split("."))


def split(preload: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """A job's ``preload`` argument as (what every template must import, what it imports if installed):
    ``None`` (not named) is the warm default, a list names exactly what to import."""
    return ([], remote_warm()) if preload is None else (list(preload), [])
