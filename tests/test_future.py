"""The Future on its own: values and errors set from other threads reach get(), await and callbacks."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from jupyter_mesh import MeshCancelledError, MeshDeadlockError, MeshTimeoutError
from jupyter_mesh._core.future import Future, mark_receive_thread


def _later(seconds: float, fn, *args) -> None:
    threading.Timer(seconds, fn, args=args).start()


def test_get_blocks_until_another_thread_sets_the_value():
    f: Future[int] = Future("x")
    _later(0.05, f._set_result, 7)
    assert f.get(timeout=5) == 7 and f.done() and f.result() == 7 and f.exception() is None


def test_get_raises_the_error_and_times_out_cleanly():
    f: Future[int] = Future("x")
    with pytest.raises(MeshTimeoutError):
        f.get(timeout=0.05)
    err = ValueError("boom")
    f._set_exception(err)
    with pytest.raises(ValueError):
        f.get()
    assert f.exception() is err
    f._set_result(1)  # the first outcome wins
    assert f.exception() is err


def test_many_waiters_all_wake():
    f: Future[str] = Future("x")
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(f.get(timeout=5))) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    f._set_result("v")
    for t in threads:
        t.join(5)
    assert got == ["v"] * 8


def test_callbacks_run_once_even_if_one_raises():
    f: Future[int] = Future("x")
    seen: list[int] = []

    def bad(_f: Future[int]) -> None:
        raise RuntimeError("a broken callback")

    f.add_done_callback(bad)
    f.add_done_callback(lambda g: seen.append(g.get()))
    f._set_result(3)
    f._set_result(4)
    f.add_done_callback(lambda g: seen.append(g.get() * 10))  # already done: runs at once
    assert seen == [3, 30]


def test_await_gets_values_and_errors_set_from_threads():
    async def main() -> tuple[int, str]:
        ok: Future[int] = Future("ok")
        bad: Future[int] = Future("bad")
        _later(0.02, ok._set_result, 5)
        _later(0.02, bad._set_exception, KeyError("k"))
        value = await ok
        try:
            await bad
        except KeyError as e:
            return value, str(e)
        return value, ""

    assert asyncio.run(main()) == (5, "'k'")


def test_cancel_releases_waiters_and_calls_back_once():
    calls: list[int] = []
    f: Future[int] = Future("x", on_cancel=lambda: calls.append(1))
    _later(0.05, f.cancel)
    with pytest.raises(MeshCancelledError):
        f.get(timeout=5)
    assert f.cancelled() and calls == [1]
    assert not f.cancel() and calls == [1]
    done: Future[int] = Future.completed(2)
    assert not done.cancel() and done.get() == 2


def test_a_cancelled_await_cancels_the_future():
    f: Future[int] = Future("x")

    async def main() -> None:
        task = asyncio.ensure_future(_await(f))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def _await(fut: Future[int]) -> int:
        return await fut

    asyncio.run(main())
    assert f.cancelled()


def test_the_rule_holds_for_any_thread_marked_as_a_receive_thread():
    """On the receive thread (``Transport.serve`` marks it) get() on a pending future is refused at once;
    done futures and polls (timeout=0) still answer. tests/test_callback_get.py: the same with processes."""
    pending: Future[int] = Future("Demo.step")
    done = Future.completed(5, "Demo.done")
    out: dict[str, object] = {}

    def on_receive_thread() -> None:
        mark_receive_thread()
        try:
            out["done"] = done.get()
            for timeout in (None, 30.0):
                try:
                    pending.get(timeout)
                except MeshDeadlockError as e:
                    out[f"refused {timeout}"] = e
            try:
                pending.get(timeout=0)
            except MeshTimeoutError:
                out["poll"] = "timeout"
        finally:
            mark_receive_thread(False)

    t = threading.Thread(target=on_receive_thread, name="jupyter-mesh-recv")
    t.start()
    t.join(30)
    assert out["done"] == 5 and out["poll"] == "timeout"
    err = out["refused None"]
    assert isinstance(err, MeshDeadlockError) and isinstance(err, RuntimeError) and "refused 30.0" in out
    assert "Demo.step" in str(err) and "'jupyter-mesh-recv'" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MeshDeadlockError and str(back) == str(err)
    assert not pending.done()
    pending._set_result(7)  # elsewhere (this thread is not marked) the wait works as always
    assert pending.get(timeout=5) == 7
