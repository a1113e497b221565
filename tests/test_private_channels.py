"""Only this user can reach a session's sockets: unix sockets in a private directory by default, a
network bind only when asked for (and then every frame bounded before it is buffered)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
import time

import pytest
from _procs import descendants
from actors import Counter

from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._wire.transport import Message, Transport

pytestmark = pytest.mark.integration


def _tcp_listeners(pid: int) -> list[str]:
    """``ip:port`` of the TCP sockets process ``pid`` listens on."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
            if m:
                inodes.add(m.group(1))
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                found.append(cols[1])
    return found


def test_every_socket_is_a_unix_socket_in_a_private_directory(procs):
    ctl = Controller.get()
    c = procs.spawn("c", Counter, 0)
    assert c.value.call().get(timeout=10)  # every actor inbox and reply box is up
    directory = ctl.transport.bind[len("ipc://") :]
    st = os.stat(directory)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    for addr in [
        ctl.address,
        *procs._ref.agent_addrs,
        *procs._ref.proc_addrs,
        *[a for d in ctl.client.inboxes._by_proc.values() for a in d.values()],
    ]:
        assert addr.startswith(f"ipc://{directory}/"), addr
    mesh = descendants(os.getpid())
    listening = {p: _tcp_listeners(p) for p in mesh}
    assert mesh and not {p: ls for p, ls in listening.items() if ls}  # no agent, template or proc


_AS_NOBODY = r"""
import json, socket, sys
out = {}
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        out[path] = "connected"
    except OSError as e:
        out[path] = type(e).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another user (setpriv)")
def test_another_user_cannot_connect_to_any_socket(procs):
    ctl = Controller.get()
    procs.spawn("c", Counter, 0).value.call().get(timeout=10)
    directory = ctl.transport.bind[len("ipc://") :]
    paths = [os.path.join(directory, n) for n in os.listdir(directory)]
    assert len(paths) >= 6  # controller, its reply boxes, agent, 4 procs and their actors' inboxes
    probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", _AS_NOBODY]
    out = subprocess.run([*probe, *paths], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert set(results) == set(paths) and set(results.values()) == {"PermissionError"}, results
    # and the same probe as this user does connect: the refusal is the directory's mode, nothing else
    own = ctl.address[len("ipc://") :]
    mine = subprocess.run([sys.executable, "-c", _AS_NOBODY, own], capture_output=True, text=True, timeout=60)
    assert json.loads(mine.stdout) == {own: "connected"}


_NETWORK_BIND = r"""
from jupyter_mesh import this_host
from jupyter_mesh._runtime.controller import Controller
pm = this_host().spawn_procs(per_host={"gpus": 1})
print("ADDR", pm._ref.proc_addrs[0], "CURVE", Controller.get().transport.curve is not None)
pm.stop()
"""


def test_a_network_bind_speaks_curve_unless_the_user_opts_out():
    env = {**os.environ, "JUPYTER_MESH_BIND": "tcp://0.0.0.0"}
    env.pop("JUPYTER_MESH_INSECURE", None)
    out = subprocess.run([sys.executable, "-c", _NETWORK_BIND], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ADDR tcp://0.0.0.0:" in out.stdout and "CURVE True" in out.stdout and "WARNING" not in out.stderr
    env["JUPYTER_MESH_INSECURE"] = "1"
    out = subprocess.run([sys.executable, "-c", _NETWORK_BIND], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CURVE False" in out.stdout
    assert "WARNING: listening on tcp://0.0.0.0 without encryption" in out.stderr


def test_without_curve_a_network_bind_is_refused(monkeypatch):
    from jupyter_mesh._wire import channels

    monkeypatch.delenv("JUPYTER_MESH_INSECURE", raising=False)
    monkeypatch.setattr(channels.zmq, "has", lambda what: False)  # a pyzmq built without libsodium
    with pytest.raises(PermissionError, match=r"refusing to listen on tcp://0\.0\.0\.0"):
        channels.check_bind("tcp://0.0.0.0")
    channels.check_bind("tcp://127.0.0.1")  # loopback stays allowed (the HMAC is the guard there)
    monkeypatch.setenv("JUPYTER_MESH_INSECURE", "1")
    channels.check_bind("tcp://0.0.0.0")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


_FLOOD = r"""
import sys, time, zmq
s = zmq.Context().socket(zmq.PUSH)
s.connect(sys.argv[1])
s.send_multipart([b"x" * 32, bytearray(200 << 20)])  # 200 MiB: no key needed to send it
time.sleep(3)
"""


def test_a_tcp_socket_drops_an_oversized_frame_before_buffering_it(monkeypatch):
    """Without the key, a peer on a TCP bind can send bytes; past ``JUPYTER_MESH_MAX_FRAME`` ZeroMQ
    drops the connection while reading the frame, so memory stays flat and nothing is delivered."""
    monkeypatch.setenv("JUPYTER_MESH_MAX_FRAME", str(1 << 20))
    key = os.urandom(32)
    t = Transport(key, "tcp://127.0.0.1")
    got: list[object] = []
    threading.Thread(target=t.serve, args=(lambda m, f: got.append(m),), daemon=True).start()
    try:
        before = _rss_kib()
        subprocess.run([sys.executable, "-c", _FLOOD, t.address], timeout=60, check=True)
        grown_mib = (_rss_kib() - before) / 1024
        assert grown_mib < 64, f"the receiver grew by {grown_mib:.0f} MiB"
        assert not got and t.stats.received == 0
        # the socket still serves: a signed message from a peer with the key gets through
        peer = Transport(key, "tcp://127.0.0.1")
        try:
            peer.send(t.address, Message({"k": "ping", "s": peer.address}))
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(got) == 1
        finally:
            peer.close()
    finally:
        t.stop_serving()
        t.close()


# -- shared-memory segments (large frames between processes of one host) ----------------------------


def test_a_segment_name_taken_first_is_never_used(monkeypatch):
    """Someone who created the segment's name first (with their own bytes) does not get them read: the
    writer's O_EXCL create fails, it counts the collision and picks a new name."""
    from jupyter_mesh._wire import shm

    prefix = shm.session_prefix(os.urandom(32))
    tokens = iter(["00" * 8, "11" * 8])
    monkeypatch.setattr(shm.secrets, "token_hex", lambda n: next(tokens))
    monkeypatch.setattr(shm, "_counter", iter([7, 8]))
    squatted = f"{shm.SHM_DIR}/{prefix}{os.getpid():x}-7{'00' * 8}"
    with open(squatted, "wb") as f:
        f.write(b"evil" * 1024)
    before = shm.collisions
    try:
        name, n = shm.write_segment(prefix, bytearray(b"good" * 1024))
        assert name.endswith("8" + "11" * 8) and shm.collisions == before + 1
        assert bytes(shm.open_segment(prefix, name, n)[:4]) == b"good"
    finally:
        os.unlink(squatted)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file owned by another user")
