"""Monarch's helpers around endpoints: ``Accumulator`` (fold a call's results) and ``send`` (fire and
forget, optionally with the results going to a port)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

from .._core.future import Future
from .._core.ports import Port
from .._core.value_mesh import ValueMesh
from ..errors import MeshValueError
from .mesh import MeshEndpoint
from .tensor_engine import Remote

__all__ = ["Accumulator", "send"]

R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[R, A]):
    """``Accumulator(mesh.endpoint, identity, combine).accumulate(*args)``: call every actor, fold their
    results with ``combine`` starting from ``identity``; a ``Future`` of the folded value."""

    def __init__(self, endpoint: MeshEndpoint[..., R], identity: A, combine: Callable[[A, R], A]):
        self._endpoint, self._identity, self._combine = endpoint, identity, combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        out: Future[A] = Future(f"accumulate of {self._endpoint!r}")
        results: Future[ValueMesh[R]] = self._endpoint.call(*args, **kwargs)

        def fold(done: Future[ValueMesh[R]]) -> None:
            try:
                value = self._identity
                for r in done.get().values():
                    value = self._combine(value, r)
            except BaseException as e:  # noqa: BLE001 - the caller's future carries it
                out._set_exception(e)
                return
            out._set_result(value)

        results.add_done_callback(fold)
        return out


def send(
    endpoint: MeshEndpoint[..., R] | Remote[..., R],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    port: Port[R] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Call ``endpoint`` on every actor (``selection="all"``) or on one (``"choose"``) without waiting.
    With a ``port``, each result (or error) is sent to it as it arrives; without, results are dropped.
    A ``@remote`` function runs on the procs of the active mesh (``with procs.activate():``)."""
    kwargs = kwargs or {}
    if selection not in ("all", "choose"):
        raise MeshValueError(f"send(selection=...) takes 'all' or 'choose', got {selection!r}")
    if port is None and selection == "all":
        endpoint.broadcast(*args, **kwargs)
        return
    if selection == "choose":
        one: Future[Any] = endpoint.choose(*args, **kwargs)
        one.add_done_callback(lambda f: _forward(f, port, one=True))  # read by the runtime, not by us
        return
    endpoint.call(*args, **kwargs).add_done_callback(lambda f: _forward(f, port, one=False))


def _forward(fut: Future[Any], port: Port[Any] | None, one: bool) -> None:
    if port is None:
        return
    err = fut.exception(0)
    if err is not None:
        port.exception(err)
    elif one:
        port.send(fut.get(0))
    else:
        for rank, value in enumerate(fut.get(0).values()):
            port._ranked(rank).send(value)
