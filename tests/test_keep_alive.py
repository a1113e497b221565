"""The kept-alive agent's hand-over state machine (``_runtime.keep_alive.Keeper``), with no I/O: who it
reports to, whom it obeys, what a controller that lost the job can still do (nothing), and what one
that was only silent gets back. Signatures and replays are the transport's (tests/test_replay.py);
the whole thing on a real SLURM: tests/cluster/test_reattach*.py."""

from __future__ import annotations

import threading
import time
from typing import Any

from jupyter_mesh._runtime.agent_state import ProcEntry
from jupyter_mesh._runtime.keep_alive import Keeper
from jupyter_mesh._wire.protocol import Kind
from jupyter_mesh._wire.transport import Message, TransportStats

A, B, C = "tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.1:4003"


class FakeTransport:
    address = "tcp://10.0.0.2:5000"

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.stats = TransportStats()

    def send(self, to: str, msg: Message, **_: Any) -> None:
        self.sent.append((to, msg.header))

    def forget(self, to: str, linger_ms: int = 0) -> None:
        pass

    def kinds(self, to: str) -> list[str]:
        return [h["k"] for a, h in self.sent if a == to]


class FakeAgent:
    def __init__(self) -> None:
        self.cfg: dict[str, Any] = {"host_index": 0, "nonce": "t/0"}
        self.transport = FakeTransport()
        self.controller = A
        self.last_controller = time.monotonic()
        self.hb_timeout = 3.0
        self.lock = threading.RLock()
        self.meshes: dict[str, Any] = {}
        p = ProcEntry("m", 0, "gpus=0", pid=123, addr="tcp://10.0.0.2:6000", up=True)
        self.procs = {("m", 0): p}
        self.events: list[dict[str, Any]] = []
        self.keeper = Keeper(self, True)

    def _event(self, header: dict[str, Any], obj: Any = None) -> None:
        if self.keeper.detached:
            self.keeper.hold(header, obj)
            return
        self.events.append(header)


def msg(kind: str, epoch: str, **h: Any) -> Message:
    return Message({"k": kind, "se": epoch, **h})


def reattach(a: FakeAgent, by: str, epoch: str, nonce: str, force: bool = False) -> None:
    a.keeper.on_reattach(msg(Kind.REATTACH, epoch, controller=by, nonce=nonce, force=force), [])


def test_the_first_heartbeat_names_the_owner_and_only_its_heartbeats_count():
    a = FakeAgent()
    assert a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    assert a.keeper.owner_epoch == "ea"
    assert not a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "other"))  # a key holder it does not report to
    assert not a.keeper.from_owner(msg(Kind.SHUTDOWN, "other"))


def test_a_controller_silent_past_the_limit_is_reported_to_again_with_the_exits_it_missed():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    assert a.keeper.controller_silent(10.0) and a.keeper.detached
    a._event({"k": Kind.PROC_EXIT, "m": "m", "rk": 0}, "failure")
    a._event({"k": Kind.OUT, "m": "m", "rk": 0, "lines": ["x"]})  # output is not kept
    assert a.events == []
    assert a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    assert not a.keeper.detached
    assert [e["k"] for e in a.events] == [Kind.PROC_EXIT]


def test_a_controller_that_detached_on_purpose_is_not_reported_to_by_a_late_heartbeat():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    a.keeper.on_detach(msg(Kind.DETACH, "ea"), [])
    assert a.keeper.detached
    assert not a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    assert a.keeper.detached


def test_a_takeover_deposes_the_old_controller_here_and_in_the_procs_and_tells_it_once_a_second():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    a.keeper.controller_silent(10.0)  # A stalls (SIGSTOP): detached, not on purpose
    reattach(a, B, "eb", "t/re-1/0")
    assert a.controller == B and a.keeper.owner_epoch == "eb"
    assert Kind.AGENT_GONE in a.transport.kinds(A)  # A may wake up: it hears who took the job
    notice = [h for to, h in a.transport.sent if to == "tcp://10.0.0.2:6000"]
    assert notice == [{"k": Kind.NOTICE, "what": "deposed", "ep": "ea"}]
    a.transport.sent.clear()
    for kind in (Kind.HEARTBEAT, Kind.CALL, Kind.STOP_PROCS, Kind.SHUTDOWN, Kind.DETACH, Kind.KILL_PROC):
        assert a.keeper.refuses(msg(kind, "ea"))
    assert a.transport.kinds(A) == [Kind.AGENT_GONE]  # told once, not once per message
    assert a.transport.stats.dropped_deposed == 6
    assert not a.keeper.refuses(msg(Kind.CALL, "eb"))
    assert not a.keeper.refuses(msg(Kind.REATTACH, "ea"))  # it may ask to take the job back


