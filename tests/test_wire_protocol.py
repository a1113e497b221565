"""The wire schema: one table of kinds per process that counts what it does not know, and a protocol
version that a controller and an agent check in their hello."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from _procs import templates_of

from jupyter_mesh import ProtocolError
from jupyter_mesh._wire import protocol
from jupyter_mesh._wire.protocol import VERSION, Dispatch, Kind
from jupyter_mesh._wire.transport import Message, Transport


def _msg(header):
    return SimpleNamespace(header=header, payload=b"", buffers=[])


def test_a_table_routes_known_kinds_and_counts_unknown_ones(capsys):
    seen = []
    table = Dispatch("test process", {Kind.PING: lambda m, f: seen.append(m.header["k"])})
    table(_msg({"k": Kind.PING}), [])
    for _ in range(3):
        table(_msg({"k": "from-the-future", "s": "tcp://10.0.0.9:5"}), [])
    table(_msg({}), [])  # no kind at all
    assert seen == [Kind.PING]
    assert table.unknown == {"'from-the-future'": 3, "None": 1}
    err = capsys.readouterr().err
    assert err.count("unknown kind 'from-the-future'") == 1  # reported once, then counted
    assert "test process" in err and "tcp://10.0.0.9:5" in err and "another jupyter_mesh version" in err


def test_a_table_refuses_handlers_for_kinds_that_do_not_exist():
    with pytest.raises(ValueError, match="kinds that do not exist"):
        Dispatch("x", {"no-such-kind": lambda m, f: None})


def test_a_fallback_table_gets_only_the_kinds_it_handles(capsys):
    got = []
    controller = Dispatch("controller", {Kind.PROC_EXIT: lambda m, f: got.append("exit")})
    proc = Dispatch("proc", {Kind.PING: lambda m, f: got.append("ping")}, fallback=controller)
    proc(_msg({"k": Kind.PROC_EXIT}), [])
    proc(_msg({"k": Kind.PING}), [])
    proc(_msg({"k": Kind.HEARTBEAT}), [])  # neither handles it: the proc counts it
    assert got == ["exit", "ping"]
    assert proc.unknown == {"'hb'": 1} and not controller.unknown


def test_every_kind_has_a_distinct_wire_name():
    kinds = {k: v for k, v in vars(Kind).items() if k.isupper()}
    assert len(set(kinds.values())) == len(kinds)
    assert protocol.reply_header(7, protocol.OK, 3) == {"k": "r", "i": 7, "ok": 1, "rk": 3}


@pytest.mark.integration
def test_the_controller_counts_a_signed_message_of_an_unknown_kind():
    from jupyter_mesh._runtime.controller import Controller

    ctl = Controller.get()
    t = Transport(ctl.key)
    try:
        t.send(ctl.address, Message({"k": "no-such-kind", "s": t.address}))
        deadline = time.monotonic() + 10
        while not ctl.dispatch.unknown and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ctl.dispatch.unknown["'no-such-kind'"] == 1
    finally:
        t.close()


_OLD_PEER = """
import sys
from jupyter_mesh._wire import transport
from jupyter_mesh._wire.transport import Message, Transport
transport.VERSION = 0  # a jupyter_mesh of another wire protocol, holding the right key
key, addr, kind = bytes.fromhex(sys.argv[1]), sys.argv[2], sys.argv[3]
t = Transport(key)
h = {"k": kind, "h": 3, "pid": 4242, "addr": t.address, "nonce": "nonce-of-an-old-agent", "s": t.address}
t.send(addr, Message(h))
import time; time.sleep(0.5)  # let ZeroMQ deliver before the socket closes
t.close()
"""


def _old_peer_sends(ctl, kind):
    subprocess.run([sys.executable, "-c", _OLD_PEER, ctl.key.hex(), ctl.address, kind], check=True, timeout=60)


@pytest.mark.integration
def test_the_controller_refuses_an_agent_of_another_version():
    """The hello gets through whatever the version (its keys never change), and is refused by name."""
    from jupyter_mesh._runtime.controller import Controller

    ctl = Controller.get()
    waiter = ctl.expect_agent("nonce-of-an-old-agent")
    _old_peer_sends(ctl, Kind.AGENT_UP)
    with pytest.raises(
        ProtocolError, match=rf"host 3 \(pid 4242\) speaks jupyter_mesh wire protocol 0, this process speaks {VERSION}"
    ):
        waiter.get(10)
    assert not [a for a in ctl.links.seen if "4242" in a]  # never supervised as a host


@pytest.mark.integration
def test_any_other_message_of_another_version_is_dropped_and_counted(caplog):
    from jupyter_mesh._runtime.controller import Controller

    ctl = Controller.get()
    before, unknown = ctl.transport.stats.dropped_other_version, dict(ctl.dispatch.unknown)
    _old_peer_sends(ctl, Kind.PROC_EXIT)
    deadline = time.monotonic() + 10
    while ctl.transport.stats.dropped_other_version == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ctl.transport.stats.dropped_other_version == before + 1
    assert ctl.dispatch.unknown == unknown  # never reached the table


def test_an_agent_refuses_a_controller_of_another_version():
    cfg = {"v": VERSION + 1, "key": "00" * 32, "controller": "tcp://127.0.0.1:9"}
    p = subprocess.Popen(
        [sys.executable, "-m", "jupyter_mesh._runtime.agent_main"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err_bytes = p.communicate(json.dumps(cfg).encode() + b"\n", timeout=60)
    assert p.returncode != 0
    # the template it started before reading its configuration went with it
    deadline = time.monotonic() + 10
    while templates_of(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert templates_of(p.pid) == []
    err = err_bytes.decode()
    assert f"speaks jupyter_mesh wire protocol {VERSION + 1}, this process speaks {VERSION}" in err, err
    assert "Traceback" not in err


_AGENT_SITECUSTOMIZE = """
import os
if os.environ.get("TEST_AGENT_VERSION"):  # this interpreter speaks another wire protocol
    import sys
    import jupyter_mesh._wire.protocol as p
    old = p.VERSION
    for m in [m for name, m in sys.modules.items() if name.startswith("jupyter_mesh")]:
        if getattr(m, "VERSION", None) == old:  # every module that took the name already
            m.VERSION = int(os.environ["TEST_AGENT_VERSION"])
