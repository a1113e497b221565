"""Actors of a class the notebook has since redefined: say so when they are called, and ``%mesh reload``.

A class defined in a cell travels to the procs by value when actors are spawned; redefining it in a
later cell changes nothing for the actors already running: they keep the old code, silently. The
front records which class object each actor mesh was spawned with (``lowlevel.on_send``), warns
once per redefinition when such a mesh is called, and ``%mesh reload`` copies the new definition's
methods onto the old class, in every proc and here, where that cannot break the live instances:
same name in ``__main__``, same bases, same ``__slots__``, same ``__init__`` (the state the actors
hold was built by it). Otherwise it refuses and says why: spawn the actors again.
"""

from __future__ import annotations

import inspect
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from .._api.mesh import endpoints_win, shadowed
from .._core.actor import Actor, endpoint, endpoints_of
from .._core.signatures import Signatures
from ..errors import MeshError

__all__ = ["Redefinitions", "Reloader", "Spawned", "copy_class", "not_reloadable"]

# what a class body leaves that is not the user's code, or cannot be assigned on a live class
_KEEP = {"__dict__", "__weakref__", "__module__", "__qualname__", "__slots__", "__firstlineno__",
         "__static_attributes__", "__orig_bases__", "__parameters__", "__doc__"}  # fmt: skip


# actor meshes the notebook itself spawns (spmd: %mesh torchrun's, by jupyter_mesh.spmd)
INTERNAL_ACTORS = frozenset({"mesh_exec", "mesh_reload", "spmd"})


@dataclass
class Spawned:
    """An actor mesh of this kernel and the class object its actors run."""

    name: str
    proc_mesh_id: str
    cls: type
    current: type  # the definition the actors run now (``cls`` patched by %mesh reload: the newer one)
    meshes: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)  # ActorMesh objects to update
    warned: set[int] = field(default_factory=set)  # ids of redefinitions already warned about


def _code(fn: Any) -> Any:
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_code, code.co_consts, code.co_names)


def not_reloadable(old: type, new: type) -> str:
    """Why ``new`` cannot replace ``old``'s methods in place ("" when it can)."""
    for cls in (old, new):
        if cls.__module__ != "__main__":
            which = "the running" if cls is old else "the new"
            return f"{which} {cls.__qualname__} comes from module {cls.__module__!r}, not from the notebook (__main__)"
    if [b.__qualname__ for b in old.__bases__] != [b.__qualname__ for b in new.__bases__]:
        return "its base classes changed"
    if getattr(old, "__slots__", None) != getattr(new, "__slots__", None):
        return "its __slots__ changed"
    old_init, new_init = vars(old).get("__init__"), vars(new).get("__init__")
    if (old_init is None) != (new_init is None):
        return "it gained or lost an __init__"
    if old_init is not None and new_init is not None:
        before, after = inspect.signature(old_init), inspect.signature(new_init)
        if before != after:
            return f"__init__{before} became __init__{after}"
        if _code(old_init) != _code(new_init):
            return "its __init__ changed"
    return ""


def copy_class(old: type, new: type) -> list[str]:
    """Make ``old`` behave as ``new``: its functions, endpoints and class attributes replaced,
    those ``new`` dropped removed. Returns the names that changed."""
    changed = []
    for name, value in vars(new).items():
        if name in _KEEP or name == "__init__":
            continue
        if vars(old).get(name) is not value:
            setattr(old, name, value)
            changed.append(name)
    for name in [n for n in vars(old) if n not in vars(new) and n not in _KEEP]:
        delattr(old, name)
        changed.append(name)
    return sorted(changed)


class Reloader(Actor):
    """Spawned by ``%mesh reload`` on a proc mesh: patches a live actor's class in its proc."""

    @endpoint
    def patch(self, actor_id: str, new: type) -> list[str]:
        from .._runtime.proc import live_actor

        host = live_actor(actor_id)
        old = type(host.instance)
        why = not_reloadable(old, new)
        if why:
            raise TypeError(f"cannot reload {old.__qualname__} in place: {why}")
        changed = copy_class(old, new)
        host.endpoints = endpoints_of(old)  # the actor's thread looks endpoints up here
        return changed


