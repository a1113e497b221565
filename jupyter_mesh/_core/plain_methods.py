"""An actor's method that is not an ``@endpoint``, run as one when its caller asked so (Monarch's
``as_endpoint(mesh.method)``). The caller marks such a call (``pm`` in its header); a call by name alone
still needs the ``@endpoint``."""

from __future__ import annotations

import inspect
from typing import Any

from .actor import AsyncEndpoint, Endpoint, SyncEndpoint

__all__ = ["plain_endpoint"]


def plain_endpoint(cls: type, name: str, explicit_port: bool) -> Endpoint[..., Any] | None:
    """``cls``'s method ``name`` as an endpoint, or None if it has no public function by that name."""
    fn = inspect.getattr_static(cls, name, None)
    if name.startswith("_") or not inspect.isfunction(fn):
        return None
    kind = AsyncEndpoint if inspect.iscoroutinefunction(fn) else SyncEndpoint
    ep: Endpoint[..., Any] = kind(fn, explicit_port)
    ep.name = name
    return ep