if os.environ.get("TEST_AGENT_CRASH"):  # this interpreter dies before it can say hello
    os._exit(3)
"""


def _agents_of_this_interpreter(monkeypatch, tmp_path, **env):
    """Agents that LocalJob starts from now on run tmp_path/sitecustomize.py first (env says what it does)."""

    (tmp_path / "sitecustomize.py").write_text(_AGENT_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.mark.integration
@pytest.mark.parametrize(
    "env, error",
    [
        ({"TEST_AGENT_VERSION": str(VERSION + 1)}, rf"speaks jupyter_mesh wire protocol {VERSION + 1}, this process"),
        ({"TEST_AGENT_CRASH": "1"}, r"exited with code 3 before it reported in"),
    ],
    ids=["other-version", "dies-at-start"],
)
def test_a_job_whose_agent_cannot_start_fails_at_once_with_why(monkeypatch, tmp_path, env, error):
    """An agent that refuses the controller (or dies) before its hello fails the start now, with the
    reason, instead of a 'did not start' timeout after a minute."""
    from jupyter_mesh import LocalJob, MeshError, MeshTimeoutError

    _agents_of_this_interpreter(monkeypatch, tmp_path, **env)
    job = LocalJob(1)
    try:
        # the reason, not the 30 s 'did not start' timeout (a MeshTimeoutError without it)
        with pytest.raises(MeshError, match=error) as ei:
            job.agents(timeout=30)
        assert not isinstance(ei.value, MeshTimeoutError)
    finally:
        job.stop()
