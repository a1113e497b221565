"""How a host agent starts: where its configuration (session key included) comes from.

Three ways, one agent (``agent.Agent``):

* **a local job** (``LocalJob``) starts ``python -m jupyter_mesh._runtime.agent_main`` and writes its
  configuration as one JSON line on the agent's stdin, a private pipe; the pipe stays open, and its
  EOF means the controller died (a silent controller is only busy).
* **dial back** (``jupyter-mesh agent --controller ADDR --key-file F``): what a scheduler runs on each
  node. The key file is a *job key* the controller wrote (0600) with that session's keys and the
  job's nonce; the agent advertises the IP its route to the controller leaves by, and exits when the
  controller's heartbeats stop.
* **listen** (``jupyter-mesh agent --listen tcp://IP:PORT [--key-file F]``): started by hand or by
  another launcher; it waits for a controller holding the *mesh key* (``jupyter-mesh keygen``) to
  attach (``attach_to_workers``). The attach message, inside CURVE, carries the session's own keys;
  a session agent is started for it as a child, and when that session ends the listener waits for
  the next controller. One session at a time: a second controller is refused, and told why, unless
  the first has exited (``_controller_gone``).

Never from argv or the environment: a key there is readable by every user through ``ps`` or
``/proc``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

from .._wire.addresses import local_ip_towards, parse_tcp
from .._wire.channels import CurveKeys
from .._wire.keyfile import default_key_path, read_key_file
from .._wire.protocol import VERSION, Kind, check_version
from .._wire.transport import Message, Transport
from ..errors import ProtocolError
from .agent import Agent
from .agent_state import hello
from .template import EarlyStart

__all__ = ["dial_back", "listen", "main", "run_agent"]


def _watch_stdin(agent: Agent) -> None:
    """EOF on stdin: the controller is gone (or closed us). Clean up and exit.

    Reads the raw descriptor: a thread blocked in ``sys.stdin``'s buffered reader holds its lock,
    and an interpreter that finalizes meanwhile aborts ("could not acquire lock ... at interpreter
    shutdown")."""
    try:
        while os.read(0, 1 << 12):
            pass
    except OSError:
        pass
    agent.shutdown()


def _answer_once(cfg: dict[str, Any], refused: str = "") -> None:
    """Send the controller a hello from a throwaway transport: a refusal (another protocol version,
    or a listener already serving another session), so it fails the start naming why at once instead
    of waiting out its timeout."""
    try:
        curve = CurveKeys.from_wire(cfg["curve"]) if cfg.get("curve") else None  # a TCP session needs them
        transport = Transport(bytes.fromhex(cfg["key"]), cfg.get("bind", "tcp://127.0.0.1"), curve)
        try:
            transport.send(cfg["controller"], Message(hello(cfg, cfg.get("listen", ""), refused)))
        finally:
            transport.close(linger_ms=2000)  # the hello must leave before we exit
    except Exception:  # noqa: BLE001 - a config too odd to answer: the job sees our exit code
        pass


def run_agent(cfg: dict[str, Any], watch_stdin: bool, early: EarlyStart | None = None) -> None:
    """Run an agent with ``cfg`` until it shuts down (never returns: the agent ends the process)."""
    try:
        agent = Agent(cfg, early)
    except ProtocolError as e:  # another version: say why on stderr rather than a traceback, and
        _answer_once(cfg)  # tell the controller (its job waits for our hello): it fails naming both
        sys.exit(f"jupyter-mesh agent: {e}")
    threading.Thread(target=agent.transport.serve, args=(agent.handle,), name="recv", daemon=True).start()
    if watch_stdin:
        threading.Thread(target=_watch_stdin, args=(agent,), name="lifeline", daemon=True).start()

    def on_term(signum: int, frame: Any) -> None:  # a scheduler ends us (scancel, time limit, node drain)
        agent._event(
            {"k": Kind.AGENT_GONE, "addr": agent.transport.address, "why": f"it got {signal.Signals(signum).name}"}
        )
        threading.Thread(target=agent.shutdown, args=(False,), name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    agent._event(hello(cfg, agent.transport.address))
    try:
        agent.io_loop()
    finally:
        agent.shutdown()


def dial_back(controller: str | None, key_file: str, bind_ip: str | None, host_index: int | None) -> None:
    """An agent under a scheduler: read the job key, reach the controller, serve until it goes."""
    kf = read_key_file(key_file)
    controller = controller or kf.extra.get("controller")
    if not controller:
        sys.exit(f"jupyter-mesh agent: --controller is needed ({key_file} names no controller)")
    ctl_ip, _ = parse_tcp(controller)
    ip = bind_ip or local_ip_towards(ctl_ip)
    if host_index is None:  # one agent per node under srun: its task rank is its host index
        host_index = int(os.environ.get("SLURM_PROCID", os.environ.get("JUPYTER_MESH_HOST_INDEX", "0")))
    cfg = {
        "v": kf.extra.get("v", VERSION),
        "key": kf.key.hex(),
        "curve": kf.curve.to_wire(),
        "controller": controller,
        "bind": f"tcp://{ip}",
        "host_index": host_index,
        "nonce": f"{kf.extra.get('nonce', '')}/{host_index}",
        "preload": list(kf.extra.get("preload") or []),
        "warm": _module_names(kf.extra.get("warm") or [], "warm"),  # imported here when installed here
        "hb_timeout": float(kf.extra.get("hb_timeout", 3.0)),
        "stdin_lifeline": False,  # a scheduler's stdin is not ours: the controller's heartbeats are
        "keep_alive": kf.extra.get("keep_alive") is True,  # outlive the controller, for the next one
    }
    run_agent(cfg, watch_stdin=False)


# -- listen: wait to be attached ---------------------------------------------------------------------
def _session_cfg(h: dict[str, Any], ip: str, listen_addr: str) -> dict[str, Any]:
    """The session an attach message asks for, checked field by field: it verified under the mesh
    key, but a name, a size or a number off the wire is still never trusted as it is."""
    s = h.get("cfg")
    if not isinstance(s, dict):
        raise ValueError("an attach without a session")
    key, curve, controller = s.get("key"), s.get("curve"), s.get("controller")
    if not (isinstance(key, str) and 32 <= len(key) <= 256):
        raise ValueError("a bad session key")
    bytes.fromhex(key)
    if not (isinstance(curve, list) and len(curve) == 4 and all(isinstance(k, str) and len(k) == 40 for k in curve)):
        raise ValueError("bad CURVE keys")
    parse_tcp(str(controller))
    nonce, index, hb = s.get("nonce"), s.get("host_index"), s.get("hb_timeout", 3.0)
    preload = _module_names(s.get("preload") or [], "preload")
    warm = _module_names(s.get("warm") or [], "warm")
    if not (isinstance(nonce, str) and len(nonce) <= 128):
        raise ValueError("a bad nonce")
    if not (isinstance(index, int) and 0 <= index < 1 << 20):
        raise ValueError("a bad host index")
    if not (isinstance(hb, (int, float)) and 0.1 <= hb <= 600):
        raise ValueError("a bad heartbeat timeout")
    return {
        "v": s.get("v"),
        "key": key,
        "curve": curve,
        "controller": controller,
        "bind": f"tcp://{ip}",
        "host_index": index,
        "nonce": nonce,
        "preload": preload,
        "warm": warm,
        "hb_timeout": float(hb),
        "stdin_lifeline": False,  # our pipe ends it if we die; a silent controller is gone
        "listen": listen_addr,
    }


def _module_names(value: Any, what: str) -> list[str]:
    """A list of module names off the wire or a key file, checked: at most 256 names, each short."""
    if not (isinstance(value, list) and len(value) <= 256 and all(isinstance(m, str) and len(m) < 200 for m in value)):
        raise ValueError(f"a bad {what} list")
    return list(value)


def listen(address: str, key_file: str | None, once: bool = False) -> int:
    """Wait at ``address`` for controllers holding the mesh key; serve one session at a time."""
    ip, port = parse_tcp(address)
    if ipaddress.ip_address(ip).is_unspecified:
        raise ValueError(
            f"--listen {address}: give this host's IP that controllers dial (e.g. tcp://10.0.0.2:{port}), not "
            f"{ip}: the address a controller dials is part of what it signs, so attaches sent to another one "
            f"would be dropped"
        )
    kf = read_key_file(key_file or default_key_path())
    transport = Transport(kf.key, f"tcp://{ip}", kf.curve, inbox_port=port)
    asks: queue.Queue[Message] = queue.Queue()

    def on_message(msg: Message, frames: list[Any]) -> None:
        if msg.header.get("k") == Kind.ATTACH:
            asks.put(msg)

    threading.Thread(target=transport.serve, args=(on_message,), name="listen", daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"jupyter-mesh agent: waiting to be attached at {transport.address} (pid {os.getpid()})", flush=True)
    child: subprocess.Popen[bytes] | None = None
    current = ""  # the controller of the running session
    key = ""  # and its key (its shared-memory segments are named after it)
    served = 0
    try:
        while not stop.is_set():
            if child is not None and child.poll() is not None:
                print(f"jupyter-mesh agent: session ended (exit {child.returncode}); waiting again", flush=True)
                _sweep_session(key)
                child = None
                if once and served:
                    return 0
            try:
                msg = asks.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                cfg = _session_cfg(msg.header, ip, transport.address)
            except (ValueError, TypeError) as e:
                print(f"jupyter-mesh agent: ignored an attach: {e}", file=sys.stderr, flush=True)
                continue
            try:
                check_version(cfg.get("v"), "the controller that attaches")
            except ProtocolError as e:
                _answer_once(cfg, refused=str(e))
                continue
            if child is not None and cfg["controller"] == current:
                # the same controller again: it gave the old session up (a cut, a stall); so do we
                print("jupyter-mesh agent: the same controller attaches again; ending its old session", flush=True)
                _end_session(child, key)
                child = None
            if child is not None and _controller_gone(current):
                # its controller exited (a kernel restart): the next one need not wait out the old
                # session's silence timer (3 heartbeat timeouts)
                why = f"{current} is gone (its port refuses connections)"
                print(f"jupyter-mesh agent: {why}; ending its session for {cfg['controller']}", flush=True)
                _end_session(child, key, controller_gone=True)
                child = None
                if once:
                    _answer_once(cfg, refused="this agent served its one session (--once) and exits")
                    return 0
            if child is not None:
                _answer_once(cfg, refused=f"this agent already serves another controller (agent pid {child.pid})")
                print(f"jupyter-mesh agent: refused {cfg['controller']}: busy with {current}", flush=True)
                continue
            child = _start_session(cfg)
            current, key = cfg["controller"], cfg["key"]
            served += 1
            print(f"jupyter-mesh agent: attached by {cfg['controller']} (session pid {child.pid})", flush=True)
    finally:
        if child is not None:
            _end_session(child, key)
        transport.close()
    return 0


def _start_session(cfg: dict[str, Any]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "jupyter_mesh._runtime.agent_main"], stdin=subprocess.PIPE)
    stdin: IO[bytes] = p.stdin  # type: ignore[assignment]
    stdin.write(json.dumps(cfg).encode() + b"\n")
    stdin.flush()  # stays open: when the listener dies, so does its session
    return p


def _sweep_session(key_hex: str) -> None:
    """An ended session's shared-memory segments: its agent sweeps them only when orphaned (EOF), and a
    SIGTERM'd or killed one leaves them; its procs are gone with it, so nobody on this host claims them."""
    from .._wire import shm

    try:
        shm.sweep(shm.session_prefix(bytes.fromhex(key_hex)))
    except (ValueError, OSError):
        pass


def _controller_gone(address: str, timeout: float = 1.0) -> bool:
    """Whether the controller at ``address`` has certainly exited: no connection of this host to its
    port is established any more (its exit closed them all: our session agent's among them), and its
    port refuses a new one.

    Silence is no sign: a live controller busy in a long C call (holding its GIL), or stopped, misses
    its heartbeats, yet its port still accepts (the kernel answers for it) and it must keep its host.
    A refusal alone is no proof either: a firewall may reject new connections (a REJECT of state NEW,
    a connection limit, a forged ICMP port-unreachable) while the established ones work on, so the
    session agent's own connection is asked first. A host that does not answer at all proves nothing.
    A connection that is accepted is closed at once: the controller drops it unauthenticated, as any
    stranger's."""
    try:
        ip, port = parse_tcp(address)
        if _established_to(ip, port):
            return False
        with socket.create_connection((ip, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


_ESTABLISHED = "01"  # the TCP state in /proc/net/tcp


def _established_to(ip: str, port: int) -> bool:
    """Whether a TCP connection of this host (this network namespace) to ``ip:port`` is established.
    Linux's /proc/net/tcp{,6}; elsewhere (no such table) True, which keeps the host with the session."""
    want = ipaddress.ip_address(ip)
    seen_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        seen_table = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _ESTABLISHED:
                continue
            rip, _, rport = fields[2].partition(":")
            try:
                words = [int(rip[i : i + 8], 16) for i in range(0, len(rip), 8)]
                raw = struct.pack(f"={len(words)}I", *words)  # each word in host order, as the kernel prints it
                remote = ipaddress.ip_address(raw)
                if isinstance(remote, ipaddress.IPv6Address) and remote.ipv4_mapped is not None:
                    remote = remote.ipv4_mapped
                if remote == want and int(rport, 16) == port:
                    return True
            except (ValueError, struct.error):
                continue
    return not seen_table


def _end_session(p: subprocess.Popen[bytes], key_hex: str, controller_gone: bool = False) -> None:
    """Our session's agent goes with us: SIGTERM (it tells its controller why, at once), EOF on its
    stdin, then a kill if it lingers. A stopped one is resumed first, or the SIGTERM waits.

    When its controller has exited there is nobody to tell: EOF alone, the sign an agent reads as
    "orphaned", so it also sweeps the session's shared memory (a SIGTERM's shutdown leaves that to
    a controller that may still be sending). SIGTERM only if EOF did not end it. The listener sweeps
    what is left of the session's either way (``_sweep_session``)."""
    try:
        p.send_signal(signal.SIGCONT)
        if not controller_gone:
            p.terminate()
    except OSError:
        pass
    if p.stdin is not None:
        p.stdin.close()
    for escalate in [p.terminate, p.kill] if controller_gone else [p.kill]:
        if _exits_within(p, 5.0):
            break
        try:
            escalate()
        except OSError:
            pass
    else:
        if not _exits_within(p, 5.0):  # unkillable (a disk wait): the listener goes on without it
            print(f"jupyter-mesh agent: session pid {p.pid} did not exit after SIGKILL", file=sys.stderr, flush=True)
    _sweep_session(key_hex)


def _exits_within(p: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return p.poll() is not None


def main(early: EarlyStart | None = None) -> None:
    """A local agent: its configuration is one JSON line on stdin (``LocalJob``, the listener; they
    start it through ``agent_main``, which hands over the template it started first)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel's interrupts are not for us
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit("jupyter-mesh agent: expected a JSON configuration line on stdin")
    run_agent(json.loads(line), watch_stdin=True, early=early)


if __name__ == "__main__":
    main()
