"""An actor's descendants, as in Monarch's hierarchy: the actor meshes and proc meshes an actor created
(from inside an endpoint) answer to it — their failures go to its ``__supervise__`` — and are stopped
when it stops or dies, so a parent that goes never leaves children running with nobody to call or
supervise them."""

from __future__ import annotations

import inspect
import sys
from typing import Any

from ..errors import MeshFailure, SupervisionError
from .remote_errors import error_info, safe_str

__all__ = ["Descendants", "supervised"]


class Descendants:
    """The meshes one actor spawned, and how they end with it."""

    def __init__(self, actor_name: str):
        self.actor_name = actor_name
        self.owned: list[tuple[str, Any]] = []  # ("actors" | "procs", mesh)

    def own(self, kind: str, mesh: Any) -> None:
        """The actor spawned ``mesh`` (``kind`` "actors" or "procs"). Stopped proc meshes are let go here."""
        self.owned = [(k, m) for k, m in self.owned if not (k == "procs" and m.stopped)]
        self.owned.append((kind, mesh))

    def end(self) -> None:
        """Stop them: actor meshes first (their ``__cleanup__`` runs, waited for), then proc meshes.
        What fails to stop is said, never raised: the actor ends either way."""
        owned, self.owned = self.owned, []
        stops = []
        for kind, mesh in owned:
            try:
                stops.append(type(mesh).stop(mesh) if kind == "actors" else None)  # (an endpoint may be named stop)
            except Exception as e:  # noqa: BLE001
                self._say(f"could not stop {mesh!r} it spawned: {safe_str(e)}")
        for f in stops:
            try:
                if f is not None:
                    f.get(timeout=30)
            except Exception as e:  # noqa: BLE001
                self._say(f"an actor mesh it spawned did not stop: {safe_str(e)}")
        for kind, mesh in owned:
            if kind == "procs" and not mesh.stopped:
                try:
                    mesh.stop()
                except Exception as e:  # noqa: BLE001
                    self._say(f"could not stop {mesh!r} it spawned: {safe_str(e)}")

    def _say(self, what: str) -> None:
        print(f"[{self.actor_name}] {what}", file=sys.stderr)


async def supervised(actor_name: str, instance: Any, err: SupervisionError) -> bool | BaseException:
    """Ask the actor's ``__supervise__`` about each failure of a mesh it spawned; False if one went
    unhandled (no hook, or the hook said no), what it raised if it raised: then the actor fails, so
    that *its* supervisor sees it, as in Monarch."""
    hook = getattr(instance, "__supervise__", None)
    if hook is None:
        return False
    for failure in err.failures:
        try:
            handled = hook(MeshFailure([failure], err.context))
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as e:  # noqa: BLE001 - a raising supervisor did not handle it
            print(f"[{actor_name}] __supervise__ raised:\n" + error_info(e, "__supervise__")["tb"], file=sys.stderr)
            return e
        if not handled:
            return False
    return True
