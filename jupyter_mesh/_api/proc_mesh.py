"""A ``ProcMesh``: processes spawned on a host mesh, and what a user does with them (spawn actor meshes,
stop, kill, respawn, resize, state, logs, stacks). ``ProcMesh.spawn`` makes the ``ActorMesh`` of
``mesh``; a ProcMesh passed to an actor comes back bound to that process's controller
(``_proc_mesh_ref``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._core import slots
from .._core.actor import Actor, endpoints_of
from .._core.future import Future
from .._core.refs import ProcMeshRef, new_id
from .._core.shape import Shape
from .._core.signatures import Signatures
from .._core.state import MeshEvent, MeshState
from ..errors import MeshClosedError, MeshValueError
from .mesh import A, ActorMesh, _client, _MeshTrait, _owned_by_caller, _refuse_shadowed

if TYPE_CHECKING:
    from .._runtime.controller import Controller

__all__ = ["ProcMesh", "ProcMeshRef"]


class ProcMesh(_MeshTrait):
    """Processes spawned on a host mesh; ``spawn`` puts one actor on each of them.

    A ProcMesh can be passed to an actor (an argument, or a spawn argument), which can then spawn its
    own actor meshes on those procs (and supervise them: ``__supervise__``). Stopping, killing,
    respawning and resizing stay with the program that spawned the procs.
    """

    def __init__(self, controller: Controller, ref: ProcMeshRef, view: Shape | None = None, host_mesh: Any = None):
        self._controller, self._ref = controller, ref
        self._view = view  # None: the whole mesh, whatever its current size
        self._host_mesh = host_mesh
        self._boot_error: BaseException | None = None  # what spawn_procs(bootstrap=...) raised

    def __reduce__(self) -> tuple[Any, ...]:
        self._controller.faults.lend(self._ref.mesh_id)  # passed to an actor: it supervises what it spawns
        return (_proc_mesh_ref, (self._ref, self._view))

    def _owner_only(self, what: str) -> None:
        """Only the process whose controller spawned the procs holds their record (pids, agents, logs)."""
        if self._ref.mesh_id not in self._controller.meshes and not self.stopped:
            raise MeshValueError(
                f"cannot {what} proc mesh '{self._ref.name}' here: it was passed in from the program that "
                "spawned it, and only that program can; spawn actors on it, or ask that program to"
            )

    @property
    def _shape(self) -> Shape:
        return self._ref.shape if self._view is None else self._view

    def _with_shape(self, shape: Shape) -> ProcMesh:
        view = ProcMesh(self._controller, self._ref, shape, self._host_mesh)
        view._boot_error = self._boot_error
        return view

    @property
    def initialized(self) -> Future[bool]:
        """Monarch's: a future of True once the procs run (they do when ``spawn_procs`` returns), or of
        the error its ``bootstrap`` function raised."""
        fut: Future[bool] = Future("proc mesh start")
        if self._boot_error is not None:
            fut._set_exception(self._boot_error)
        else:
            fut._set_result(True)
        return fut

    @property
    def host_mesh(self) -> Any:
        """The host mesh these procs were spawned on (a ``HostMesh``: ``host_mesh`` builds on this module)."""
        if self._host_mesh is None:
            raise MeshValueError(f"proc mesh '{self._ref.name}' was not spawned from a HostMesh in this program")
        return self._host_mesh

    async def logging_option(self, stream_to_client: bool = True, aggregate_window_sec: int | None = 3,
                             level: int = 20) -> None:  # fmt: skip
        """Monarch's log-streaming switch. Here the procs' output always reaches this program (and, in a
        notebook, the cell that caused it, folded across ranks), so there is nothing to switch."""

    @property
    def name(self) -> str:
        return self._ref.name

    @property
    def stopped(self) -> bool:
        return self._controller.is_stopped(self._ref.mesh_id)

    def _check_open(self) -> None:
        if self.stopped:
            raise MeshClosedError(
                f"`ProcMesh` has already been stopped: proc mesh '{self._ref.name}' was stopped; "
                "spawn a new one with HostMesh.spawn_procs()"
            )

    def spawn(
        self, name: str, cls: type[A], *args: Any, init_timeout: float | None = None, **kwargs: Any
    ) -> ActorMesh[A]:
        """Create one ``cls(*args, **kwargs)`` on every proc of this mesh.

        Returns at once; calls queue behind the constructors (``state()`` notes "initializing" meanwhile).
        ``mesh.initialized.get()`` waits for every constructor and raises if one failed.

        ``init_timeout`` (seconds; default ``$JUPYTER_MESH_INIT_TIMEOUT``, else no limit) is ours, not
        ``cls``'s: ranks whose ``__init__`` has not returned by then fail with ``SupervisionError``
        (kind ``init``) and their procs are killed, so they can be respawned. Monarch has no such
        argument; an actor whose ``__init__`` takes one named ``init_timeout`` must get it positionally.
        """
        self._check_open()
        if init_timeout is not None and _takes_init_timeout(cls):
            raise MeshValueError(
                f"spawn() keeps the keyword init_timeout for itself (a time limit for the constructors), but "
                f"{cls.__qualname__}.__init__ takes one too; pass {cls.__qualname__}'s positionally"
            )
        from .._runtime.inits import init_timeout as _limit

        limit = _limit(init_timeout)
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn() needs a subclass of jupyter_mesh.Actor, got {cls!r}")
        if not isinstance(name, str) or not name:
            raise MeshValueError("spawn() needs a non-empty actor mesh name as its first argument")
        endpoints = endpoints_of(cls)
        mesh: ActorMesh[A] = ActorMesh(
            self._ref,
            new_id(name),
            name,
            cls.__qualname__,
            frozenset(endpoints),
            self._view,
            Signatures.of(cls, endpoints),
        )
        mesh._actor_class = cls
        _refuse_shadowed(mesh, cls)
        on = None if self._view is None else frozenset(self._view.ranks())  # (a slice: only its procs' deaths)
        self._controller.faults.spawning(mesh._actor_id, self._ref.mesh_id, name, on)  # in an actor: it supervises them
        mesh.initialized = _client().spawn_actors(mesh, cls, args, kwargs)
        self._controller.watch_init(mesh, mesh.initialized, limit)
        _owned_by_caller("actors", mesh)
        return mesh

    def stop(self, reason: str = "stopped by client", *, timeout: float = 10.0) -> Future[None]:
        """Stop every proc of the mesh; idempotent. Each proc finalizes (``atexit`` handlers, ``weakref``
        finalizers) and exits; one that has not within ``timeout`` seconds is killed. Later calls to its
        actors raise :class:`SupervisionError` (kind ``stopped``).

        The stop is done when this returns; the :class:`Future` it returns (already complete) is for
        Monarch's ``await pm.stop()`` and ``pm.stop().get()``. ``reason`` is Monarch's argument, unused.
        """
        self._owner_only("stop")
        self._controller.stop_procs(self._ref, timeout)
        return Future.completed(None, f"stop of '{self._ref.name}'")

    def activate(self) -> Any:
        """``with procs.activate():`` torch calls in the block make distributed tensors on these procs
        (Monarch's tensor engine, minimal: ``jupyter_mesh._api.tensor_engine``)."""
        from .tensor_engine import activate

        return activate(self)

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def state(self) -> MeshState:
        """A snapshot of every rank's state (starting, idle, busy, paused, failed, stopped)."""
        self._owner_only("read the state of")
        return self._controller.state.snapshot(self._ref.mesh_id)

    def subscribe(self, listener: Callable[[MeshEvent], None]) -> Callable[[], None]:
        """Call ``listener(event)`` on every change of this mesh; returns a function that unsubscribes.

        Listeners run on the runtime's threads (its receive thread, or a caller's thread while it reads
        its own replies in ``get()``): keep them quick, non-blocking and thread-safe.
        """
        self._owner_only("subscribe to")
        return self._controller.state.subscribe(listener, self._ref.mesh_id)

    def _rank_of(self, rank: int | Mapping[str, int]) -> int:
        if isinstance(rank, Mapping):
            view = self._shape.select(**dict(rank))
            if len(view) != 1:
                raise MeshValueError(f"{dict(rank)} selects {len(view)} procs; give every dim of {self._shape}")
            return view.slice.offset
        ranks = self._shape.ranks()
        if not isinstance(rank, int) or not 0 <= rank < len(ranks):
            raise MeshValueError(f"rank {rank!r} out of range: this mesh has {len(ranks)} procs")
        return ranks[rank]

    def kill(self, rank: int | Mapping[str, int], sig: int = 15) -> None:
        """Stop one proc (by index in this view, or by coordinates) with ``sig`` (default SIGTERM).

        The rank then counts as failed, like any other death: calls to it raise SupervisionError
        until :meth:`respawn` gives it a new proc. A proc sent SIGTERM that has not ended 5 s later
        (its ``atexit`` handlers still run, or it ignores the signal) is sent SIGKILL.
        """
        self._owner_only("kill")
        self._check_open()
        self._controller.kill(self._ref, self._rank_of(rank), sig)

    def respawn(self, ranks: list[int] | None = None, timeout: float = 60.0) -> list[int]:
        """New procs for failed ranks (all of them by default), at the same coordinates; every actor
        mesh spawned on this proc mesh from this program is re-created there with its original
        arguments. Returns the respawned global ranks."""
        self._owner_only("respawn")
        self._check_open()
        targets = None if ranks is None else [self._rank_of(r) for r in ranks]
        return self._controller.respawn(self._ref, targets, timeout)

    def resize(self, timeout: float = 60.0, **sizes: int) -> None:
        """Grow or shrink the mesh, e.g. ``procs.resize(gpus=8)``; actor meshes spawned on the whole
        mesh follow (new ranks get actors built with the original spawn arguments).

        Ranks keep their numbers, so only the outermost dim of size > 1 can change (``gpus`` on one
        host, or ``hosts``). Shrinking stops the procs past the new end.
        """
        self._owner_only("resize")
        self._check_open()
        if self._view is not None:
            raise MeshValueError("resize() the whole proc mesh, not a slice of it")
        if len(sizes) != 1:
            raise MeshValueError(f"resize() takes exactly one dim=size, got {sizes}")
        ((dim, size),) = sizes.items()
        self._controller.resize(self._ref, dim, size, timeout)

    def logs(self, rank: int | None = None, tail: int | None = 200) -> list[str]:
        """The last ``tail`` output lines of the procs (or of one global ``rank``), prefixed by rank."""
        self._owner_only("read the logs of")
        lines = self._controller.logs(self._ref, rank, tail)
        return [
            f"[{self._ref.name} {','.join(f'{k}={v}' for k, v in self._ref.coords(r).items())}] {text}"
            for _, r, _, text in lines
        ]

    def stacks(
        self,
        rank: int | Mapping[str, int] | list[int] | None = None,
        timeout: float = 5.0,
        all_threads: bool = False,
    ) -> Any:
        """Where each rank is now: every thread's Python stack (``print()`` it: identical stacks of
        several ranks are folded). Asked of each proc's receive thread, so a rank stuck in a
        collective or a deadlock answers; one holding the GIL in native code says so. Runtime threads
        that only wait are left out unless ``all_threads``. ``rank``: one, a list of them, or all."""
        self._owner_only("read the stacks of")
        self._check_open()
        if not 0 < timeout < float("inf"):  # 0 blames every rank; inf (or nan) waits on a stopped one for good
            raise MeshValueError(f"stacks(timeout={timeout!r}): give a number of seconds above 0, e.g. 5")
        if isinstance(rank, list):
            ranks = [self._rank_of(r) for r in rank]
        else:
            ranks = [self._rank_of(rank)] if rank is not None else list(self._shape.ranks())
        return self._controller.stacks(self._ref, ranks, timeout, all_threads)

    def pids(self) -> dict[int, int]:
        """Global rank -> OS pid, for the procs of this view (handy for tests and debugging)."""
        self._owner_only("list the pids of")
        pids = self._controller.proc_pids(self._ref.mesh_id)
        return {r: pids[r] for r in self._shape.ranks()}

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"<ProcMesh '{self._ref.name}' {self._shape} {state}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """In a notebook: the live grid of this mesh, drawn by whichever view registered itself
        (``_core.slots``; ``jupyter_mesh`` registers its own UI); plain text otherwise."""
        view = slots.proc_mesh_view
        return {"text/plain": repr(self)} if view is None else view(self)


def _proc_mesh_ref(ref: ProcMeshRef, view: Shape | None) -> ProcMesh:
    """A ProcMesh unpickled in another process (an actor it was passed to): bound to that process's
    controller, which inside a proc shares the proc's runtime. Back in the spawning program, the
    controller's own record of it (kept current by respawns and resizes) is used."""
    from .._runtime.controller import Controller

    ctl = Controller.get()
    rec = ctl.meshes.get(ref.mesh_id)
    return ProcMesh(ctl, rec.ref if rec is not None else ref, view)


def _takes_init_timeout(cls: type) -> bool:
    import inspect

    try:
        return "init_timeout" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
