"""Future: the result of a remote call, usable from sync code (``get``) and async code (``await``).

Backed by ``concurrent.futures.Future`` because results are set from the runtime's receive thread,
while the caller may be a plain thread, a Jupyter cell or an asyncio task on any loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Generator, Generic, TypeVar

from .errors import MeshCancelledError, MeshTimeoutError

__all__ = ["Future"]

T = TypeVar("T")


class Future(Generic[T]):
    """A value that arrives later. ``get(timeout)`` blocks; ``await fut`` suspends."""

    __slots__ = ("_cf", "_what", "_on_cancel")

    def __init__(self, what: str = "call", on_cancel: Callable[[], None] | None = None):
        self._cf: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._what = what
        self._on_cancel = on_cancel

    # -- producer side (the runtime) --------------------------------------------------------------
    def _set_result(self, value: T) -> None:
        if not self._cf.done():
            self._cf.set_result(value)

    def _set_exception(self, exc: BaseException) -> None:
        if not self._cf.done():
            self._cf.set_exception(exc)

    # -- consumer side ------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> T:
        """Wait for the value; raise the remote error, or ``MeshTimeoutError(phase="call")``.

        Ctrl-C (or a notebook interrupt) while waiting cancels the remote work, then re-raises.
        """
        try:
            return self._cf.result(timeout)
        except concurrent.futures.TimeoutError:
            if self._cf.done():  # lost the race with the producer
                return self._cf.result(0)
            raise MeshTimeoutError("call", timeout, self._what) from None
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self) -> bool:
        """Stop waiting and ask the remote side to stop; False if the result was already there."""
        if self._cf.done():
            return False
        self._set_exception(MeshCancelledError(f"{self._what} was cancelled"))
        if self._on_cancel is not None:
            try:
                self._on_cancel()
            except Exception:  # noqa: BLE001 - best effort: the caller is already released
                pass
        return True

    def cancelled(self) -> bool:
        return self._cf.done() and isinstance(self._cf.exception(), MeshCancelledError)

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
        return self._cf.done()

    def add_done_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        self._cf.add_done_callback(lambda _cf: fn(self))

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self._cf).__await__()

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<Future {self._what} {state}>"

    @staticmethod
    def completed(value: T, what: str = "call") -> Future[T]:
        f: Future[T] = Future(what)
        f._set_result(value)
        return f