def answers(a: FakeAgent, to: str) -> list[dict[str, Any]]:
    return [h for t, h in a.transport.sent if t == to and h["k"] == Kind.AGENT_UP]


def test_a_live_controller_is_kept_unless_forced_and_a_forced_one_hears_it():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    reattach(a, B, "eb", "t/re-1/0")
    assert a.controller == A and "waiting" in answers(a, B)[0]  # it may have died since its last heartbeat
    assert a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))  # it did not: the reattach is refused now
    last = answers(a, B)[-1]
    assert a.controller == A and "still driven by a live controller" in last["refused"]
    assert last["nonce"] == "t/re-1/0" and "force=True" in last["refused"]
    reattach(a, B, "eb", "t/re-2/0", force=True)
    assert a.controller == B and Kind.AGENT_GONE in a.transport.kinds(A)


def test_a_late_detach_for_a_reattach_that_gave_up_does_not_detach_a_newer_one():
    a = FakeAgent()
    a.keeper.controller_silent(10.0)
    reattach(a, B, "eb", "t/re-1/0")
    reattach(a, B, "eb", "t/re-2/0")  # the same controller tries again before the first answer came back
    a.keeper.on_detach(msg(Kind.DETACH, "eb", nonce="t/re-1/0"), [])
    assert not a.keeper.detached
    a.keeper.on_detach(msg(Kind.DETACH, "eb", nonce="t/re-2/0"), [])
    assert a.keeper.detached


def test_the_same_controller_reattaching_again_deposes_nobody():
    a = FakeAgent()
    a.keeper.controller_silent(10.0)
    reattach(a, B, "eb", "t/re-1/0")
    reattach(a, B, "eb", "t/re-2/0")
    assert a.keeper.deposed == {} and a.keeper.owner_epoch == "eb"
    reattach(a, C, "ec", "t/re-3/0", force=True)
    assert a.keeper.deposed == {"eb": B}


def test_a_reattach_waits_out_a_silent_controller_and_then_takes_the_job():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    a.last_controller = time.monotonic() - 2.0  # A was killed: silent, but not for the whole timeout yet
    reattach(a, B, "eb", "t/re-1/0")
    (wait,) = answers(a, B)
    assert "last heard from 2.0 s ago" in wait["waiting"] and "refused" not in wait and "hosted" not in wait
    a.keeper.tick(time.monotonic())  # still within the timeout: it waits on
    assert a.controller == A and len(answers(a, B)) == 1
    a.keeper.tick(a.last_controller + a.hb_timeout)  # silent for the whole timeout: taken for dead
    assert a.controller == B and a.keeper.owner_epoch == "eb"
    assert [e["nonce"] for e in a.events if e["k"] == Kind.AGENT_UP and "hosted" in e] == ["t/re-1/0"]
    assert Kind.AGENT_GONE in a.transport.kinds(A)  # were it only stalled, it hears who took the job
    assert a.keeper.refuses(msg(Kind.CALL, "ea"))
    a.keeper.tick(time.monotonic() + 60)
    assert len(a.events) == 1  # answered once


def test_a_held_reattach_takes_the_job_at_once_when_its_controller_detaches():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    reattach(a, B, "eb", "t/re-1/0")
    assert a.controller == A
    a.keeper.on_detach(msg(Kind.DETACH, "ea"), [])  # a clean exit after all
    assert a.controller == B and not a.keeper.detached
    assert Kind.AGENT_GONE not in a.transport.kinds(A)  # it said it goes: nothing to tell it


def test_a_second_reattach_held_behind_a_first_waits_for_the_new_owner():
    a = FakeAgent()
    a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "ea"))
    a.last_controller = time.monotonic() - 2.5
    reattach(a, B, "eb", "t/re-1/0")
    reattach(a, C, "ec", "t/re-2/0")
    a.keeper.tick(time.monotonic() + 1.0)
    assert a.controller == B  # the first asked first; C now waits for B's heartbeats
    assert len(answers(a, C)) == 2 and all("waiting" in h for h in answers(a, C))
    assert a.keeper.on_heartbeat(msg(Kind.HEARTBEAT, "eb"))
    assert "still driven by a live controller at " + B in answers(a, C)[-1]["refused"]
