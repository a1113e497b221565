"""Future: the result of a remote call, usable from sync code (``get``) and async code (``await``).

Results are set from the runtime's threads (the receive thread, or the caller's own thread reading its
reply box), while the caller may be a plain thread, a Jupyter cell or an asyncio task on any loop. A
small lock-based future rather than ``concurrent.futures.Future``: that one builds a ``Condition`` per
future, ~3 us of every ``call_one`` on this machine; here a waiter lock exists only if a thread blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..errors import MeshCancelledError, MeshDeadlockError, MeshTimeoutError

if TYPE_CHECKING:
    import asyncio

__all__ = ["INTERRUPTED", "Future", "mark_receive_thread", "on_receive_thread", "refused", "time_left"]

INTERRUPTED = "jupyter_mesh: interrupted"
"""The message of a task cancelled for Ctrl-C / the notebook's ■ (the ``mesh`` kernel cancels the
cell's task with it): a future awaited there reports the interrupt as ``get()`` would
(``MeshInterrupted``: where the call stopped), not as a bare ``CancelledError``."""

T = TypeVar("T")
log = logging.getLogger("jupyter_mesh.future")

_PENDING, _VALUE, _ERROR = 0, 1, 2


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value), never negative: several waits that
    share one bound (one per host, one per rank) each take what is left of it."""
    return max(0.0, deadline - time.monotonic())


class Driver(Protocol):
    """Who delivers a future's value when the waiting thread itself reads the reply (the runtime's
    reply boxes). ``drive`` waits up to ``timeout`` and returns the time left; ``detach`` says the
    value will be waited for some other way (await, callback, another thread); ``wake`` is called
    when the value was set by someone else."""

    def drive(self, fut: Future[Any], timeout: float | None) -> float | None: ...
    def detach(self) -> None: ...
    def wake(self) -> None: ...


class PauseHook(Protocol):
    """A front that serves debugger prompts on the thread waiting in ``get()`` (the notebook: an actor
    paused in ``breakpoint()`` prompts in the cell that waits on its call). ``watch`` says the thread
    waits on ``fut`` now (it returns the function that ends the watch, or None: not this thread); the
    front calls ``fut._poke()`` when a pause needs the waiter, and ``get()`` then calls ``serve``."""

    def watch(self, fut: Future[Any]) -> Callable[[], None] | None: ...
    def serve(self) -> None: ...


pause_hook: PauseHook | None = None  # set by ``jupyter_mesh.debug.prompt_while_waiting``

_thread = threading.local()  # ``receives``: this thread reads the process's messages (``mark_receive_thread``)


def mark_receive_thread(on: bool = True) -> None:
    """Say that the calling thread is the process's receive thread (``Transport.serve``), where done
    callbacks run. A ``get()`` there on a pending future raises ``MeshDeadlockError`` at once: the reply
    it waits for can only be read by this thread, so waiting would hang until its timeout (or for ever).
    Reading that reply from inside the wait instead would re-enter the receive loop in the middle of a
    dispatch: every kind of message (heartbeats, failures, other replies) handled inside a user's
    callback, by handlers not written to be re-entered; refusing is the safe answer."""
    _thread.receives = on


def on_receive_thread() -> bool:
    """Is the calling thread the process's receive thread (``mark_receive_thread``)?"""
    return bool(getattr(_thread, "receives", False))


def refused(what: str, how: str = "get()") -> MeshDeadlockError:
    """The error for a wait on the receive thread that could never end (``what``: the call waited on)."""
    return MeshDeadlockError(what, threading.current_thread().name, how)


