"""Same-host RDMABuffer copies (``shm`` for tensors, ``vm`` for other memory) across payload sizes, with
the owner's death during a read, a refused ``process_vm_readv``, and the lane small messages take.

Real procs, real transfers; every read's bytes are checked against what the owner holds.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from rdma_actors import Owner, Puller, pattern  # noqa: E402

from jupyter_mesh import MeshValueError, RDMABuffer, SupervisionError, get_rdma_backend  # noqa: E402
from jupyter_mesh._data import vm as _vm  # noqa: E402
from jupyter_mesh._wire import lane as _lane  # noqa: E402

pytestmark = pytest.mark.integration
SIZES = [1, 4095, 4096, 4097, _lane.MAX_BYTES, (1 << 20) + 3, 64 << 20]
PRELOAD = ["torch"]


@pytest.fixture(scope="module")
def pair(host):
    pm = host.spawn_procs(per_host={"gpus": 2}, preload=PRELOAD)
    yield pm
    pm.stop(timeout=10)


@pytest.fixture(scope="module")
def actors(pair):
    return pair.slice(gpus=0).spawn("owner", Owner, 16), pair.slice(gpus=1).spawn("puller", Puller)


def _sha(b: bytes | bytearray) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("kind", ["bytearray", "tensor"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_every_size_reads_and_writes_in_one_copy(actors, kind, nbytes):
    owner, puller = actors
    buf = owner.pattern_handle.call_one(nbytes, kind).get(timeout=60)
    assert get_rdma_backend(buf) == ("vm" if kind == "bytearray" else "shm")
    want = pattern(nbytes)
    # controller <- proc
    dst = bytearray(nbytes)
    buf.read_into(dst).get(timeout=30)
    assert _sha(dst) == _sha(want)
    # proc <- proc
    assert puller.pull_raw.call_one(buf).get(timeout=60) == (get_rdma_backend(buf), _sha(want))
    # a part, from an offset; and nothing, at the end
    if nbytes > 2:
        part = bytearray(nbytes // 2)
        buf.read_into(part, offset=1).get(timeout=30)
        assert bytes(part) == want[1 : 1 + nbytes // 2]
    buf.read_into(bytearray(0), offset=nbytes).get(timeout=10)  # 0 bytes: done, nothing moved
    if nbytes > 1:  # (at offset 0, a larger destination is Monarch's read into its first bytes: below)
        with pytest.raises(MeshValueError, match="size mismatch"):
            buf.read_into(bytearray(2), offset=nbytes - 1)  # one byte past the end: refused before any copy
    larger = bytearray(b"\xee" * (nbytes + 3))  # as in Monarch: the buffer fills its first bytes
    buf.read_into(larger).get(timeout=30)
    assert bytes(larger) == want + b"\xee" * 3
    # controller -> proc
    new = bytes(reversed(want))
    buf.write_from(new).get(timeout=30)
    assert owner.raw_digest.call_one().get(timeout=30) == _sha(new)
    smaller = b"\x01" * (nbytes // 2)  # as in Monarch: written from the buffer's first byte, the rest kept
    buf.write_from(smaller).get(timeout=30)
    assert owner.raw_digest.call_one().get(timeout=30) == _sha(smaller + new[nbytes // 2 :])
    with pytest.raises(MeshValueError, match="at most the buffer's size"):
        buf.write_from(bytes(nbytes + 1))
    buf.drop().get(timeout=10)


def test_non_contiguous_memory_is_refused_with_a_clear_error(actors):
    owner, _ = actors
    buf = owner.pattern_handle.call_one(64, "bytearray").get(timeout=30)
    with pytest.raises(MeshValueError, match="not contiguous"):
        buf.read_into(memoryview(bytearray(128))[::2])
    with pytest.raises(MeshValueError, match="non-contiguous"):
        buf.read_into(torch.empty(8, 16, dtype=torch.uint8).t())
    with pytest.raises(MeshValueError, match="not contiguous"):
        RDMABuffer(memoryview(bytearray(128))[::2])
    buf.drop().get(timeout=10)


def test_a_refused_process_vm_readv_falls_back_to_the_owner(actors, monkeypatch):
    """Under Yama (or another user's process) the kernel says EPERM: the owner serves it (zmq)."""
    owner, _ = actors
    buf = owner.pattern_handle.call_one(5000, "bytearray").get(timeout=30)
    assert get_rdma_backend(buf) == "vm"

    def refuse(*_a: object) -> None:
        raise _vm.Denied("Operation not permitted")

    monkeypatch.setattr(_vm, "copy", refuse)
    monkeypatch.setattr(_vm, "_denied", set())
    dst = bytearray(5000)
    buf.read_into(dst).get(timeout=30)
    assert bytes(dst) == pattern(5000)
    assert get_rdma_backend(buf) == "zmq"  # not tried again for that owner
    buf.write_from(bytes(5000)).get(timeout=30)
    assert owner.raw_digest.call_one().get(timeout=10) == _sha(bytes(5000))
    buf.drop().get(timeout=10)


def test_the_handle_cannot_widen_the_range(actors):
    """Size and address come from the owner's table: a handle whose size was tampered with is refused."""
    owner, _ = actors
    buf = owner.pattern_handle.call_one(4096, "bytearray").get(timeout=30)
    buf._nbytes = 1 << 30  # a reader that believes the buffer is larger than it is
    with pytest.raises(Exception, match="does not match the handle"):
        buf.read_into(bytearray(1 << 30)).get(timeout=10)
    buf._nbytes = 4096
    buf.drop().get(timeout=10)


@pytest.mark.parametrize("kind", ["bytearray", "tensor"])
def test_owner_killed_during_reads_fails_them_clearly(host, kind):
    """SIGKILL the owner while 64 MiB reads run back to back: the read in progress or the next one
    fails with the owner's death, none hangs."""
    pm = host.spawn_procs(per_host={"gpus": 1}, preload=PRELOAD)
    try:
        owner = pm.spawn("owner", Owner, 16)
        buf = owner.pattern_handle.call_one(64 << 20, kind).get(timeout=60)
        pid = pm.pids()[0]
        dst = bytearray(64 << 20)
        errors: list[BaseException] = []
        reads = [0]

        def reader() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    buf.read_into(dst).get(timeout=30)
                    reads[0] += 1
                except BaseException as e:  # noqa: BLE001 - the test looks at it
                    errors.append(e)
                    return

        t = threading.Thread(target=reader)
        t.start()
        deadline = time.monotonic() + 30
        while reads[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        t.join(40)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], SupervisionError), errors
        assert "owns this RDMABuffer" in str(errors[0]) and "exited" in str(errors[0])
    finally:
        pm.stop(timeout=5)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_calls_around_the_lane_limit_arrive_whole_and_in_order(procs, extra):
    """Small messages take the lane, larger ones ZeroMQ: an actor still runs one sender's calls in order,
    and every reply comes back whole."""
    from actors import Recorder

    r = procs.slice(gpus=0).spawn("r", Recorder)
    n = _lane.MAX_BYTES - 300 + extra * 300  # the signed call is a few hundred bytes more: either side
    tags = ["x" * (n if i % 3 == 0 else i) for i in range(60)]
    futs = [r.note_sync.call_one(t, i) for i, t in enumerate(tags)]
    assert [f.get(timeout=30) for f in futs] == list(range(60))
    assert r.get_log.call_one().get(timeout=30) == [(t, i) for i, t in enumerate(tags)]
