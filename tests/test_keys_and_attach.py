"""Key files for agents on other hosts, addresses off the wire, and attach's input checks (no root needed;
the multi-host runs themselves are in tests/cluster)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from jupyter_mesh import MeshValueError, attach_to_workers
from jupyter_mesh._wire.addresses import local_ip_towards, parse_tcp
from jupyter_mesh._wire.keyfile import new_mesh_key, read_key_file


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(d))
    return d


def test_keygen_makes_a_private_key_and_keeps_an_existing_one(cfg):
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_mesh.cli", "keygen"], capture_output=True, text=True, timeout=60, check=True
    )
    path = out.stdout.strip()
    assert path == str(cfg / "mesh.key")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cfg).st_mode) == 0o700
    first = read_key_file(path)
    assert new_mesh_key(path) == path and read_key_file(path).key == first.key  # kept
    assert read_key_file(new_mesh_key(path, overwrite=True)).key != first.key
    # the key is in the file only: never printed
    assert first.key.hex() not in out.stdout + out.stderr


@pytest.mark.parametrize("how", ["group-readable", "symlink", "open-directory", "garbage", "missing"])
def test_a_key_file_others_could_read_or_swap_is_refused_with_what_to_do(cfg, tmp_path, how):
    path = new_mesh_key()
    if how == "group-readable":
        os.chmod(path, 0o640)
        err, words = PermissionError, "chmod 600"
    elif how == "symlink":
        link = cfg / "link.key"
        os.symlink(path, link)
        path, err, words = str(link), PermissionError, "symbolic link"
    elif how == "open-directory":
        os.chmod(cfg, 0o777)
        err, words = PermissionError, "chmod 700"
    elif how == "garbage":
        with open(path, "w") as f:
            f.write("{not json")
        err, words = ValueError, "jupyter-mesh keygen"
    else:
        path, err, words = str(cfg / "nope.key"), FileNotFoundError, "jupyter-mesh keygen"
    with pytest.raises(err, match=words):
        read_key_file(path)


@pytest.mark.parametrize(
    "addr", ["10.0.0.1:6000", "tcp://10.0.0.1", "tcp://10.0.0.1:0", "tcp://10.0.0.1:99999", "udp://1.2.3.4:5", 7]
)
def test_addresses_off_the_command_line_or_the_wire_are_checked(addr):
    with pytest.raises(ValueError, match=r"tcp://10\.0\.0\.2:6000"):
        parse_tcp(addr)


def test_the_local_ip_towards_a_peer_is_the_one_its_route_leaves_by():
    assert parse_tcp("tcp://127.0.0.1:6000") == ("127.0.0.1", 6000)
    assert local_ip_towards("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(
    "workers, kw, words",
    [
        (None, {}, "workers="),
        ("tcp://10.0.0.2:6000", {}, "a list of agent addresses"),
        ([], {}, "a list of agent addresses"),
        (["10.0.0.2:6000"], {}, "tcp://10.0.0.2:6000"),
        (["tcp://10.0.0.2:6000", "tcp://10.0.0.2:6000"], {}, "listed twice"),
        (["tcp://10.0.0.2:6000"], {"ca": "/etc/ca.pem"}, "mesh key"),
    ],
)
def test_attach_refuses_bad_input_before_touching_the_session(cfg, workers, kw, words):
    new_mesh_key()
    with pytest.raises(MeshValueError, match=words):
        attach_to_workers(workers, **kw)


def test_attach_without_a_mesh_key_says_how_to_make_one(cfg):
    with pytest.raises(FileNotFoundError, match="jupyter-mesh keygen"):
        attach_to_workers(["tcp://10.0.0.2:6000"])


def test_a_session_running_local_meshes_is_not_moved_to_the_network(cfg, host):
    """This session listens on private unix sockets and runs meshes: attaching hosts must say so, not
    silently stop them (nor open a TCP port under them)."""
    from jupyter_mesh._runtime.controller import Controller

    new_mesh_key()
    procs = host.spawn_procs(per_host={"gpus": 1})
    try:
        before = Controller.get()
        with pytest.raises(MeshValueError, match=r"private unix sockets.*JUPYTER_MESH_BIND"):
            attach_to_workers(["tcp://10.0.0.2:6000"])
        assert Controller.get() is before and before.transport.bind.startswith("ipc://")
    finally:
        procs.stop()


def test_the_agent_command_never_takes_a_key_on_its_command_line():
    p = subprocess.run(
        [sys.executable, "-m", "jupyter_mesh.cli", "agent", "--controller", "tcp://10.0.0.1:5555"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "--key-file" in p.stderr
