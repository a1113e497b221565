"""Future: the result of a remote call, usable from sync code (``get``) and async code (``await``).

Backed by ``concurrent.futures.Future`` because results are set from the runtime's receive thread,
while the caller may be a plain thread, a Jupyter cell or an asyncio task on any loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from .errors import MeshCancelledError, MeshTimeoutError

__all__ = ["Future"]

T = TypeVar("T")


class Driver(Protocol):
    """Who delivers a future's value when the waiting thread itself reads the reply (the runtime's
    reply boxes). ``drive`` waits up to ``timeout`` and returns the time left; ``detach`` says the
    value will be waited for some other way (await, callback, another thread); ``wake`` is called
    when the value was set by someone else."""

    def drive(self, fut: Future[Any], timeout: float | None) -> float | None: ...
    def detach(self) -> None: ...
    def wake(self) -> None: ...


class Future(Generic[T]):
    """A value that arrives later. ``get(timeout)`` blocks; ``await fut`` suspends."""

    __slots__ = ("_cf", "_driver", "_on_cancel", "_remote_cancelled", "_what")

    def __init__(self, what: str = "call", on_cancel: Callable[[], None] | None = None):
        self._cf: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._what = what
        self._on_cancel = on_cancel
        self._remote_cancelled = False
        self._driver: Driver | None = None

    # -- producer side (the runtime) --------------------------------------------------------------
    def _set_result(self, value: T) -> None:
        try:  # a reply and a cancel may race: the first one wins, the other is a no-op
            self._cf.set_result(value)
        except concurrent.futures.InvalidStateError:
            return
        if self._driver is not None:
            self._driver.wake()

    def _set_exception(self, exc: BaseException) -> None:
        try:
            self._cf.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            return
        if self._driver is not None:
            self._driver.wake()

    def _detach(self) -> None:
        if self._driver is not None and not self._cf.done():
            self._driver.detach()

    # -- consumer side ------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> T:
        """Wait for the value; raise the remote error, or ``MeshTimeoutError(phase="call")``.

        Ctrl-C (or a notebook interrupt) while waiting cancels the remote work, then re-raises.
        """
        try:
            if self._driver is not None and not self._cf.done():
                timeout = self._driver.drive(self, timeout)
            return self._cf.result(timeout)
        except concurrent.futures.CancelledError:
            raise MeshCancelledError(f"{self._what} was cancelled") from None
        except concurrent.futures.TimeoutError:
            if self._cf.done():  # lost the race with the producer
                return self._cf.result(0)
            raise MeshTimeoutError("call", timeout, self._what) from None
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self) -> bool:
        """Stop waiting and ask the remote side to stop; False if the result was already there."""
        if self._remote_cancelled or (self._cf.done() and not self._cf.cancelled()):
            return False
        self._remote_cancelled = True
        self._set_exception(MeshCancelledError(f"{self._what} was cancelled"))
        if self._on_cancel is not None:
            try:
                self._on_cancel()
            except Exception:  # noqa: BLE001 - best effort: the caller is already released
                pass
        return True

    def cancelled(self) -> bool:
        return self._cf.cancelled() or (self._cf.done() and isinstance(self._cf.exception(), MeshCancelledError))

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except MeshTimeoutError:
            raise
        except BaseException as e:  # noqa: BLE001 - returning it is the point
            return e
        return None

    def done(self) -> bool:
        self._detach()  # polled: someone else must read the reply
        return self._cf.done()

    def add_done_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        self._detach()
        self._cf.add_done_callback(lambda _cf: fn(self))

    def __await__(self) -> Generator[Any, None, T]:
        self._detach()
        waiter = asyncio.wrap_future(self._cf)

        def on_done(f: asyncio.Future[T]) -> None:
            if f.cancelled():  # the awaiting task was cancelled (notebook interrupt, timeout): stop remote work
                self.cancel()

        waiter.add_done_callback(on_done)
        return waiter.__await__()

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<Future {self._what} {state}>"

    @staticmethod
    def completed(value: T, what: str = "call") -> Future[T]:
        f: Future[T] = Future(what)
        f._set_result(value)
        return f
