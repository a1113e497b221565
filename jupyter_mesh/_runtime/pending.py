"""Calls waiting for replies: one call's record (``Pending``), the table of them with each actor's
``call_one``/``choose`` load per rank, a stream's iterator, and a remote exception made into a
``RemoteFailure``. ``outcomes`` turns replies into values; ``calls`` holds the table the client owns."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.future import Future, on_receive_thread, refused
from .._core.shape import Shape
from ..errors import CallSite, Failure, RemoteFailure
from .remote_errors import exception_of, render_traceback

if TYPE_CHECKING:
    from .._core.refs import ProcMeshRef
    from .replies import ReplyBox

__all__ = [
    "Pending",
    "PendingTable",
    "Stream",
    "pack_gathered",
    "remote_failure",
]


@dataclass
class Pending:
    """A call waiting for replies from ``ranks`` (global ranks, in view order)."""

    future: Future[Any] | None
    mesh_id: str
    mode: str  # call | one | stream | request
    actor: str = ""
    endpoint: str = ""
    shape: Shape | None = None
    ranks: list[int] = field(default_factory=list)
    outstanding: set[int] = field(default_factory=set)
    progressed: set[int] = field(default_factory=set)  # outstanding, but their agent holds their reply
    values: dict[int, Any] = field(default_factory=dict)
    raised: list[RemoteFailure] = field(default_factory=list)
    broken: list[Failure] = field(default_factory=list)
    ref: ProcMeshRef | None = None
    stream_q: queue.SimpleQueue[Future[Any]] | None = None
    call_id: int = 0
    actor_id: str = ""  # the actor called (spawns: whose inbox addresses the replies carry)
    box: ReplyBox | None = None  # where the replies go, if not to the client's inbox
    peer: str = ""  # control requests: the agent that must answer (its loss fails the request)
    reduce: str = ""  # a reduce: its op's name; its agents' partial values, and what folding raised
    reduce_fn: Any = None
    partials: list[Any] = field(default_factory=list)
    reduce_error: BaseException | None = None
    cls: str = ""  # the actor's class, named in the errors of the call

    def site(self) -> CallSite | None:
        """The endpoint call this is, for a :class:`SupervisionError`'s lead line (None: no call)."""
        return CallSite(self.actor, self.cls, self.endpoint) if self.mode in ("call", "one", "stream") else None

    def fail(self, err: BaseException, ranks: int) -> None:
        """Nothing more will come for ``ranks`` of its ranks: a stream gets that many failed futures
        (its consumer must not wait for them), any other call fails its future."""
        if self.stream_q is None:
            if self.future is not None:
                self.future._set_exception(err)
            return
        for _ in range(ranks):
            f: Future[Any] = Future(self.endpoint)
            f._set_exception(err)
            self.stream_q.put(f)


class PendingTable(dict[int, Pending]):
    """The client's calls in flight by call id, counting its ``call_one``/``choose`` calls per
    (actor, rank) as they come and go, so ``choose`` finds the least loaded rank in O(ranks), not
    O(calls in flight). Every way a call leaves the table goes through ``pop``/``del``/``clear``."""

    def __init__(self) -> None:
        super().__init__()
        self.load: dict[tuple[str, int], int] = {}

    def __setitem__(self, call_id: int, p: Pending) -> None:
        old = self.get(call_id)
        if old is not None:
            self._left(old)
        super().__setitem__(call_id, p)
        if p.mode == "one":
            key = (p.actor_id, p.ranks[0])
            self.load[key] = self.load.get(key, 0) + 1

    def _left(self, p: Pending) -> None:
        if p.mode == "one":
            key = (p.actor_id, p.ranks[0])
            n = self.load.get(key, 0) - 1
            if n > 0:
                self.load[key] = n
            else:
                self.load.pop(key, None)

    def pop(self, call_id: int, default: Any = None) -> Any:  # type: ignore[override]
        p = super().pop(call_id, None)
        if p is None:
            return default
        self._left(p)
        return p

    def __delitem__(self, call_id: int) -> None:
        self._left(self[call_id])
        super().__delitem__(call_id)

    def clear(self) -> None:
        super().clear()
        self.load.clear()


class Stream(Iterator[Future[Any]]):
    """Completed futures in arrival order. Leaving early (``break``, Ctrl-C, an exception, or just
    dropping the iterator) cancels the calls still running, so nothing keeps working for nobody.
    Ctrl-C while waiting raises what ``interrupt`` reports (``MeshInterrupted``: where it stopped)."""

    def __init__(
        self,
        p: Pending,
        actor_id: str,
        cancel: Callable[[Pending, str], None],
        defer_cancel: Callable[[Pending, str], None],
        interrupt: Callable[[Pending, Callable[[], object]], BaseException] | None = None,
    ):
        self._p, self._actor_id = p, actor_id
        self._cancel, self._defer_cancel, self._interrupt = cancel, defer_cancel, interrupt
        self._left = len(p.ranks)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Future[Any]:
        if not self._left:
            raise StopIteration
        assert self._p.stream_q is not None
        if self._p.stream_q.empty() and on_receive_thread():  # a done callback: only this thread reads
            raise refused(f"the next result of a stream of {self._p.endpoint}")  # the replies it waits for
        try:
            item = self._p.stream_q.get()
        except KeyboardInterrupt:
            if self._interrupt is None or not self._left:
                self.close()
                raise
            self._left = 0
            raise self._interrupt(self._p, lambda: self._cancel(self._p, self._actor_id)) from None
        except BaseException:
            self.close()
            raise
        self._left -= 1
        return item

    def close(self) -> None:
        if self._left:
            self._left = 0
            self._cancel(self._p, self._actor_id)

    def __del__(self) -> None:
        # a finalizer may run inside any code that holds the client's lock (the GC runs anywhere):
        # it only queues the cancel, which the next call from this process carries out
        if self._left:
            self._left = 0
            self._defer_cancel(self._p, self._actor_id)


def remote_failure(info: Any, p: Pending, rank: int) -> RemoteFailure:
    coords = p.ref.coords(rank) if p.ref else {}
    tb = render_traceback(info) or info["tb"]
    return RemoteFailure(
        coords, p.actor, info.get("endpoint", p.endpoint), info["type"], info["msg"], tb, exception_of(info)
    )


def pack_gathered(
    entries: Sequence[tuple[int, int, bytes | memoryview, list[Any]]],
) -> tuple[list[list[int]], bytes, list[Any]]:
    """(rank, ok, payload, buffers) per rank -> header table, one payload, all buffers (for ``g``)."""
    table, parts, bufs = [], [], []
    for rank, ok, payload, b in entries:
        table.append([rank, ok, len(payload), len(b)])
        parts.append(bytes(payload))
        bufs.extend(b)
    return table, b"".join(parts), bufs