class Future(Generic[T]):
    """A value that arrives later. ``get(timeout)`` blocks; ``await fut`` suspends."""

    __slots__ = (
        "_any_thread",
        "_callbacks",
        "_driver",
        "_lock",
        "_on_cancel",
        "_on_interrupt",
        "_poked",
        "_remote_cancelled",
        "_state",
        "_value",
        "_waiters",
        "_what",
    )

    def __init__(self, what: str = "call", on_cancel: Callable[[], None] | None = None):
        self._state = _PENDING
        self._value: Any = None
        self._lock = threading.Lock()
        self._waiters: list[threading.Lock] | None = None
        self._callbacks: list[Callable[[Future[T]], Any]] | None = None
        self._what = what
        self._on_cancel = on_cancel
        # Ctrl-C in get(): the runtime cancels and reports where the call stopped (MeshInterrupted); a
        # spawn's is not cancelled (a constructor runs on) and says which ranks still construct
        # (its argument: whether Ctrl-C asked for it, or a caller that gave up at its timeout)
        self._on_interrupt: Callable[[bool], BaseException] | None = None
        self._remote_cancelled = False
        self._driver: Driver | None = None
        self._poked = False  # a debugger pause wants the waiting thread (``PauseHook``)
        # may be finished by a thread other than the receive thread (a port's sender in this process,
        # UCX's progress thread): a wait for it there can end, so it is never refused
        self._any_thread = False

    # -- producer side (the runtime) --------------------------------------------------------------
    def _finish(self, state: int, value: Any) -> bool:
        with self._lock:
            if self._state != _PENDING:  # a reply and a cancel may race: the first one wins
                return False
            self._state, self._value = state, value
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, None
            # the runtime's hooks close over its call record, which holds the result: dropped now, a
            # finished call is freed as soon as its caller lets go (a received tensor's shared memory
            # goes back to its sender then, not at the next garbage collection). Freed after the lock
            # is released (on return), never under it: a destructor must not run inside our lock
            hooks = (self._on_cancel, self._on_interrupt)
            self._on_cancel = self._on_interrupt = None
        if waiters:
            for w in waiters:
                w.release()
        if callbacks:
            for fn in callbacks:
                self._run_callback(fn)
        if self._driver is not None:
            self._driver.wake()
        del hooks
        return True

    def _poke(self) -> None:
        """Wake the thread waiting in ``get()`` without a value: a debugger pause needs it."""
        with self._lock:
            if self._state != _PENDING:
                return
            self._poked = True
            waiters, self._waiters = self._waiters, None
        for w in waiters or ():
            w.release()
        if self._driver is not None:
            self._driver.wake()

    def _set_result(self, value: T) -> None:
        self._finish(_VALUE, value)

    def _set_exception(self, exc: BaseException) -> None:
        self._finish(_ERROR, exc)

    def _done(self) -> bool:
        """Done, without asking anyone else to read the reply (the runtime's own check)."""
        return self._state != _PENDING

    def _detach(self) -> None:
        if self._driver is not None and self._state == _PENDING:
            self._driver.detach()

    def _run_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("a done-callback of %r raised", self)

    def _wait(self, timeout: float | None) -> bool:
        """Block until done or ``timeout``; True if done. Ctrl-C interrupts the wait."""
        if self._state != _PENDING:
            return True
        waiter = threading.Lock()
        waiter.acquire()
        with self._lock:
            if self._state != _PENDING or self._poked:
                return self._state != _PENDING
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
        try:
            if timeout is None:
                waiter.acquire()
            else:
                waiter.acquire(timeout=max(0.0, timeout))
        finally:
            with self._lock:
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self._state != _PENDING

    # -- consumer side ------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> T:
        """Wait for the value; raise the remote error, or ``MeshTimeoutError(phase="call")``.

        Ctrl-C (or a notebook interrupt) while waiting cancels the remote work, then re-raises. On the
        receive thread (in a done callback) a pending future whose reply that thread does not read in a
        box of its own raises ``MeshDeadlockError`` at once (``mark_receive_thread``); ``timeout=0``
        there still just looks (``MeshTimeoutError``).
        """
        if self._state == _PENDING:
            try:
                hook = pause_hook
                if hook is None:
                    self._poked = False  # a poke that came too late for a front gone since: not ours
                    wait = timeout
                    if self._driver is not None:
                        wait = self._driver.drive(self, wait)
                    self._refuse_unanswerable(wait)
                    if not self._wait(wait):
                        raise MeshTimeoutError("call", timeout, self._what)
                else:
                    self._get_serving(hook, timeout)
            except KeyboardInterrupt:
                on_interrupt = self._on_interrupt
                if on_interrupt is None or self._state != _PENDING:
                    self.cancel()
                    raise
                raise on_interrupt(True) from None
        if self._state == _ERROR:
            raise self._value
        return self._value  # type: ignore[no-any-return]

    def _refuse_unanswerable(self, wait: float | None) -> None:
        """On the receive thread, a wait for a reply this thread does not read itself (no reply box of
        its own drove it to the end: ``drive`` left time) could never end: raise instead of hanging. A
        call the callback made itself is answered in this thread's own box, and waits as anywhere."""
        if (
            self._state == _PENDING
            and not self._poked
            and not self._any_thread
            and (wait is None or wait > 0)
            and on_receive_thread()
        ):
            raise refused(self._what)

    def _get_serving(self, hook: PauseHook, timeout: float | None) -> None:
        """``get()``'s wait while a front serves debugger prompts on this thread: time spent at a
        prompt does not count against ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else time_left(deadline)
            stop = hook.watch(self)
            try:
                if self._driver is not None:
                    wait = self._driver.drive(self, wait)
                self._refuse_unanswerable(wait)
                done = self._wait(wait)
            finally:
                if stop is not None:
                    stop()
            if done:
                return
            if not self._poked:
                raise MeshTimeoutError("call", timeout, self._what)
            self._poked = False
            began = time.monotonic()
            hook.serve()
            if deadline is not None:
                deadline += time.monotonic() - began

    def cancel(self) -> bool:
        """Stop waiting and ask the remote side to stop; False if the result was already there."""
        if self._remote_cancelled or self._state != _PENDING:
            return False
        self._remote_cancelled = True
        on_cancel = self._on_cancel
        self._set_exception(MeshCancelledError(f"{self._what} was cancelled"))
        if on_cancel is not None:
            try:
                on_cancel()
            except Exception:  # noqa: BLE001 - best effort: the caller is already released
                pass
        return True

    def _cancel_reported(self) -> BaseException | None:
        """Cancel as Ctrl-C in ``get()`` does (for a caller that gives up at its timeout): the ranks are
        asked to stop and waited for a moment; the runtime's report of it (a ``MeshInterrupted``: where
        it stopped, which ranks still run), or None where there is none (a plain cancel, or done)."""
        on_interrupt = self._on_interrupt
        if on_interrupt is None or self._state != _PENDING:
            self.cancel()
            return None
        return on_interrupt(False)  # no Ctrl-C yet: the next one is a first, not a second

    def cancelled(self) -> bool:
        return self._state == _ERROR and isinstance(self._value, MeshCancelledError)

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except MeshDeadlockError:
            if self._state == _PENDING:  # the wait was refused: this is no error of the future's
                raise
            return self._value if self._state == _ERROR else None  # type: ignore[no-any-return]
        except MeshTimeoutError:
            if self._state == _PENDING:
                raise
            return self._value if self._state == _ERROR else None  # type: ignore[no-any-return]
        except BaseException as e:  # noqa: BLE001 - returning it is the point
            return e
        return None

    def done(self) -> bool:
        self._detach()  # polled: someone else must read the reply
        return self._state != _PENDING

    def add_done_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        """``fn(future)`` once done: at once if it is, else on the thread that finishes it (mostly the
        receive thread: a ``get()`` in ``fn`` on a future still pending raises ``MeshDeadlockError``)."""
        self._detach()
        with self._lock:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def __await__(self) -> Generator[Any, None, T]:
        import asyncio  # (loaded already: something runs this loop) not at the top: an agent never awaits

        loop = asyncio.get_running_loop()
        if self._state == _PENDING and not self._any_thread and on_receive_thread():
            # an event loop run inside a done callback (asyncio.run): the reply would be read by this
            # thread once the callback returns, and the callback waits for the loop: it hung for ever
            raise refused(self._what, "await")
        waiter: asyncio.Future[T] = loop.create_future()

        def copy() -> None:
            if waiter.done():
                return
            if self._state == _ERROR:
                waiter.set_exception(self._value)
            else:
                waiter.set_result(self._value)

        def on_done(_f: Future[T]) -> None:  # on whichever thread finished us
            try:
                loop.call_soon_threadsafe(copy)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        self.add_done_callback(on_done)
        try:
            return (yield from waiter.__await__())
        except asyncio.CancelledError as e:
            # the awaiting task was cancelled: stop the remote work too. An interrupt is reported
            # like one in get(): where the call stopped, how fast (MeshInterrupted)
            on_interrupt = self._on_interrupt
            if e.args == (INTERRUPTED,) and on_interrupt is not None and self._state == _PENDING:
                raise on_interrupt(True) from None
            self.cancel()
            raise
        finally:
            if not waiter.done():  # closed without a throw (the task was dropped): nobody waits
                self.cancel()

    def as_asyncio(self) -> asyncio.Future[T]:
        """An ``asyncio.Future`` (a task of the running loop) that resolves as this one does (Monarch's
        ``Future.as_asyncio``); cancelling it cancels the call. Needs a running event loop."""
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"as_asyncio() of {self._what} needs a running asyncio event loop; outside one, use get()"
            ) from None

        async def wait() -> T:
            return await self

        return loop.create_task(wait())

    def __repr__(self) -> str:
        state = "pending" if self._state == _PENDING else "done"
        return f"<Future {self._what} {state}>"

    @staticmethod
    def completed(value: T, what: str = "call") -> Future[T]:
        f: Future[T] = Future(what)
        f._set_result(value)
        return f