def test_a_segment_of_another_user_is_refused_before_mapping():
    from jupyter_mesh._wire import shm

    prefix = shm.session_prefix(os.urandom(32))
    name = f"{prefix}1-1{'ab' * 8}"
    path = f"{shm.SHM_DIR}/{name}"
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="belongs to uid 65534 with mode 644: refused"):
        shm.open_segment(prefix, name, 4096)
    assert not os.path.exists(path)  # unlinked all the same: the name cannot be used again


def test_a_transport_counts_a_message_whose_segment_is_not_ours(tmp_path):
    """End to end: a signed message naming a segment that is not ours is dropped and counted."""
    from jupyter_mesh._wire import shm

    key = os.urandom(32)
    a, b = Transport(key, "tcp://127.0.0.1"), Transport(key, "tcp://127.0.0.1")
    got: list[object] = []
    threading.Thread(target=b.serve, args=(lambda m, f: got.append(m),), daemon=True).start()
    try:
        prefix = b.shm_prefix
        name = f"{prefix}1-1{'cd' * 8}"
        path = f"{shm.SHM_DIR}/{name}"
        with open(path, "wb") as f:
            f.write(b"x" * 4096)
        os.chmod(path, 0o644)  # group- and world-readable: not a segment any of our processes writes
        a.send(b.address, Message({"k": "ping", "sh": [[0, name, 4096]]}))
        deadline = time.monotonic() + 10
        while b.stats.dropped_malformed == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.stats.dropped_malformed == 1 and not got
    finally:
        b.stop_serving()
        a.close()
        b.close()


