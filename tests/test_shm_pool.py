"""Reused shared-memory segments (``_wire/shm_pool``): a segment is written again only after every
object over it was freed, bytes arrive intact across many sizes and concurrent callers, and a spent
budget falls back to one-shot segments."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from jupyter_mesh._wire import shm
from jupyter_mesh._wire.shm_pool import ReceiverMaps, SenderPool

MiB = 1 << 20


def _payload(n: int, seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(256)) * (n // 256)


def test_a_segment_is_reused_only_after_its_receiver_let_go():
    pool, maps = SenderPool(budget=64 * MiB), ReceiverMaps()
    try:
        a = pool.put(_payload(2 * MiB, 1))
        assert a is not None
        held = memoryview(maps.view(*a))  # what a received tensor keeps alive
        b = pool.put(_payload(2 * MiB, 2))
        assert b is not None and b[2] != a[2], "a held segment was written again"
        assert bytes(held[:256]) == _payload(256, 1)
        got_b = maps.view(*b)
        assert bytes(got_b[:256]) == _payload(256, 2)
        del got_b  # released: b's segment is free again
        c = pool.put(_payload(2 * MiB, 3))
        assert c is not None and c[2] == b[2] and pool.reused == 1
        assert bytes(held[:256]) == _payload(256, 1) and bytes(held[-256:]) == _payload(256, 1)
        del held
        gc.collect()
        d = pool.put(_payload(MiB + 4096, 4))  # smaller, within 2x: a's segment serves it
        assert d is not None and d[2] == a[2]
        assert bytes(maps.view(*d)[: MiB + 4096]) == _payload(MiB + 4096, 4)
    finally:
        pool.close()


def test_a_stale_or_replayed_entry_is_refused():
    pool, maps = SenderPool(budget=16 * MiB), ReceiverMaps()
    try:
        e = pool.put(_payload(MiB, 1))
        assert e is not None
        maps.view(*e)  # taken and released at once
        with pytest.raises(ValueError, match="stale or replayed"):
            maps.view(*e)
        with pytest.raises(ValueError):
            maps.view(e[0], e[1], e[2] + 1, *e[3:])  # another inode than the fd has
    finally:
        pool.close()


def test_a_spent_budget_falls_back_to_one_shot_segments(monkeypatch):
    monkeypatch.setenv("JUPYTER_MESH_SHM_POOL", "3")  # MiB: one 2 MiB segment fits, a second does not
    import jupyter_mesh._wire.shm_pool as sp

    monkeypatch.setattr(sp, "_sender", None)
    prefix = shm.session_prefix(b"k" * 32)
    entries, rest = shm.stash(prefix, [_payload(2 * MiB, 1)])
    assert len(entries[0]) == 7 and not rest  # pooled: [i, pid, fd, inode, cap, n, gen]
    first = shm.unstash(prefix, entries, [])[0]
    entries2, _ = shm.stash(prefix, [_payload(2 * MiB, 2)])  # the first is still held
    assert len(entries2[0]) == 3  # one-shot: [i, name, n]
    second = shm.unstash(prefix, entries2, [])[0]
    assert bytes(first[:256]) == _payload(256, 1) and bytes(second[:256]) == _payload(256, 2)
    assert not shm.leftovers(prefix)
    del first, second
    sp._sender.close()  # type: ignore[union-attr]


@pytest.mark.integration
def test_many_echoes_of_many_sizes_arrive_intact_and_held_results_never_change(procs):
    torch = pytest.importorskip("torch")
    from payload_actors import Sink

    sink = procs.spawn("sink", Sink).slice(gpus=0)
    held = []
    for i, mib in enumerate([1, 3, 8, 2, 8, 1, 5, 8, 3, 1, 8, 2] * 2):
        t = torch.arange(mib * MiB // 4, dtype=torch.int32) + i
        back = sink.echo.call_one(t).get(60)
        assert torch.equal(back, t)
        if i % 3 == 0:
            held.append((back, t))  # keep some: their segments must not be written again
        if i % 4 == 0:
            sink.store.call_one(t).get(60)  # the proc keeps this one
            kept = t
    for back, t in held:
        assert torch.equal(back, t), "a result the caller still held was overwritten"
    assert sink.last_digest.call_one().get(60) == sink.digest.call_one(kept).get(60)


@pytest.mark.integration
def test_concurrent_callers_each_get_their_own_bytes(procs):
    torch = pytest.importorskip("torch")
    from payload_actors import Sink

    sinks = procs.spawn("sinks", Sink)
    errors: list[str] = []

    def caller(k: int) -> None:
        one = sinks.slice(gpus=k % 2)
        for i in range(8):
            t = torch.full(((1 + (i + k) % 3) * MiB // 4,), float(k * 100 + i))
            back = one.echo.call_one(t).get(60)
            if not torch.equal(back, t):
                errors.append(f"caller {k} round {i}")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors


@pytest.mark.parametrize("pooled", [True, False])
def test_a_message_that_cannot_be_stashed_whole_frees_what_it_took(monkeypatch, pooled):
    """Two large buffers, the second does not fit (/dev/shm full): the first one's segment was left
    behind (a one-shot file in /dev/shm until the session ended; a pooled one busy for the process's
    life), though the message was never sent (its sender falls back to another way)."""
    import errno

    import jupyter_mesh._wire.shm_pool as sp

    monkeypatch.setenv("JUPYTER_MESH_SHM_POOL", "64" if pooled else "0")
    monkeypatch.setattr(sp, "_sender", None)
    prefix = shm.session_prefix(os.urandom(32))  # (nobody else's files)
    calls = []

    def full(real):
        def second_fails(*a):
            calls.append(1)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*a)

        return second_fails

    if pooled:
        pool = sp.sender_pool()
        assert pool is not None
        monkeypatch.setattr(pool, "put", full(pool.put))
    else:
        monkeypatch.setattr(shm, "write_segment", full(shm.write_segment))
    with pytest.raises(OSError, match="No space"):
        shm.stash(prefix, [_payload(2 * MiB, 1), _payload(2 * MiB, 2)])
    assert not shm.leftovers(prefix)
    if pooled:
        monkeypatch.undo()
        monkeypatch.setattr(sp, "_sender", pool)
        entries, _ = shm.stash(prefix, [_payload(2 * MiB, 3)])
        assert len(entries[0]) == 7 and pool.reused == 1  # the first one's segment, free again
        shm.unstash(prefix, entries, [])
        pool.close()


@pytest.mark.parametrize("pooled", [True, False])
def test_a_message_refused_at_sending_frees_its_segments(monkeypatch, pooled):
    """A message whose large buffer went into shared memory but which was not sent after all (here: its
    pickle is above a TCP peer's frame limit) leaves no segment: a one-shot file stayed in /dev/shm,
    a pooled one stayed busy, for as long as the sender lived."""
    import jupyter_mesh._wire.shm_pool as sp
    from jupyter_mesh._wire.channels import FrameTooLarge
    from jupyter_mesh._wire.transport import Message, Transport

    monkeypatch.setenv("JUPYTER_MESH_SHM_POOL", "64" if pooled else "0")
    monkeypatch.setenv("JUPYTER_MESH_MAX_FRAME", str(1 << 20))
    monkeypatch.setattr(sp, "_sender", None)
    t = Transport(os.urandom(32), "tcp://127.0.0.1")
    try:
        msg = Message({"k": "r"}, bytes(2 * MiB), [memoryview(_payload(2 * MiB, 1))])
        with pytest.raises(FrameTooLarge):
            t.send("tcp://127.0.0.1:9", msg, local=True)
        assert msg.header.get("sh"), "the buffer did not go through shared memory: nothing tested"
        assert not shm.leftovers(t.shm_prefix)
        if pooled:
            entries, _ = shm.stash(t.shm_prefix, [_payload(2 * MiB, 2)])
            assert len(entries[0]) == 7 and sp._sender.reused == 1  # type: ignore[union-attr]
            shm.unstash(t.shm_prefix, entries, [])
            sp._sender.close()  # type: ignore[union-attr]
    finally:
        t.close()
