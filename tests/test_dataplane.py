"""The data plane: RDMABuffer over shm, UCX and ZeroMQ; same-host message buffers through shared memory.

Real procs and real transfers. UCX runs for real over its tcp transport when ucxx is installed
(``make setup`` installs the ``ucx`` extra); failure tests SIGKILL the owner with a transfer in flight.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from _procs import wait_stopped  # noqa: E402
from rdma_actors import Owner, Puller  # noqa: E402

from jupyter_mesh import (  # noqa: E402
    ActorError,
    MeshClosedError,
    MeshTimeoutError,
    MeshValueError,
    RDMABuffer,
    SupervisionError,
    get_rdma_backend,
)
from jupyter_mesh._data import ucx as _ucx  # noqa: E402
from jupyter_mesh._wire import shm as _shm  # noqa: E402
from jupyter_mesh._wire.transport import Message, Transport  # noqa: E402

HAS_UCX = _ucx.available()
BACKENDS = ["shm", "vm", "zmq", pytest.param("ucx", marks=pytest.mark.skipif(not HAS_UCX, reason="ucxx not installed"))]
# UCX on one host runs over its TCP emulation: refused unless asked for (tests have one host only)
UCX_ENV = {
    "UCX_TLS": "tcp,self",
    "UCXPY_PROGRESS_MODE": "blocking",
    "UCX_WARN_UNUSED_ENV_VARS": "n",
    "JUPYTER_MESH_UCX_SAME_HOST": "1",
}
N = 1 << 18  # floats: 1 MiB
PRELOAD = ["torch"]  # imported once in the host's template: procs fork with it (seconds saved per test)


def _prefix() -> str:
    from jupyter_mesh._runtime.controller import Controller

    return Controller.get().transport.shm_prefix


@pytest.fixture(autouse=True)
def _no_shm_leftovers():
    yield
    from jupyter_mesh._runtime.controller import Controller

    if Controller._instance is not None:
        deadline = time.monotonic() + 5
        while _shm.leftovers(_prefix()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _shm.leftovers(_prefix()), "shared-memory segments left in /dev/shm"


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("JUPYTER_MESH_RDMA_BACKEND", request.param)
    for k, v in UCX_ENV.items():
        monkeypatch.setenv(k, v)
    return request.param


@pytest.fixture
def pair(host, backend):
    """Two procs (owner at gpus=0, puller at gpus=1) running with the backend forced."""
    pm = host.spawn_procs(per_host={"gpus": 2}, env={"JUPYTER_MESH_RDMA_BACKEND": backend, **UCX_ENV}, preload=PRELOAD)
    yield pm
    pm.stop(timeout=5)


# -- unit: no processes -----------------------------------------------------------------------------------
def test_import_does_not_pull_heavy_modules():
    code = "import sys, jupyter_mesh; print(sorted(m for m in ('torch','ucxx','IPython','numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_segments_roundtrip_and_names_are_checked(monkeypatch):
    from jupyter_mesh._wire import shm_pool

    monkeypatch.setattr(shm_pool, "_sender", shm_pool.SenderPool(budget=0))  # one-shot named segments
    prefix = _shm.session_prefix(b"k" * 32)
    big, small = bytes(range(256)) * (_shm.SEGMENT_MIN // 256 + 1), b"x" * 100
    entries, rest = _shm.stash(prefix, [small, big, small])
    assert [e[0] for e in entries] == [1] and len(rest) == 2 and _shm.leftovers(prefix)
    back = _shm.unstash(prefix, entries, rest)
    assert bytes(back[1]) == big and back[0] == small and not _shm.leftovers(prefix)
    for bad in ("../../etc/passwd", prefix + "../x", "jm0000000000-1-1", prefix.rstrip("-")):
        with pytest.raises(ValueError):
            _shm.open_segment(prefix, bad, 1)
    _shm.write_segment(prefix, b"orphan")  # its receiver died: the sweep at shutdown takes it
    assert _shm.sweep(prefix) == 1 and not _shm.leftovers(prefix)


def test_transport_sends_large_local_buffers_through_shm_and_checks_signature_first():
    key = os.urandom(32)
    a, b, stranger = Transport(key), Transport(key), Transport(os.urandom(32))
    try:
        payload = memoryview(bytearray(os.urandom(_shm.SEGMENT_MIN + 5)))
        frames = a.encode(Message({"k": "x"}, b"p", [payload, b"small" * 10]), b.address, local=True)
        assert len(frames) == 4  # the big buffer left the message: only its name travels, signed
        msg = b.decode(frames)
        assert msg is not None and bytes(msg.buffers[0]) == bytes(payload) and bytes(msg.buffers[1]) == b"small" * 10
        assert not _shm.leftovers(a.shm_prefix)
        # a forged header naming a segment is dropped before anything is opened or unlinked
        name, n = _shm.write_segment(a.shm_prefix, b"z" * 10)
        forged = stranger.encode(Message({"k": "x", "sh": [[0, name, n]]}, b"p", []), b.address)
        assert b.decode(forged) is None and b.stats.dropped_bad_signature == 1
        assert _shm.leftovers(a.shm_prefix) == [name]
        _shm.sweep(a.shm_prefix)
    finally:
        for t in (a, b, stranger):
            t.close()


_LISTENERS = r"""
import json, os, socket
from jupyter_mesh._data import ucx as _ucx
_ucx.node()
mine = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        mine.add(link[8:-1])
found = []
for table, fam in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in mine:  # LISTEN, ours
            raw = bytes.fromhex(f[1].split(":")[0])
            words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]
            found.append(socket.inet_ntop(fam, b"".join(words)))