def test_ucx_between_processes_of_one_host_needs_an_explicit_opt_in(monkeypatch):
    """One host moves RDMABuffers through shared memory; forcing UCX there would use its TCP emulation
    (no bounds checks, a listener outside our channels), so it is refused unless asked for."""
    torch = pytest.importorskip("torch")
    from jupyter_mesh import MeshValueError, RDMABuffer

    monkeypatch.delenv("JUPYTER_MESH_UCX_SAME_HOST", raising=False)
    buf = RDMABuffer(torch.zeros(16))
    try:
        monkeypatch.setenv("JUPYTER_MESH_RDMA_BACKEND", "ucx")
        with pytest.raises(MeshValueError, match="UCX would run over its TCP emulation"):
            buf.read_into(torch.empty(16)).get(10)
    finally:
        monkeypatch.delenv("JUPYTER_MESH_RDMA_BACKEND")
        buf.drop().get(10)


@pytest.mark.parametrize("whose", ["another user's", "writable by others"])
def test_a_runtime_dir_others_can_write_to_is_not_used(monkeypatch, whose):
    """Whoever can write to the base dir (no sticky bit) could rename our private directory away and
    put theirs in its place, where our later sockets would be bound: such an XDG_RUNTIME_DIR (one left
    over from another user by ``su``: root can write anywhere) is passed over for /tmp."""
    import shutil
    import tempfile

    from jupyter_mesh._wire.channels import default_bind, remove_session_dir

    if whose == "another user's" and os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    run = tempfile.mkdtemp(prefix="jm-run-", dir="/tmp")  # short: unix socket paths are limited
    monkeypatch.setenv("XDG_RUNTIME_DIR", run)
    monkeypatch.delenv("JUPYTER_MESH_BIND", raising=False)
    try:
        if whose == "another user's":
            os.chown(run, 65534, 65534)
        else:
            os.chmod(run, 0o777)
        bind = default_bind()
        remove_session_dir(bind)
        base = os.stat(os.path.dirname(bind[len("ipc://") :]))
        assert os.path.dirname(bind[len("ipc://") :]) != run and not os.listdir(run)
        assert (base.st_uid == os.geteuid() and not base.st_mode & 0o022) or base.st_mode & stat.S_ISVTX
        if whose != "another user's":  # made private, our own runtime dir is used
            os.chmod(run, 0o700)
            bind = default_bind()
            remove_session_dir(bind)
            assert os.path.dirname(bind[len("ipc://") :]) == run
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_the_sweep_removes_only_directories_nobody_holds(tmp_path, monkeypatch):
    """A session directory is in use while its controller holds its lock, whatever its pid says (a
    controller in another pid namespace has a pid that means nothing here)."""
    from jupyter_mesh._wire import channels

    monkeypatch.setattr(channels, "_base", lambda: str(tmp_path))
    held = tmp_path / "jupyter-mesh-999999-held"
    free = tmp_path / "jupyter-mesh-999999-free"
    for d in (held, free):
        d.mkdir(mode=0o700)
        (d / ".lock").touch(mode=0o600)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(held / ".lock")], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert channels.sweep_stale_dirs() == 1
        assert held.exists() and not free.exists()
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()  # type: ignore[union-attr]
    assert channels.sweep_stale_dirs() == 1 and not held.exists()  # its holder is gone now


def test_a_connection_that_never_finishes_its_handshake_is_dropped():
    """Anyone who reaches a TCP bind can open connections; one that never speaks is closed after the
    handshake interval, not held for libzmq's default 30 s (the socket's read timeout, below 30 s,
    makes the latter fail the test)."""
    import socket

    from jupyter_mesh._wire.channels import HANDSHAKE_MS

    t = Transport(os.urandom(32), "tcp://127.0.0.1")
    try:
        host, port = t.address[len("tcp://") :].rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        assert HANDSHAKE_MS / 1000 + 10 < 30
        s.settimeout(HANDSHAKE_MS / 1000 + 10)  # a recv still waiting then raises TimeoutError
        try:
            while s.recv(4096):  # the server's greeting, then nothing until it closes
                pass
        except ConnectionResetError:
            pass
        s.close()
    finally:
        t.close()
