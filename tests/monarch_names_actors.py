"""Actors for test_monarch_names.py (importable by the procs)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from jupyter_mesh import (
    Actor,
    Channel,
    Port,
    concurrent_endpoint,
    config,
    context,
    current_actor_name,
    current_size,
    endpoint,
    get_or_spawn_controller,
    this_proc,
)


class KilledInInit(Actor):
    """Monarch's ``Instance.kill()`` in ``__init__``: the spawn fails with it (``initialized`` raises)."""

    def __init__(self) -> None:
        context().actor_instance.kill()

    @endpoint
    def value(self) -> int:
        return 0


class Adder(Actor):
    """Answers through explicit response ports: now, or later from a thread of its own."""

    def __init__(self, base: int = 0):
        self.base = base
        self.parked: list[tuple[Port[int], int]] = []

    @endpoint(explicit_response_port=True)
    def add(self, port: Port[int], b: int) -> None:
        port.send(self.base + b)

    @endpoint(explicit_response_port=True)
    def add_later(self, port: Port[int], b: int) -> None:
        threading.Timer(0.2, port.send, args=(self.base + b,)).start()

    @endpoint(explicit_response_port=True)
    def refuse(self, port: Port[int]) -> None:
        port.exception(ValueError("not today"))

    @endpoint(explicit_response_port=True)
    def crash(self, port: Port[int]) -> None:
        raise ValueError("raised instead of answering")

    @endpoint
    def give_up(self, why: str) -> None:
        context().actor_instance.abort(why)

    @endpoint
    def value(self) -> int:
        return self.base

    def plus(self, b: int) -> int:  # not an endpoint: reached through as_endpoint(mesh.plus)
        return self.base + b

    async def plus_later(self, b: int) -> int:
        await asyncio.sleep(0)
        return self.base + b

    def plus_through(self, port: Port[int], b: int) -> None:
        port.send(self.base + b)

    @endpoint
    def quit(self, how: str) -> str:
        """Ends itself after this call: ``stop`` (no failure) or ``kill`` (a failure, as abort)."""
        getattr(context().actor_instance, how)("done")
        return how

    @endpoint
    def own_proc(self, via: str) -> tuple[dict[str, int], dict[str, int], int, int]:
        """What it spawns on its own proc (``actor_instance.proc``, or ``this_proc()``) runs in its process."""
        inst = context().actor_instance
        proc = inst.proc if via == "proc" else this_proc()
        sib = proc.spawn(f"sib_{via}", Adder, 5)
        return dict(proc.extent), dict(inst.proc_mesh.extent), sib.pid.call_one().get(timeout=30), os.getpid()

    @endpoint
    def whoami(self) -> tuple[str, dict[str, int], str, str]:
        inst = context().actor_instance
        return current_actor_name(), current_size(), inst.name, repr(inst)

    @endpoint
    def setting(self, key: str) -> Any:
        return config.get_global_config()[key]

    @endpoint
    def produce(self, port: Port[int], n: int) -> None:
        rank = context().actor_instance.rank["gpus"]
        for i in range(n):
            port.send(rank * 100 + i)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def env(self, key: str) -> str | None:
        return os.environ.get(key)

    @endpoint
    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))


class Collector(Actor):
    """Opens a channel in its own proc and collects what its peers send there."""

    @endpoint
    async def collect(self, producers: Any, n: int) -> list[int]:
        port, receiver = Channel[int].open()
        producers.produce.broadcast(port, n)
        return sorted([await receiver.recv() for _ in range(len(producers) * n)])

    @endpoint
    def singleton_value(self, name: str) -> int:
        return get_or_spawn_controller(name, Adder, 40).get(timeout=30).value.call_one().get(timeout=30)


class Gate(Actor):
    """A concurrent endpoint waits while the actor takes other messages."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.open = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.open.wait()
        return "through"

    @endpoint
    async def release(self) -> str:
        await self.ready.wait()
        self.open.set()
        return "released"


class Cleaner(Actor):
    """Writes to a file when its mesh is stopped; an async one also has a task running to be cancelled."""

    def __init__(self, path: str):
        self.path = path

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"cleanup {exc}\n")


class AsyncCleaner(Actor):
    def __init__(self, path: str):
        self.path = path
        self.task: asyncio.Task[None] | None = None

    @endpoint
    async def start(self) -> None:
        self.task = asyncio.create_task(self._forever())

    async def _forever(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            with open(self.path, "a") as f:
                f.write("task cancelled\n")
            raise

    async def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write("async cleanup\n")


class Watcher(Actor):
    """Owns a mesh; an endpoint awaits what ``__supervise__`` hears (it runs beside the waiting endpoint)."""

    def __init__(self) -> None:
        from jupyter_mesh import this_host

        self.child = this_host().spawn_procs(per_host={"gpus": 1}).spawn("watched", Adder)
        self.heard: list[str] = []
        self.failed = asyncio.Event()

    @endpoint
    async def kill_child_and_wait(self) -> list[str]:
        pid = await self.child.pid.call_one()
        os.kill(pid, 9)
        await asyncio.wait_for(self.failed.wait(), 30)
        return self.heard

    def __supervise__(self, failure: Any) -> bool:
        self.heard.append(str(failure))
        self.failed.set()
        return True


booted: list[str] = []


def boot() -> None:
    booted.append("yes")


class BootProbe(Actor):
    @endpoint
    def booted(self) -> list[str]:
        return booted

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


class Named(Actor):
    """Endpoints named like ActorMesh attributes the endpoint may have: ``name`` (Monarch's ActorMesh has
    none), ``stop`` (ours on purpose), and a private one."""

    @endpoint
    def name(self) -> str:
        return "my-name"

    @endpoint
    def stop(self) -> str:
        return "my-stop"

    @endpoint
    def _private(self) -> str:
        return "private"

    @endpoint
    def __call__(self) -> str:  # a dunder ActorMesh has not: reachable as mesh.__call__, as in Monarch
        return "my-call"


class Sized(Actor):
    @endpoint
    def size(self) -> int:  # ActorMesh.size: refused at spawn, as in Monarch
        return 64


class Initialized(Actor):
    @endpoint
    def initialized(self) -> bool:  # ActorMesh.initialized: refused at spawn, as in Monarch
        return True


class NamedOwner(Actor):
    """Spawns a ``Named`` mesh, which it owns: stopping this stops that (whose ``stop`` is an endpoint)."""

    def __init__(self, procs) -> None:
        self.child = procs.spawn("named_child", Named)

    @endpoint
    def owned(self):
        return self.child