print(json.dumps(sorted(found)))
"""


@pytest.mark.skipif(not HAS_UCX, reason="ucxx not installed")
def test_ucx_listens_on_loopback_only():
    """UCX's tcp transport does not check remote keys: by default it must not be reachable from outside."""
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_NET_DEVICES", "JUPYTER_MESH_BIND")}
    env.update(UCX_ENV)
    out = subprocess.run([sys.executable, "-c", _LISTENERS], capture_output=True, text=True, timeout=60, env=env)
    addrs = json.loads(out.stdout.strip().splitlines()[-1])
    assert addrs and all(a in ("127.0.0.1", "::1") for a in addrs), (addrs, out.stderr[-2000:])


def test_bad_input_is_refused_before_any_transfer(host):
    src = torch.arange(16, dtype=torch.float32)
    buf = RDMABuffer(src)
    try:
        with pytest.raises(MeshValueError, match="at least the buffer's size"):
            buf.read_into(torch.empty(8))
        assert RDMABuffer.read_into.__kwdefaults__["timeout"] == 60  # Monarch's default
        with pytest.raises(MeshValueError, match="dtype mismatch"):
            buf.read_into(torch.empty(16, dtype=torch.int32))
        with pytest.raises(MeshValueError, match="non-contiguous"):
            buf.read_into(torch.empty(16, 2)[:, 0])
        with pytest.raises(MeshValueError, match="non-contiguous"):
            RDMABuffer(torch.empty(4, 4).t())
        with pytest.raises(MeshValueError, match=r"torch\.Tensor or a buffer"):
            RDMABuffer(42)
        with pytest.raises(MeshValueError, match="at least one byte"):
            RDMABuffer(torch.empty(0))
        with pytest.raises(MeshValueError, match="read-only"):
            buf.read_into(memoryview(bytes(64)))
        with pytest.raises(MeshValueError, match="size mismatch"):
            buf.read_into(torch.empty(8), offset=40)
        raw = torch.empty(64, dtype=torch.uint8)  # raw bytes may stand for any dtype
        buf.read_into(raw).get(timeout=5)
        assert torch.equal(raw.view(torch.float32), src)
        part = torch.empty(4)
        buf.read_into(part, offset=8 * 4).get(timeout=5)
        assert part.tolist() == [8.0, 9.0, 10.0, 11.0]
        ro = RDMABuffer(memoryview(bytes(16)))
        with pytest.raises(MeshValueError, match="read-only memory"):
            ro.write_from(bytearray(16))
        ro.drop()
        # a CUDA-side handle cannot be served by a CPU-only backend: said before any byte moves
        fake = pickle.loads(pickle.dumps(buf))
        fake._device = "cuda:0"
        os.environ["JUPYTER_MESH_RDMA_BACKEND"] = "shm"
        try:
            with pytest.raises(MeshValueError, match="device mismatch"):
                fake.read_into(torch.empty(16))
        finally:
            del os.environ["JUPYTER_MESH_RDMA_BACKEND"]
    finally:
        buf.drop()
    with pytest.raises(MeshClosedError, match="dropped"):
        buf.read_into(torch.empty(16))


