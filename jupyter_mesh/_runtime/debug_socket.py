"""How ``jupyter-mesh debug`` reaches a controller from a shell on the same host: a unix socket.

Each controller (a kernel's or a script's; not one embedded in a proc) listens at
``<base>/jupyter_mesh_debug-<uid>/<pid>.sock``, base being where session directories go
(``$XDG_RUNTIME_DIR`` or the temp dir). The directory is the user's own with mode 0700 and the socket
0600, so another user's ``connect`` is refused by the kernel before a byte is read; the server also
checks the peer's uid (``SO_PEERCRED``) and refuses any other. Why not the kernel's control channel
(as ``jupyter-mesh status``): a script's controller has no kernel, and the terminal wants one protocol.

One JSON object per line each way, a request then its answer (``op``):
``hello`` (who runs this controller), ``list`` (paused actors), ``attach`` KEY (take that pdb prompt:
one front at a time, the others are told who has it), ``line`` (a pdb command to the attached one),
``detach``, ``cast`` KEYS LINE (one command to several), ``continue`` KEYS. A key is
``mesh_id/rank/sid`` as ``list`` gives it. A connection that closes gives back what it held.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._wire.channels import _base, check_private_dir
from ..errors import MeshError, MeshTimeoutError
from .debugger import Debugger, PausedActor

__all__ = ["ENV_DEBUG_SOCKET", "DebugSocket", "debug_dir", "key_of"]

ENV_DEBUG_SOCKET = "JUPYTER_MESH_DEBUG_SOCKET"  # "0": no socket (nothing can attach from a terminal)
_TICK = 0.5  # while pdb runs a command, how often the server looks whether the terminal went away
_LINE_MAX = 1 << 20  # a request longer than this is not one of ours


def debug_dir(create: bool = False) -> str:
    """The user's directory of controller debug sockets (made 0700 with ``create``); raises
    PermissionError if what is there is not a private directory of this user."""
    path = os.path.join(_base(), f"jupyter_mesh_debug-{os.geteuid()}")
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    check_private_dir(path)
    return path


def key_of(p: PausedActor) -> str:
    return f"{p.mesh_id}/{p.rank}/{p.sid}"


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _title() -> str:
    """What this controller runs in, for a terminal choosing among several."""
    argv = sys.argv
    if "-f" in argv[:-1] and argv[argv.index("-f") + 1].endswith(".json"):
        return f"kernel {os.path.basename(argv[argv.index('-f') + 1])}"
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv[:4]))[:120] or "python"


class DebugSocket:
    """The server: an accept thread, and one thread per connected terminal (a handful at most)."""

    def __init__(self, debugger: Debugger, path: str):
        self.debugger, self.path = debugger, path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.lexists(path):  # left by a process of ours with our pid (a pid namespace, a reused pid)
            os.unlink(path)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        self._sock.listen(8)
        self._ino = os.stat(path).st_ino  # close() removes the file only if it is still ours
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="jupyter-mesh-debug-socket", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, debugger: Debugger) -> DebugSocket | None:
        """Listen for terminals unless turned off; a directory we cannot use is said, not raised."""
        if os.environ.get(ENV_DEBUG_SOCKET, "").strip() in ("0", "false", "no"):
            return None
        try:
            directory = debug_dir(create=True)
            _sweep(directory)
            path = os.path.join(directory, f"{os.getpid()}.sock")
            if len(path.encode()) > 100:
                return None  # beyond a unix socket's path limit: no terminal attach, nothing else lost
            return cls(debugger, path)
        except OSError as e:
            print(f"jupyter_mesh: `jupyter-mesh debug` cannot reach this program: {e}", file=sys.stderr)
            return None

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="jupyter-mesh-debug-term", daemon=True).start()

    # -- one terminal -----------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        held: list[PausedActor] = []  # what this terminal is attached to (one at most)
        try:
            pid, uid = _peer(conn)
            if uid != os.geteuid():
                self._send(conn, {"error": f"refused: this controller belongs to uid {os.geteuid()}, not {uid}"})
                return
            front = f"jupyter-mesh debug (pid {pid})"
            reader = conn.makefile("rb")
            while True:
                raw = reader.readline(_LINE_MAX)
                if not raw or not raw.endswith(b"\n"):
                    return
                try:
                    req = json.loads(raw)
                    answer = self._handle(conn, req, held, str(req.get("front") or front))
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    answer = {"error": f"bad request: {type(e).__name__}: {e}"}
                if answer is None:
                    return  # the terminal went away while pdb ran its command
                self._send(conn, answer)
        except OSError:
            return
        finally:
            for p in held:
                p.release()
            self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
        conn.sendall(json.dumps(obj).encode() + b"\n")

    @staticmethod
    def _release(held: list[PausedActor]) -> None:
        for p in held:
            p.release()
        held.clear()

    def _find(self, key: str) -> PausedActor | None:
        return next((p for p in self.debugger.paused() if key_of(p) == key), None)

    def _handle(self, conn: socket.socket, req: dict[str, Any], held: list[PausedActor], front: str) -> Any:
        op = req["op"]
        if op == "hello":
            return {"pid": os.getpid(), "title": _title(), "paused": len(self.debugger.paused())}
        if op == "list":
            return {"paused": [_row(p) for p in self.debugger.paused()]}
        if op == "attach":
            self._release(held)
            p = self._find(str(req["key"]))
            if p is None:
                return {"error": "that actor is no longer paused; `list` shows those paused now"}
            holder = p.claim(front)
            if holder:
                return {"error": f"{p.actor} on {p.mesh} {p.label} is being debugged from {holder}"}
            held.append(p)
            if not p.has_output():
                return {"text": "", "ended": ""}  # pdb waits at its prompt: its output was shown elsewhere
            return self._wait(conn, p, None, held)
        if op == "line":
            if not held:
                return {"error": "not attached to any actor"}
            return self._wait(conn, held[0], str(req["line"]), held)
        if op == "detach":
            self._release(held)
            return {}
        if op == "cast":
            return self._cast([str(k) for k in req["keys"]], str(req["line"]), held)
        if op == "continue":
            done, skipped = [], []
            for key in req["keys"]:
                q = self._find(str(key))
                if q is None:
                    continue
                if q.attached and q not in held:
                    skipped.append(f"{q.actor} on {q.mesh} {q.label} is being debugged from {q.attached_by}")
                    continue
                try:
                    q.cont()
                    done.append(f"{q.actor} on {q.mesh} {q.label}")
                except MeshError as e:
                    skipped.append(str(e))
                if q in held:
                    held.remove(q)
                    q.release()
            return {"continued": done, "skipped": skipped}
        return {"error": f"unknown request {op!r}"}

    def _wait(self, conn: socket.socket, p: PausedActor, line: str | None, held: list[PausedActor]) -> Any:
        """Send ``line`` (None: only wait) and wait for pdb's output up to its next prompt, or until the
        actor runs on; None if the terminal went away meanwhile."""
        text: str | None = None
        try:
            try:
                text = p.send(line, timeout=_TICK) if line is not None else p.prompt(timeout=_TICK)
            except MeshTimeoutError:
                pass
            while text is None:
                if _gone(conn):
                    return None
                try:
                    text = p.prompt(timeout=_TICK)
                except MeshTimeoutError:
                    pass
        except MeshError as e:  # no longer paused, or its proc died
            if p in held:
                held.remove(p)
                p.release()
            return {"text": "", "ended": p.ended or "gone", "error": str(e)}
        if p.ended and p in held:
            held.remove(p)
            p.release()
        return {"text": text, "ended": p.ended}

    def _cast(self, keys: list[str], line: str, held: list[PausedActor]) -> dict[str, Any]:
        found = [p for p in (self._find(k) for k in keys) if p is not None]
        out: list[dict[str, Any]] = []
        mine: list[PausedActor] = []
        for p in found:
            holder = "" if p in held else p.claim("jupyter-mesh debug (cast)")
            if holder:
                out.append({"label": f"{p.actor} on {p.mesh} {p.label}", "error": f"being debugged from {holder}"})
            else:
                mine.append(p)

        def one(p: PausedActor) -> dict[str, Any]:
            label = f"{p.actor} on {p.mesh} {p.label}"
            try:
                return {"label": label, "text": p.send(line), "ended": p.ended}
            except MeshError as e:
                return {"label": label, "error": str(e)}
            finally:
                if p not in held:
                    p.release()

        if mine:
            with ThreadPoolExecutor(max_workers=min(16, len(mine))) as pool:
                out.extend(pool.map(one, mine))
        return {"out": out}


def _sweep(directory: str) -> None:
    """Remove the sockets of controllers that were killed (nobody listens: the connect is refused)."""
    for name in os.listdir(directory):
        if not name.endswith(".sock"):
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(os.path.join(directory, name))
        except ConnectionRefusedError:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        except OSError:
            pass
        finally:
            probe.close()


def _row(p: PausedActor) -> dict[str, Any]:
    return {
        "key": key_of(p),
        "actor": p.actor,
        "mesh": p.mesh,
        "rank": p.rank,
        "label": p.label,
        "coords": p.coords,
        "where": p.where,
        "since": p.since,
        "by": p.attached_by if p.attached else "",
        "pm": p.post_mortem,
    }


def _gone(conn: socket.socket) -> bool:
    """The terminal closed its end (Ctrl-C while waiting, or it died)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