class Redefinitions:
    """The actor meshes this kernel spawned, the class each runs, and what to do when it changes."""

    def __init__(self, shell: Any, notify: Any):
        self.shell, self.notify = shell, notify
        self._spawned: dict[str, Spawned] = {}  # actor id -> record
        self._helpers: dict[str, Any] = {}  # proc mesh id -> its Reloader actor mesh

    # -- from the runtime (the calling thread) ------------------------------------------------------
    def spawned(self, mesh: Any, cls: type) -> None:
        rec = self._spawned.get(mesh._actor_id)
        if rec is None:
            rec = self._spawned[mesh._actor_id] = Spawned(mesh._name, mesh._ref.mesh_id, cls, cls)
        rec.meshes.add(mesh)

    def sent(self, mesh: Any, ranks: list[int]) -> None:
        rec = self._spawned.get(mesh._actor_id)
        if rec is None:
            return
        rec.meshes.add(mesh)
        new = self._redefined(rec)
        if new is not None and id(new) not in rec.warned:
            rec.warned.add(id(new))
            self.notify(
                f"jupyter_mesh: actors of '{rec.name}' run {rec.cls.__qualname__} from {self._cell_of(rec.current)}, "
                f"not the one defined since in {self._cell_of(new)}; spawn them again, or `%mesh reload` "
                "updates their methods in place\n"
            )

    def _redefined(self, rec: Spawned) -> type | None:
        """The class now bound to the actors' class name in the notebook, if it is another one."""
        if rec.cls.__module__ != "__main__":
            return None
        now = self.shell.user_ns.get(rec.cls.__name__)
        if isinstance(now, type) and now is not rec.current and issubclass(now, Actor):
            return now
        return None

    def _cell_of(self, cls: type) -> str:
        numbers = getattr(getattr(self.shell, "compile", None), "_filename_map", {})
        for value in vars(cls).values():
            code = getattr(getattr(value, "fn", value), "__code__", None)
            if code is not None and code.co_filename in numbers:
                return f"cell [{numbers[code.co_filename]}]"
        return "an earlier cell"

    # -- %mesh reload ---------------------------------------------------------------------------------
    def reload(self, names: list[str]) -> list[str]:
        """Update the live actor meshes named (default: every one whose class was redefined);
        returns what was done, one line each. ``LookupError`` / ``TypeError`` say why not."""
        from ..lowlevel import mesh_states, proc_mesh

        live = {s.mesh_id for s in mesh_states()}
        # the notebook's own actors (the %%mesh executor, the reloader) are not the user's to reload
        records = [r for r in self._spawned.values() if r.proc_mesh_id in live and r.name not in INTERNAL_ACTORS]
        if names:
            unknown = sorted(set(names) - {r.name for r in records})
            if unknown:
                known = ", ".join(sorted({r.name for r in records})) or "none"
                raise LookupError(f"no live actor mesh named {', '.join(unknown)} (live ones: {known})")
            records = [r for r in records if r.name in names]
        out = []
        for rec in records:
            new = self._redefined(rec)
            if new is None:
                if names:
                    out.append(f"'{rec.name}' already runs the current {rec.cls.__qualname__}")
                continue
            why = not_reloadable(rec.current, new)
            clash = [] if why or not rec.meshes else shadowed(next(iter(rec.meshes)), set(endpoints_of(new)))
            if clash:  # as spawn refuses it: mesh.size would not reach an endpoint named size
                why = f"its endpoint '{clash[0]}' would be hidden by the ActorMesh attribute '{clash[0]}' (rename it)"
            if why:
                raise TypeError(
                    f"cannot reload '{rec.name}' in place: {why}, and its live actors were built by the "
                    f"old {rec.cls.__qualname__}. Spawn them again: {rec.name} = procs.spawn('{rec.name}', "
                    f"{new.__qualname__}, ...)"
                )
            helper = self._helpers.get(rec.proc_mesh_id)
            if helper is None:
                helper = self._helpers[rec.proc_mesh_id] = proc_mesh(rec.proc_mesh_id).spawn("mesh_reload", Reloader)
            actor_id = next(a for a, r in self._spawned.items() if r is rec)
            try:
                helper.patch.call(actor_id, new).get(30)
            except MeshError as e:  # e.g. the class refers to a global that does not pickle (a lock)
                cause = re.search(r"\((cannot pickle [^)]*)\)", str(e))
                raise TypeError(
                    f"cannot send the new {new.__qualname__} to '{rec.name}': "
                    f"{cause.group(1) if cause else str(e).splitlines()[0]}. A class travels with the notebook "
                    f"globals its methods use: keep locks, files and sockets out of them (create them in __init__)"
                ) from None
            changed = copy_class(rec.cls, new)  # here too: the kernel's meshes look endpoints up on it
            endpoints = endpoints_of(rec.cls)
            names_now, sigs_now = frozenset(endpoints), Signatures.of(rec.cls, endpoints)
            for m in list(rec.meshes):
                m._endpoint_names = names_now
                endpoints_win(m)
                if m._sigs is None:
                    m._sigs = sigs_now
                else:
                    m._sigs.replace_with(sigs_now)  # shared with its views, also those made before
            rec.current = new
            out.append(f"reloaded '{rec.name}' ({new.__qualname__}): {', '.join(changed) or 'nothing'} changed")
        return out or ["nothing to reload: every live actor mesh runs the current definition of its class"]