# -- integration: real procs, every backend ---------------------------------------------------------------
@pytest.mark.integration
def test_read_write_between_procs_and_controller(pair, backend):
    owner = pair.slice(gpus=0).spawn("owner", Owner, N)
    puller = pair.slice(gpus=1).spawn("puller", Puller)
    buf = owner.handle.call_one().get(timeout=30)
    assert buf.size() == N * 4 and get_rdma_backend(buf) == backend
    expect = float(torch.arange(N, dtype=torch.float64).sum())
    # controller <- proc
    dst = torch.empty(N)
    buf.read_into(dst).get(timeout=20)
    assert torch.equal(dst, torch.arange(N, dtype=torch.float32))
    # proc <- proc (the handle travelled through an endpoint argument)
    assert puller.pull.call_one(buf, N).get(timeout=30) == (backend, expect)
    # controller -> proc: visible in the owner's tensor when the future is done
    buf.write_from(torch.full((N,), 2.0)).get(timeout=20)
    assert owner.checksum.call_one().get(timeout=10) == 2.0 * N
    # as in Monarch: a larger destination gets the buffer in its first bytes, the rest left as it was;
    # a smaller source is written from the buffer's first byte, the rest of the buffer kept
    larger = torch.full((N + 4,), -1.0)
    buf.read_into(larger).get(timeout=20)
    assert torch.equal(larger[:N], torch.full((N,), 2.0)) and larger[N:].tolist() == [-1.0] * 4
    buf.write_from(torch.full((N // 2,), 7.0)).get(timeout=20)
    assert owner.checksum.call_one().get(timeout=10) == 7.0 * (N // 2) + 2.0 * (N - N // 2)
    # proc -> proc, from an async endpoint
    puller.push.call_one(buf, N, 3.0).get(timeout=30)
    assert owner.checksum.call_one().get(timeout=10) == 3.0 * N
    # a buffer owned by the controller, read by a proc
    mine = RDMABuffer(torch.full((N,), 5.0))
    assert puller.pull.call_one(mine, N).get(timeout=30) == (backend, 5.0 * N)
    mine.drop()
    # memoryview-backed buffers (no shared storage: shm is refused, the others serve it)
    raw = owner.raw_handle.call_one(b"abcdefgh" * 1000).get(timeout=10)
    if backend == "shm":
        with pytest.raises(MeshValueError, match="shm cannot serve"):
            raw.read_into(bytearray(8000))
    else:
        out = bytearray(8000)
        raw.read_into(out).get(timeout=20)
        assert bytes(out) == b"abcdefgh" * 1000
        raw.write_from(b"12345678" * 1000).get(timeout=20)
        assert owner.raw_value.call_one().get(timeout=10) == b"12345678" * 1000


@pytest.mark.integration
def test_dropped_and_stopped(host, backend):
    pm = host.spawn_procs(per_host={"gpus": 1}, env={"JUPYTER_MESH_RDMA_BACKEND": backend, **UCX_ENV}, preload=PRELOAD)
    owner = pm.spawn("owner", Owner, 1024)
    buf = owner.handle.call_one().get(timeout=30)
    copy = pickle.loads(pickle.dumps(buf))
    buf.drop().get(timeout=10)  # a non-owner drops: the owner forgets it
    for b in (buf, copy):  # every handle in this process knows
        with pytest.raises(MeshClosedError, match="dropped"):
            b.read_into(torch.empty(1024))
    # the owner drops its buffer while we hold a handle we never dropped: every backend notices before
    # moving a byte (zmq: the owner refuses; shm and ucx: the owner's liveness word, read one-sided)
    owner2 = pm.spawn("owner2", Owner, 1024)
    fresh = owner2.handle.call_one().get(timeout=30)
    dst = torch.empty(1024)
    fresh.read_into(dst).get(timeout=20)
    assert dst[5] == 5.0
    owner2.drop.call_one().get(timeout=10)
    with pytest.raises(MeshClosedError, match="dropped"):
        fresh.read_into(dst).get(timeout=10)
    with pytest.raises(MeshClosedError, match="dropped"):
        fresh.write_from(dst).get(timeout=10)
    fresh = pm.spawn("owner3", Owner, 1024).handle.call_one().get(timeout=30)
    pm.stop()
    with pytest.raises(SupervisionError, match="stopped"):  # its owner's mesh is stopped, as a call to it
        fresh.read_into(torch.empty(1024))


@pytest.mark.integration
@pytest.mark.parametrize("how", ["mid-transfer", "before"])
def test_owner_killed(pair, backend, how):
    """SIGKILL the owner: the transfer fails fast with a clear error (not at its timeout), no hang."""
    owner = pair.slice(gpus=0).spawn("owner", Owner, N)
    puller = pair.slice(gpus=1).spawn("puller", Puller)
    buf = owner.handle.call_one().get(timeout=30)
    pid = pair.pids()[0]
    if how == "before":
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        with pytest.raises(SupervisionError, match="failed"):
            buf.read_into(torch.empty(N)).get(timeout=10)
        return
    if backend in ("shm", "vm"):
        pytest.skip("a same-host copy is one synchronous copy: there is no 'in flight' to interrupt (see below)")
    # the owner freezes with a request in flight (a proc reader, which hears of deaths only through the
    # owner's pidfd), then dies: the reader's transfer must fail at once, not at its 30 s timeout.
    # One read first, so the reader is connected: a connection attempt to a frozen owner can give up on
    # its own (an "Endpoint timeout" while the owner still lives), which is not what this test is about
    puller.pull.call_one(buf, N).get(timeout=30)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_stopped(pid)  # else a thread still running may serve the request below
        fut = puller.pull_expecting_failure.call_one(buf, N, 30.0)
        time.sleep(0.5)
        assert not fut.done()
        os.kill(pid, signal.SIGKILL)
        text = fut.get(timeout=20)  # below the transfer's 30 s timeout: only the death can end it in time
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert text.startswith("SupervisionError") and "owns this RDMABuffer" in text and "exited" in text


@pytest.mark.integration
def test_transfer_times_out_when_owner_hangs(pair, backend):
    if backend in ("shm", "vm"):
        pytest.skip("same-host copies do not wait on the owner")
    owner = pair.slice(gpus=0).spawn("owner", Owner, 1024)
    buf = owner.handle.call_one().get(timeout=30)
    buf.read_into(torch.empty(1024)).get(timeout=20)  # connected and warm
    pid = pair.pids()[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_stopped(pid)
        # the transfer's own timeout ends it (the message names it), not the get's 10 s hang guard
        with pytest.raises(MeshTimeoutError, match=r"transfer timed out after 0\.5 s"):
            buf.read_into(torch.empty(1024), timeout=0.5).get(timeout=10)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.integration
def test_large_endpoint_tensors_travel_through_shared_memory(procs):
    """W4's path: call_one arguments and results >= 1 MiB go through a segment; none is left behind."""
    from actors import Faulty

    f = procs.spawn("f", Faulty).slice(gpus=0)
    t = torch.rand(1 << 20)  # 4 MiB
    back = f.echo.call_one(t).get(timeout=30)
    assert torch.equal(back, t)
    back += 1  # the result is ordinary writable memory
    nested = {"a": torch.ones(1 << 19), "b": [torch.zeros(3), bytes(2 << 20)]}
    got = f.echo.call_one(nested).get(timeout=30)
    assert torch.equal(got["a"], nested["a"]) and got["b"][1] == nested["b"][1]
    assert not _shm.leftovers(_prefix())


@pytest.mark.integration
def test_reader_in_a_proc_sees_owner_death_as_actor_error(pair):
    owner = pair.slice(gpus=0).spawn("owner", Owner, N)
    puller = pair.slice(gpus=1).spawn("puller", Puller)
    buf = owner.handle.call_one().get(timeout=30)
    os.kill(pair.pids()[0], signal.SIGKILL)
    time.sleep(0.3)
    with pytest.raises(ActorError, match="SupervisionError"):
        puller.pull.call_one(buf, N).get(timeout=30)


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_UCX, reason="needs a CUDA GPU and ucxx")
def test_cuda_transfers_over_ucx(host, monkeypatch):
    """GPU hosts only: a proc's CUDA tensor read into this process's GPU and host memory, and written
    from host memory, through UCX's CUDA transports; prints GB/s (run with -s to see them)."""
    from rdma_actors import CudaOwner

    tls = os.environ.get("JUPYTER_MESH_TEST_CUDA_TLS", "tcp,cuda_copy,cuda_ipc,self")
    monkeypatch.setenv("UCX_TLS", tls)
    n = 64 << 20
    pm = host.spawn_procs(per_host={"gpus": 1}, env={**UCX_ENV, "UCX_TLS": tls}, preload=PRELOAD)
    try:
        owner = pm.spawn("cuda_owner", CudaOwner, n)
        buf = owner.handle.call_one().get(timeout=120)
        assert buf.device.startswith("cuda") and get_rdma_backend(buf) == "ucx"
        want = torch.arange(n // 4, dtype=torch.float32)
        for name, dst in (
            ("device_to_device", torch.empty(n // 4, device="cuda")),
            ("device_to_host", torch.empty(n // 4)),
        ):
            buf.read_into(dst, timeout=60).get(timeout=120)  # warm: endpoints, keys, CUDA contexts
            t0 = time.perf_counter()
            buf.read_into(dst, timeout=60).get(timeout=120)
            dt = time.perf_counter() - t0
            assert torch.equal(dst.cpu(), want)
            print(f"cuda {name} (read_into, 64 MiB): {n / dt / 1e9:.2f} GB/s")
        src = torch.ones(n // 4)
        t0 = time.perf_counter()
        buf.write_from(src, timeout=60).get(timeout=120)
        print(f"cuda host_to_device (write_from, 64 MiB): {n / (time.perf_counter() - t0) / 1e9:.2f} GB/s")
        assert owner.checksum.call_one().get(timeout=60) == float(n // 4)
    finally:
        pm.stop()


_AFTER_RESTART = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import jupyter_mesh
from jupyter_mesh import RDMABuffer, this_host
from rdma_actors import Puller
env = {"JUPYTER_MESH_RDMA_BACKEND": "zmq"}
for round in (1, 2):
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=env)
    p = pm.spawn("p", Puller)
    buf = RDMABuffer(torch.full((64,), float(round)))
    print(p.pull.call_one(buf, 64).get(timeout=20), flush=True)
    pm.stop()
    jupyter_mesh.shutdown()  # a kernel's "restart the runtime"; the next round gets a new controller
"""


def test_buffers_made_after_a_new_controller_started_name_its_address():
    """The owner address of the controller's buffers was cached: after shutdown() and a new controller,
    new buffers still named the old one, and every read of them timed out."""
    env = {**os.environ, "JUPYTER_MESH_RDMA_BACKEND": "zmq"}
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _AFTER_RESTART, here], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["('zmq', 64.0)", "('zmq', 128.0)"], out.stdout
