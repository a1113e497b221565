"""Fuzz every listening socket with 10,000 hostile frames each: nothing is unpickled or executed,
nothing crashes, and the drop counters account for every message."""

from __future__ import annotations

import os
import random

import msgpack
import pytest
import zmq
from _procs import wait_for
from actors import Counter

from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._wire.transport import Message, Transport

pytestmark = pytest.mark.integration

N = 10_000
MARKER = "/tmp/jm-fuzz-executed"
EVIL = b"cos\nsystem\n(S'touch " + MARKER.encode() + b"'\ntR."


def hostile_messages(n: int, seed: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    wrong = Transport(os.urandom(32))
    try:
        base = wrong.encode(
            Message(
                {"k": "c", "a": "x", "m": "m", "ep": "e", "rk": 0, "q": 0, "s": "tcp://127.0.0.1:9", "rm": 1, "i": 1},
                EVIL,
                [b"b" * 64],
            ),
            "tcp://127.0.0.1:9",
        )
    finally:
        wrong.close()
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:  # pure noise, 1-6 frames
            msg = [rng.randbytes(rng.randrange(0, 120)) for _ in range(rng.randrange(1, 7))]
        elif kind == 1:  # signed with the wrong key
            msg = list(base)
        elif kind == 2:  # truncated valid-looking message
            msg = list(base)[: rng.randrange(1, 4)]
        elif kind == 3:  # unsigned, plausible header
            msg = [b"", msgpack.packb({"k": "c", "v": 1, "nb": []}), EVIL]
        else:  # bit flips
            msg = [bytearray(f) for f in base]
            f = rng.randrange(len(msg))
            if msg[f]:
                msg[f][rng.randrange(len(msg[f]))] ^= 1 << rng.randrange(8)
            msg = [bytes(x) for x in msg]
        out.append(msg)
    return out


def test_fuzz_controller_agent_and_proc(procs):
    if os.path.exists(MARKER):
        os.unlink(MARKER)
    ctl = Controller.get()
    counters = procs.spawn("c", Counter, 0)
    counters.initialized.get(timeout=10)
    ref = procs._ref
    targets = [ctl.address, ref.agent_addrs[0], ref.proc_addrs[1]]
    stats_before = {
        "agent": ctl.client.request(ref.agent_addrs[0], {"k": "stats"}).get(5),
        "proc": ctl.client.request(ref.proc_addrs[1], {"k": "stats"}).get(5),
    }
    ctl_before = ctl.transport.stats.dropped
    msgs = hostile_messages(N, seed=1234)
    ctx = zmq.Context()
    try:
        for addr in targets:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 5000)
            s.setsockopt(zmq.SNDHWM, 0)
            s.connect(addr)
            for m in msgs:
                s.send_multipart(m)
            s.close()
    finally:
        ctx.term()

    def dropped(addr):
        st = ctl.client.request(addr, {"k": "stats"}).get(5)
        return st["dropped_bad_signature"] + st["dropped_malformed"]

    base_agent = stats_before["agent"]["dropped_bad_signature"] + stats_before["agent"]["dropped_malformed"]
    base_proc = stats_before["proc"]["dropped_bad_signature"] + stats_before["proc"]["dropped_malformed"]
    assert wait_for(lambda: ctl.transport.stats.dropped - ctl_before == N, 20), ctl.transport.stats
    assert wait_for(lambda: dropped(ref.agent_addrs[0]) - base_agent == N, 20)
    assert wait_for(lambda: dropped(ref.proc_addrs[1]) - base_proc == N, 20)
    assert not os.path.exists(MARKER), "a hostile message was executed"
    # every process still serves, in order
    assert list(counters.incr.call().get(timeout=10).values()) == [1, 1, 1, 1]
    assert counters.slice(gpus=1).incr.call_one().get(timeout=10) == 2
