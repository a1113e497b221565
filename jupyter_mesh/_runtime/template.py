"""The template (fork server) of a host: a quiet process that imports heavy modules once and forks procs.

The agent starts it with a fresh interpreter and talks to it over a private unix socket
(SOCK_SEQPACKET, one JSON message per packet, file descriptors attached with SCM_RIGHTS). It has no
threads and no ZeroMQ context, so forking it is safe; each child gets the agent's pipes as its
stdout/stderr and becomes a proc. The template reaps its children and reports every exit (code or
signal) to the agent, which is how a dead proc is noticed within milliseconds.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback
from typing import Any

_PR_SET_PDEATHSIG = 1


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(obj).encode())
    except OSError:
        os._exit(0)  # agent gone


def _preload(mods: list[str], if_installed: bool = False) -> list[str]:
    """Import ``mods``; the errors, as text. ``if_installed`` (the warm default): skip the names this
    host does not have, silently (asked with ``find_spec``, which imports nothing of a top-level name)."""
    errors = []
    for m in mods:
        try:
            if if_installed and m not in sys.modules and importlib.util.find_spec(m) is None:
                continue
            importlib.import_module(m)
        except BaseException as e:  # noqa: BLE001 - reported, the proc will raise it again
            errors.append(f"{m}: {type(e).__name__}: {e}")
    return errors


def _child(
    sock: socket.socket, wake: tuple[int, int], fds: list[int], cfg: dict[str, Any], key: bytes, lifeline: int
) -> None:
    """Runs in the forked child; becomes a proc. A stopped proc leaves by ``SystemExit`` through the
    template's frames, so its interpreter finalizes as at any normal exit; everything else ends here."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:  # die with the template (and so with the agent), even if never told
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except Exception:  # noqa: BLE001 - not Linux: the lifeline pipe still covers it
            pass
        if os.getppid() != cfg["template_pid"]:
            os._exit(71)
        sock.close()
        os.close(wake[0])
        os.close(wake[1])
        out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: prints show promptly
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        _own_random_state()
        from . import proc

        code = proc.main(cfg, key, lifeline)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(3)
    raise SystemExit(code)


def _own_random_state() -> None:
    """Every proc forks from this template's random state; a separately started process seeds
    Python's ``random`` and numpy's global generator from the OS's entropy, so each proc must too
    (``random`` reseeds itself at fork; numpy does not). torch is left as imported: its default seed
    is the same fixed number in every fresh process, and a preloaded template has not drawn from it."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def main() -> None:
    # die with the agent even while busy in a long preload (torch: seconds), when nobody reads the
    # socket whose EOF would say so; the agent starts us from its main thread, which lives as long as it
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux: the socket's EOF still ends us, once read
        pass
    if len(sys.argv) > 3 and os.getppid() != int(sys.argv[3]):
        os._exit(0)  # the agent died before the line above took effect
    sock = socket.socket(fileno=int(sys.argv[1]))
    lifeline = int(sys.argv[2])
    os.set_inheritable(lifeline, True)
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for procs, delivered by the agent
    key = b""
    # import what every proc needs before the first fork
    import cloudpickle  # noqa: F401
    import msgpack  # noqa: F401
    import zmq  # noqa: F401

    from . import client, proc  # noqa: F401

    _send(sock, {"op": "ready", "pid": os.getpid()})
    while True:
        try:
            ready, _, _ = select.select([sock.fileno(), r], [], [])
        except InterruptedError:
            continue
        if r in ready:
            try:
                while os.read(r, 512):
                    pass
            except BlockingIOError:
                pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                code = os.waitstatus_to_exitcode(status)
                _send(
                    sock,
                    {
                        "op": "exit",
                        "pid": pid,
                        "code": code if code >= 0 else None,
                        "signal": -code if code < 0 else None,
                    },
                )
        if sock.fileno() in ready:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 4)
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                os._exit(0)
            if not data:
                os._exit(0)  # the agent is gone: children follow through PDEATHSIG
            msg = json.loads(data)
            op = msg["op"]
            if op == "key":
                key = bytes.fromhex(msg["key"])
            elif op == "preload":
                errors = _preload(msg["modules"], bool(msg.get("if_installed")))
                _send(sock, {"op": "preloaded", "token": msg["token"], "errors": errors})
            elif op == "fork":
                cfg = msg["cfg"]
                cfg["template_pid"] = os.getpid()
                pid = os.fork()
                if pid == 0:
                    _child(sock, (r, w), fds, cfg, key, lifeline)
                for fd in fds:
                    os.close(fd)
                _send(sock, {"op": "forked", "token": msg["token"], "pid": pid})


if __name__ == "__main__":
    main()
