"""The controller's links to its host agents: which it admits, which it hears, which it gave up on.

An agent is admitted only when a job waits for its hello (a nonce the job chose); from then on the
controller pings it every quarter of the heartbeat timeout from a thread and socket of its own, and an
agent silent past the timeout, or one that says it is exiting, is *lost*: every rank on its host fails
with the cause, and it is never re-admitted. O(hosts) pings per interval, never O(procs).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from .._core.future import Future
from .._core.state import HostState
from .._wire.addresses import host_of
from .._wire.channels import ENV_MAX_FRAME, is_loopback, max_frame
from .._wire.protocol import Kind, check_version
from .._wire.transport import Message, Transport
from ..errors import Failure, MeshError, ProtocolError

if TYPE_CHECKING:
    from .._core.state import StateTracker
    from .client import Client
    from .hosts import Job
    from .records import MeshRecords

__all__ = ["AgentLinks"]


def _frame_mismatch(h: dict[str, Any]) -> str:
    """Why an agent over TCP cannot be used: its sockets take frames of another size than ours (the
    side with the smaller limit would drop a message the other sends, with the connection, and the
    link would stall on it); "" if it can."""
    mine, theirs = max_frame(), h.get("mf")
    if not str(h.get("addr", "")).startswith("tcp://") or not isinstance(theirs, int) or theirs == mine:
        return ""
    return (
        f"the agent of host {h.get('h')} at {str(h.get('addr'))[:80]} takes frames up to {theirs} bytes over "
        f"TCP and this controller {mine} ({ENV_MAX_FRAME}): set the same value where each runs"
    )


class LinksHost(Protocol):
    """What the links need of the controller."""

    transport: Transport
    client: Client
    meshes: MeshRecords
    state: StateTracker
    _jobs: list[Job]
    _lock: threading.Lock

    @property
    def is_closed(self) -> bool: ...

    def proc_exit(self, mesh_id: str, rank: int, failure: Failure) -> None: ...


class AgentLinks:
    """Admission and liveness of one controller's agents (``Controller.links``)."""

    def __init__(self, ctl: LinksHost):
        self.ctl = ctl
        self.transport = ctl.transport
        self.hb_timeout = float(os.environ.get("JUPYTER_MESH_HEARTBEAT_TIMEOUT", "3.0"))
        self.seen: dict[str, float] = {}  # agent address -> when it last answered
        self.lost: dict[str, str] = {}  # agent address -> why it is gone for good
        self._waiters: dict[str, Future[dict[str, Any]]] = {}  # nonce -> the job waiting for that hello
        self._told_waiting: set[str] = set()  # reattaches whose wait the user was told of
        self._stop = threading.Event()
        self._bell_lock = threading.Lock()
        self._bell: int | None = None  # a pipe's write end: wakes the heartbeat thread to see _stop
        self._bell_pid = os.getpid()  # (a forked child's close must not ring its parent's thread)
        self._thread = threading.Thread(target=self._heartbeats, name="jupyter-mesh-heartbeat", daemon=True)
        self._thread.start()

    def live(self) -> list[str]:
        return [a for a in self.seen if a not in self.lost]

    def close(self) -> None:
        self._stop.set()
        with self._bell_lock:
            if self._bell is not None and os.getpid() == self._bell_pid:
                try:
                    os.write(self._bell, b"x")
                except OSError:  # full: it is being woken already
                    pass

    # -- admission ----------------------------------------------------------------------------------
    def expect_agent(self, nonce: str) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future("agent start")
        self._waiters[nonce] = fut
        return fut

    def stop_expecting(self, nonce: str) -> None:
        """A job no longer waits for this agent: its hello, should it still come, is told to shut down."""
        self._waiters.pop(nonce, None)

    def on_agent_up(self, msg: Message, frames: list[Any]) -> None:
        """An agent's hello: it listens at ``addr``; the job that started it waits on its nonce."""
        h = msg.header
        if h.get("waiting"):  # a kept agent waits out its silent controller before it answers (``keep_alive``)
            nonce = str(h.get("nonce", ""))
            ask = nonce.rpartition("/")[0] or nonce  # one reattach asks every host: say it once, not once per host
            if nonce in self._waiters and ask not in self._told_waiting:
                self._told_waiting.add(ask)
                print(
                    f"jupyter_mesh: the agent at {str(h.get('addr'))[:80]}: {str(h['waiting'])[:300]}", file=sys.stderr
                )
            return
        w = self._waiters.pop(h.get("nonce", ""), None)
        refused = h.get("refused")
        if refused:  # a listening agent that serves another session, or speaks another version
            err = MeshError(f"the agent at {str(h.get('addr'))[:80]} refused this controller: {str(refused)[:300]}")
            if w is not None:
                w._set_exception(err)
            return
        try:
            check_version(h.get("v"), f"the agent of host {h.get('h')} (pid {h.get('pid')})")
        except ProtocolError as e:
            if w is not None:
                w._set_exception(e)
            else:
                print(f"jupyter_mesh: {e}", file=sys.stderr)
            return
        mismatch = _frame_mismatch(h)
        if mismatch and w is not None:  # it must not live on, unwatched: told to stop below
            w._set_exception(MeshError(mismatch))
            w = None
        if w is None:  # nobody waits for it (a job that gave up or stopped): it must not live on, unwatched
            # but a kept agent answering a reattach that gave up keeps its procs for the next try
            late = {"k": Kind.DETACH, "nonce": h.get("nonce")} if "hosted" in h else {"k": Kind.SHUTDOWN}
            try:
                self.transport.send(h["addr"], Message(late))
                self.transport.forget(h["addr"], linger_ms=1000)
            except Exception:  # noqa: BLE001 - an address we cannot reach: it exits on our silence
                pass
            return
        self.seen[h["addr"]] = time.monotonic()
        w._set_result(h)

    def on_agent_gone(self, msg: Message, frames: list[Any]) -> None:
        """An agent says it is exiting (a scheduler's SIGTERM: scancel, a time limit): lost now,
        not after the heartbeat timeout."""
        addr = msg.header.get("addr")
        if isinstance(addr, str) and addr in self.seen:
            self.agent_lost(addr, f"it is exiting: {str(msg.header.get('why'))[:200]}", HostState.EXITING)

    def on_heartbeat_ack(self, msg: Message, frames: list[Any]) -> None:
        if msg.header["addr"] in self.seen:
            self.seen[msg.header["addr"]] = time.monotonic()

    def forget_agents(self, addrs: list[str]) -> None:
        """A job stopped these agents on purpose: no more heartbeats to them, no socket kept. The
        SHUTDOWN the job just sent may not have left yet (no connection to that agent before it):
        its socket lingers a moment instead of dropping it, else the agent lives on until its silence
        timer (3 heartbeat timeouts) and a listener refuses every other controller meanwhile."""
        for addr in addrs:
            self.seen.pop(addr, None)
            self.transport.forget(addr, linger_ms=1000)

    # -- liveness -----------------------------------------------------------------------------------
    def _heartbeats(self) -> None:
        """Ping every agent each quarter of the timeout; they answer to a socket of this thread's
        own, so liveness never waits behind the receive thread (which may be busy unpickling a big
        reply for seconds: that must not make a healthy host look lost). Between two pings it sleeps
        until an answer comes or ``close`` rings its bell: waking every 0.1 s to look for a close
        cost the idle controller 0.2 % of a core (half its idle CPU, ``bench_scale.py``)."""
        interval = self.hb_timeout / 4
        try:
            sock, address = self.transport.bind_inbox()
        except zmq.ZMQError:  # closing down
            return
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        bell_r = bell_w = -1
        try:
            bell_r, bell_w = os.pipe()
            os.set_blocking(bell_r, False)
            os.set_blocking(bell_w, False)
            poller.register(bell_r, zmq.POLLIN)
            with self._bell_lock:
                self._bell, self._bell_pid = bell_w, os.getpid()
        except (OSError, zmq.ZMQError):  # no descriptor left: look for a close every 0.1 s instead
            for fd in (bell_r, bell_w):
                if fd >= 0:
                    os.close(fd)
            bell_r = bell_w = -1
        try:
            due = last = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                if now - last > 2 * interval:
                    # this thread could not run (the program held the GIL in a long C call, or the
                    # machine was starved): no agent is to blame for answers we could not read
                    self._read_acks(sock)
                    self._forgive(now - last - interval)
                last = now
                if now >= due:
                    due = now + interval
                    self._read_acks(sock)  # answers already here count before anyone is judged
                    if not self._ping_agents(now, address):
                        return
                wait_ms = max(1, int((due - now) * 1000) + 1)
                ready = dict(poller.poll(wait_ms if bell_r >= 0 else min(100, wait_ms)))
                if ready.get(sock):
                    self._read_acks(sock)
                if bell_r >= 0 and ready.get(bell_r):
                    try:
                        os.read(bell_r, 64)  # rung: the loop's test sees the close
                    except OSError:
                        pass
        except zmq.ZMQError:  # the transport closed under us: shutting down
            return
        finally:
            with self._bell_lock:
                self._bell = None
            for fd in (bell_r, bell_w):
                if fd >= 0:
                    os.close(fd)
            if not sock.closed:
                sock.close(linger=0)

    def _ping_agents(self, now: float, reply_to: str) -> bool:
        for addr, seen in list(self.seen.items()):
            if addr in self.lost:
                continue
            if now - seen > self.hb_timeout:
                self.agent_lost(addr, self._silence(addr, now - seen), HostState.UNREACHABLE)
                continue
            try:
                self.transport.send(addr, Message({"k": Kind.HEARTBEAT, "hr": reply_to}))
            except Exception:  # noqa: BLE001 - closing down
                return False
        return True

    def _silence(self, addr: str, for_s: float) -> str:
        """Why an agent is lost when it stops answering: on another host, most likely the network."""
        if addr.startswith("tcp://") and not is_loopback(addr.rsplit(":", 1)[0]):
            ip = host_of(addr)
            if ip != host_of(self.transport.address):
                return f"host {ip} unreachable for {for_s:.1f} s (no answer to heartbeats)"
        return f"it stopped answering heartbeats for {for_s:.1f} s"

    def _forgive(self, stall: float) -> None:
        for addr, seen in list(self.seen.items()):
            self.seen[addr] = seen + stall

    def _read_acks(self, sock: zmq.Socket[Any]) -> None:
        while True:
            try:
                frames = Transport.recv_frames(sock, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            msg = self.transport.decode(frames)
            if msg is not None and msg.header.get("k") == "hb_ack" and msg.header.get("addr") in self.seen:
                self.seen[msg.header["addr"]] = time.monotonic()

    # -- loss ---------------------------------------------------------------------------------------
    def agent_lost(self, addr: str, why: str, state: HostState = HostState.LOST) -> None:
        """An agent is gone for good: its process exited, or it went silent past the heartbeat timeout.

        Every rank on its host fails with that cause, requests waiting on it fail now, and later ones
        fail at once (``client.peer_lost``). A silent agent is told to shut down, and its job kills
        it, so one that was only stalled (SIGSTOP, swapping) cannot wake up and act on stale state:
        we never re-admit it; a ``LocalJob`` starts a fresh agent for that host on next use.
        ``state`` is what the views show of its host: unreachable (silent), exiting (it said so), lost."""
        ctl = self.ctl
        with ctl._lock:
            if addr in self.lost or ctl.is_closed:
                return
            self.lost[addr] = why
        for job in list(ctl._jobs):
            try:
                said = job.explain_loss(addr)
            except Exception:  # noqa: BLE001 - the cause we have is enough
                said = None
            if said:
                why = f"{why}; {said}"
        detail = f"the host agent at {addr} is lost: {why}"
        try:
            self.transport.send(addr, Message({"k": Kind.SHUTDOWN}))
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        ctl.state.host_lost(addr, state, why)  # before its ranks fail: views show the host's cause with them
        ctl.client.peer_lost(addr, detail)
        for job in list(ctl._jobs):
            job.agent_lost(addr)
        self._host_lost(addr, detail)

    def _host_lost(self, addr: str, detail: str) -> None:
        """Every rank on a lost agent's host is failed (its procs die with it, or are unreachable)."""
        ctl = self.ctl
        for mesh_id, rec in list(ctl.meshes.items()):
            if rec.stopped or addr not in rec.ref.agent_addrs:
                continue
            host = rec.ref.agent_addrs.index(addr)
            ranks = [r for r, h in enumerate(rec.ref.rank_host) if h == host and r not in rec.failures]
            for r in ranks:
                ctl.proc_exit(mesh_id, r, Failure(rec.ref.name, rec.ref.coords(r), "agent", detail))
