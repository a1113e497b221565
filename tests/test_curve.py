"""CurveZMQ between two network namespaces (two hosts with their own addresses): a peer without the
session's client key cannot finish the handshake, so not one of its messages is read, even one signed
with the session's HMAC key; a peer with the keys gets through. And a whole mesh runs over TCP+CURVE."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.integration

_SERVER = r"""
import json, sys, threading
from jupyter_mesh._wire.channels import CurveKeys
from jupyter_mesh._wire.transport import Transport
cfg = json.loads(sys.stdin.readline())
t = Transport(bytes.fromhex(cfg["key"]), cfg["bind"], CurveKeys.from_wire(cfg["curve"]))
got = []
threading.Thread(target=t.serve, args=(lambda m, f: got.append(m.header.get("who")),), daemon=True).start()
print(t.address, flush=True)
sys.stdin.readline()  # the clients are done
print(json.dumps({"got": got, "stats": vars(t.stats)}), flush=True)
t.stop_serving(); t.close()
"""

_CLIENT = r"""
import json, sys, time, zmq
from jupyter_mesh._wire.channels import CurveKeys
from jupyter_mesh._wire.transport import Message, Transport
cfg = json.loads(sys.stdin.readline())
keys = CurveKeys.from_wire(cfg["curve"])
key = bytes.fromhex(cfg["key"])
mode = cfg["mode"]
if mode == "session":  # the session's keys: admitted
    t = Transport(key, cfg["bind"], keys)
    t.send(cfg["addr"], Message({"k": "ping", "who": mode}))
    time.sleep(1.0); t.close()
else:  # the HMAC key (a sniffer's best case) but not the session's CURVE client key
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.linger = 0
    if mode == "own-curve-key":
        s.curve_serverkey = keys.server_public  # knows the server's public key, not the client secret
        s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
    # a correctly signed message, made with the session's HMAC key
    import os
    os.environ["JUPYTER_MESH_INSECURE"] = "1"  # a local signer without CURVE of its own
    signer = Transport(key, "tcp://127.0.0.1")
    frames = signer.encode(Message({"k": "ping", "who": mode}), cfg["addr"])  # for the server
    s.connect(cfg["addr"])
    for _ in range(3):
        try:
            s.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        time.sleep(0.3)
    signer.close(); s.close(); ctx.term()
print("sent", flush=True)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    tag = uuid.uuid4().hex[:6]
    a, b = f"jma{tag}", f"jmb{tag}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        _ip("link", "set", f"va{tag}", "netns", a)
        _ip("link", "set", f"vb{tag}", "netns", b)
        for ns, dev, addr in ((a, f"va{tag}", "10.231.7.1/24"), (b, f"vb{tag}", "10.231.7.2/24")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"network namespaces unavailable here: {e.stderr!r}")
    yield a, b
    for ns in (a, b):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_only_a_peer_with_the_session_keys_gets_a_message_through(two_hosts):
    from jupyter_mesh._wire.channels import CurveKeys

    a, b = two_hosts
    keys = CurveKeys.new()
    key = os.urandom(32).hex()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("JUPYTER_MESH_INSECURE", None)
    server = subprocess.Popen(
        ["ip", "netns", "exec", a, sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert server.stdin and server.stdout
        server.stdin.write(json.dumps({"key": key, "bind": "tcp://10.231.7.1", "curve": keys.to_wire()}) + "\n")
        server.stdin.flush()
        addr = server.stdout.readline().strip()
        assert addr.startswith("tcp://10.231.7.1:"), (addr, server.stderr.read() if server.poll() is not None else "")
        for mode in ("plain", "own-curve-key", "session"):
            cfg = {"key": key, "curve": keys.to_wire(), "mode": mode, "addr": addr, "bind": "tcp://10.231.7.2"}
            out = subprocess.run(
                ["ip", "netns", "exec", b, sys.executable, "-c", _CLIENT],
                input=json.dumps(cfg) + "\n", capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip
            assert out.returncode == 0 and "sent" in out.stdout, (mode, out.stderr[-2000:])
        server.stdin.write("done\n")
        server.stdin.flush()
        result = json.loads(server.stdout.readline())
    finally:
        server.kill()
        server.wait(10)
        for stream in (server.stdin, server.stdout, server.stderr):
            if stream is not None:
                stream.close()
    assert result["got"] == ["session"], result  # the keyless peers' signed messages were never read
    assert result["stats"]["received"] == 1 and result["stats"]["dropped_bad_signature"] == 0, result


_MESH = r"""
import torch
from jupyter_mesh import Actor, endpoint, this_host
from jupyter_mesh._runtime.controller import Controller
class A(Actor):
    @endpoint
    def total(self, t): return float(t.sum())
pm = this_host().spawn_procs(per_host={"gpus": 2})
a = pm.spawn("a", A)
big = torch.ones(1 << 18)
print("CALL", sorted(a.total.call(big).get(30).values()), a.slice(gpus=1).total.call_one(big).get(30))
print("CURVE", Controller.get().transport.curve is not None, pm._ref.proc_addrs[0].split(":")[0])
pm.stop()
"""


def test_a_mesh_runs_over_tcp_with_curve():
    env = {**os.environ, "JUPYTER_MESH_BIND": "tcp://127.0.0.1"}
    env.pop("JUPYTER_MESH_INSECURE", None)
    out = subprocess.run([sys.executable, "-c", _MESH], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CALL [262144.0, 262144.0] 262144.0" in out.stdout and "CURVE True tcp" in out.stdout, out.stdout
