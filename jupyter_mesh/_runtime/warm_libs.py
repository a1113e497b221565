"""The heavy libraries a host's template may import before anyone asks (``jobs.warm`` decides which).

Here, below the jobs, because the controller asks too: a program that imported one of them waits for
a host's warm imports at its spawns (``template``), one that did not forks at once.
"""

from __future__ import annotations

import sys

__all__ = ["WARM_CANDIDATES", "uses_warm_libraries"]

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


def uses_warm_libraries() -> bool:
    """Did this program import one of the warm libraries? Then its actors likely need them too: its
    spawns wait for a host's warm child rather than fork before it (``template``)."""
    return any(m in sys.modules for m in WARM_CANDIDATES)
