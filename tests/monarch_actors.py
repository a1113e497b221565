"""Actors for the tests of Monarch's semantics (importable by procs: they get our sys.path)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import time
import weakref

from jupyter_mesh import Actor, context, current_rank, current_size, endpoint


class Dies(BaseException):
    """A BaseException of the user's own: in Monarch it ends the actor."""


class Boom(Actor):
    def __init__(self, bad: bool = False):
        if bad:
            raise ValueError("this is an exception from __init__")

    @endpoint
    def fail(self) -> None:
        raise ValueError("this is a test exception")

    @endpoint
    def exit(self) -> None:
        raise SystemExit(3)

    @endpoint
    async def die(self) -> None:
        raise Dies("simulated actor failure")

    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @endpoint
    async def nap(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "napped"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Nested(Actor):
    @endpoint
    async def with_cause(self) -> None:
        try:
            raise KeyError("inner exception")
        except KeyError as e:
            raise ValueError("outer exception") from e

    @endpoint
    def with_context(self) -> None:
        try:
            raise KeyError("inner exception")
        except KeyError:
            raise ValueError("outer exception")  # noqa: B904 - the context is the point


class Ranks(Actor):
    @endpoint
    def rank(self) -> tuple:
        return str(current_rank()), dict(current_rank()), os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]


def _where() -> dict:
    """What Monarch's numbering gives the running code: the call's point (and the actor's own)."""
    return {
        "rank": dict(current_rank()),
        "index": current_rank().rank,
        "size": current_size(),
        "message": dict(context().message_rank),
        "own": dict(context().actor_instance.rank),
    }


class Where(Actor):
    """Says where it is numbered: in its ``__init__`` (the mesh it was spawned on) and in each call (the
    view the call was sent to); ``print`` shows our output prefix, the proc's whole-mesh coordinates."""

    def __init__(self) -> None:
        self.at_init = _where()

    @endpoint
    def init(self) -> dict:
        return self.at_init

    @endpoint
    def where(self) -> dict:
        print(f"where {current_rank().rank}")
        return _where()

    @endpoint
    async def awhere(self) -> dict:
        return _where()

    @endpoint
    def fail(self) -> None:
        raise ValueError(f"failed at {dict(current_rank())}")


class Loader(Actor):
    """Monarch's getting-started data loader: it says whose data it hands out."""

    @endpoint
    def example(self) -> str:
        return f"data of {dict(context().actor_instance.rank)}"


class Trainer(Actor):
    """Monarch's getting-started pattern: its own loader is ``loaders.slice(**its own rank)``."""

    def __init__(self, loaders) -> None:
        self.rank = dict(context().actor_instance.rank)
        self.loader = loaders.slice(**context().actor_instance.rank)

    @endpoint
    def step(self) -> tuple:
        return self.rank, self.loader.example.call_one().get(timeout=20)


class Owner(Actor):
    """Monarch's supervision pattern: given a proc mesh, it spawns its own actors there and supervises them."""

    def __init__(self, procs) -> None:
        self.procs = procs
        self.child = procs.spawn("child", Boom)
        self.seen: list[str] = []

    @endpoint
    def child_ok(self) -> list:
        return list(self.child.ok.call().get(timeout=20).values())

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call().get(timeout=20).item(gpus=0)

    @endpoint
    def break_child(self) -> None:
        self.child.fail.broadcast()

    @endpoint
    def seen_failures(self) -> list:
        return self.seen

    @endpoint
    def try_to(self, what: str) -> str:
        try:
            getattr(self.procs, what)()
        except Exception as e:  # noqa: BLE001 - its type and text are what the test looks at
            return f"{type(e).__name__}: {e}"
        return "did it"

    def __supervise__(self, failure) -> bool:
        self.seen.append(f"{failure.kind}:{failure.mesh_name}:{failure.report().splitlines()[0]}")
        return True


class Cleans(Actor):
    """Appends its name to ``path`` when its mesh is stopped (``__cleanup__``)."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name

    @endpoint
    def ok(self) -> str:
        return "ok"

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(self.name + "\n")


class CleansUp(Actor):
    """Appends what ``__cleanup__`` got to ``path``, a line per rank: the error the actor died of."""

    def __init__(self, path: str):
        self.path = path

    @endpoint
    def fail(self) -> None:
        raise ValueError("this is a test exception")

    @endpoint
    async def die(self) -> None:
        raise Dies("simulated actor failure")

    @endpoint
    def abort(self) -> str:
        context().actor_instance.abort("enough")
        return "aborted"

    def __cleanup__(self, exc: Exception | None) -> None:
        why = "None" if exc is None else f"{type(exc).__name__}({type(exc.__cause__).__name__}): {exc}"
        with open(self.path, "a") as f:
            f.write(f"{current_rank().rank} {why.splitlines()[0]}\n")


class Parent(Actor):
    """Spawns actors on a proc mesh it is given and on one of its own: its descendants."""

    def __init__(self, procs, path: str) -> None:
        from jupyter_mesh import this_host

        self.own_procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.on_given = procs.spawn("on_given", Cleans, path, "on_given")
        self.on_own = self.own_procs.spawn("on_own", Cleans, path, "on_own")

    @endpoint
    def children_ok(self) -> list:
        return [self.on_given.ok.call_one().get(timeout=20), self.on_own.ok.call_one().get(timeout=20)]

    @endpoint
    def own_pids(self) -> list:
        return list(self.own_procs.pids().values())

    @endpoint
    async def die(self) -> None:
        raise Dies("the parent dies")


class Finalizes(Actor):
    @endpoint
    def arm(self, path: str, hang: float = 0.0) -> int:
        """At exit, ``{path}.{pid}.atexit`` and ``{path}.{pid}.finalizer`` are written."""
        atexit.register(_write, f"{path}.{os.getpid()}.atexit", hang)

        class Resource:
            pass

        self.resource = Resource()
        weakref.finalize(self.resource, _write, f"{path}.{os.getpid()}.finalizer", 0.0)
        global _kept  # a module global: freed (its __del__ run) only when the interpreter finalizes
        _kept = _WritesOnDel(f"{path}.{os.getpid()}.del")
        return os.getpid()

    @endpoint
    def busy(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    async def busy_async(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _WritesOnDel:
    def __init__(self, path: str) -> None:
        self.file = open(path, "w")  # opened now: ``open`` may be gone when __del__ runs at exit

    def __del__(self) -> None:
        self.file.write("finalized")
        self.file.close()


_kept: _WritesOnDel | None = None


def _write(path: str, hang: float) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(hang)


def _injects_one(f):
    """A decorator that passes an argument of its own: the caller does not pass ``one``."""

    @functools.wraps(f)
    def wrapper(self, *args, **kwargs):
        return f(self, 1, *args, **kwargs)

    return wrapper


class Args(Actor):
    """Parameter lists of every kind: what the caller's check of arguments must refuse, and accept."""

    @endpoint
    def f(self, x: int, *, y: int = 0) -> int:
        return x + y

    @endpoint
    def anything(self, *args, **kwargs) -> int:
        return len(args) + len(kwargs)

    @endpoint(explicit_response_port=True)
    def via_port(self, port, x: int) -> None:
        port.send(x)

    @endpoint
    @_injects_one
    def wrapped(self, one: int, x: int) -> int:
        return one + x

    @endpoint
    def call_other(self, other, args: tuple, kwargs: dict) -> str:
        """An actor calling another actor's mesh: its arguments are checked here too."""
        try:
            return repr(list(other.f.call(*args, **kwargs).get(timeout=20).values()))
        except TypeError as e:
            return f"TypeError: {e}"
