"""Cancellation: the caller is released at once and the remote work stops."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from _procs import wait_for
from actors import Sleeper

from jupyter_mesh import MeshCancelledError

pytestmark = pytest.mark.integration


def _running(started, ranks) -> bool:
    """Wait until a Sleeper call runs on ``ranks`` (its ``started`` files): a cancel before that skips it."""
    return wait_for(lambda: all(os.path.exists(f"{started}{r}") for r in ranks), 30)


@pytest.mark.parametrize("endpoint", ["busy_loop", "nap"])
def test_cancel_stops_sync_and_async_endpoints(procs, endpoint, tmp_path):
    s = procs.spawn("s", Sleeper)
    one = s.slice(gpus=0)
    fut = getattr(one, endpoint).call_one(30, str(tmp_path / "started"))
    assert _running(tmp_path / "started", [0])
    assert fut.cancel()
    assert fut.cancelled()  # released by cancel() itself, before any answer from the proc
    with pytest.raises(MeshCancelledError):
        fut.get(timeout=0)
    # the actor is free again (it would be busy for 30 s otherwise) and counted the cancel
    assert one.counts.call_one().get(timeout=5) == (0, 1)


def test_cancel_a_whole_mesh_call_and_queued_calls(procs, tmp_path):
    s = procs.spawn("s", Sleeper)
    running = s.nap.call(30, str(tmp_path / "started"))
    queued = s.nap.call(30)
    assert _running(tmp_path / "started", range(4))
    assert running.cancel() and queued.cancel()
    # answers within the hang guard: nothing is left running (a 30 s nap would keep it queued)
    counts = s.counts.call().get(timeout=10)
    for finished, cancelled in counts.values():
        # the queued call is skipped, or cancelled just after it started if its cancel came late
        assert finished == 0 and cancelled in (1, 2)


def test_ctrl_c_in_get_cancels_remote_work(procs, tmp_path):
    s = procs.spawn("s", Sleeper)
    one = s.slice(gpus=1)
    fut = one.busy_loop.call_one(30, str(tmp_path / "started"))
    assert _running(tmp_path / "started", [1])
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    # the wait outlasts the call: a wait that Ctrl-C did not break would end with the call's value
    # (not cancelled, counts (1, 0)), and a late KeyboardInterrupt would find the future done
    with pytest.raises(KeyboardInterrupt):
        fut.get(timeout=60)
    assert fut.cancelled()
    assert one.counts.call_one().get(timeout=5) == (0, 1)


def test_cancel_after_done_is_false(procs):
    s = procs.spawn("s", Sleeper)
    fut = s.slice(gpus=0).nap.call_one(0)
    assert fut.get(timeout=5) == "finished"
    assert not fut.cancel()


def test_cancelled_await_cancels_remote_work(procs):
    s = procs.spawn("s", Sleeper)
    one = s.slice(gpus=2)

    async def main():
        task = asyncio.ensure_future(_await(one))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def _await(m):
        return await m.nap.call_one(30)

    asyncio.run(main())
    assert one.counts.call_one().get(timeout=5) == (0, 1)


def test_leaving_a_stream_early_cancels_the_rest(procs):
    s = procs.spawn("s", Sleeper)
    s.slice(gpus=0).nap.call_one(0).get(timeout=5)
    stream = s.nap.stream(30)
    it = iter(stream)
    time.sleep(0.3)
    it.close()  # what a `break` out of the loop (or Ctrl-C in it) does to the generator
    counts = s.counts.call().get(timeout=5)
    assert [c for _, c in counts.values()] == [1, 1, 1, 1]


def test_late_cancels_leave_nothing_behind(procs):
    """A cancel that arrives after its call finished must not be remembered forever."""
    from actors import Introspect

    from jupyter_mesh._runtime.client import current_client
    from jupyter_mesh._wire.transport import Message

    a = procs.spawn("i", Introspect).slice(gpus=0)
    assert a.ok.call_one().get(timeout=5) == "ok"
    client = current_client()
    last = next(client._ids)  # every call id below this one has run already
    for call_id in range(max(1, last - 50), last):  # as if each cancel had lost the race with its reply
        client.transport.send(
            procs._ref.proc_addrs[0], Message({"k": "cancel", "a": a._actor_id, "ci": call_id, "s": client.address})
        )
    # the cancels reach the proc's receive thread, the calls below the actor's own inbox: look a while
    seen = []
    for _ in range(8):
        seen.append(a.cancelled_entries.call_one().get(timeout=5))
        time.sleep(0.05)
    assert max(seen) == 0, seen
