"""Where a session's sockets listen, and who can reach them.

On one host every socket is a unix socket (``ipc://``) in a directory of this session, mode 0700 and
owned by the user: the kernel refuses any other user's ``connect`` before a byte is read, so no one
else can send (or flood) anything, signed or not. That is the default.

A TCP bind (``JUPYTER_MESH_BIND=tcp://<interface>``) is for peers on other hosts. Every TCP socket of
the session speaks CurveZMQ: encrypted, and a server admits (through ZAP) only clients holding the
session's client key, which the controller makes and hands to its agents out of band with the
signing key. A peer without it cannot finish the handshake, so it never gets a byte of a message to
us. ``JUPYTER_MESH_INSECURE=1`` turns CURVE off (said loudly on stderr; only for a network you trust);
without CURVE, a bind off loopback is refused. Every TCP socket also drops a frame larger than
``max_frame`` before buffering it.
"""

from __future__ import annotations

import fcntl
import hmac
import ipaddress
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

__all__ = [
    "ENV_BIND",
    "ENV_INSECURE",
    "ENV_MAX_FRAME",
    "HANDSHAKE_MS",
    "CurveKeys",
    "FrameTooLarge",
    "OnlyClientKey",
    "check_frames_fit",
    "check_private_dir",
    "curve_wanted",
    "default_bind",
    "is_loopback",
    "max_frame",
    "raise_fd_limit",
    "remove_session_dir",
    "sweep_stale_dirs",
]

ENV_BIND = "JUPYTER_MESH_BIND"
ENV_INSECURE = "JUPYTER_MESH_INSECURE"
ENV_MAX_FRAME = "JUPYTER_MESH_MAX_FRAME"
_PREFIX = "jupyter-mesh-"
_LOCK = ".lock"  # in each session directory, flock()ed by its controller for as long as it lives
_held: dict[str, int] = {}  # our session directories -> the fd holding their lock
_warned = False


def _base() -> str:
    """``$XDG_RUNTIME_DIR`` (per user, on tmpfs) when it is ours, else the temp dir. Unix socket paths
    are limited to ~107 bytes: a long base falls back to /tmp.

    Whoever can write to the base without a sticky bit can rename our private directory away and put
    their own in its place, where our later sockets would be made: so the base must be our own, not
    writable by others, or sticky (/tmp). An ``XDG_RUNTIME_DIR`` left over from another user (``su``
    without ``-``; root can write anywhere) is not used."""
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    if run and len(run) < 60 and _safe_base(run, sticky_ok=False):
        return run
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) < 60 and _safe_base(tmp, sticky_ok=True) else "/tmp"


def _safe_base(path: str, sticky_ok: bool) -> bool:
    """Nobody else can rename what we make in ``path``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not os.access(path, os.W_OK | os.X_OK):
        return False
    if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        return True
    return sticky_ok and bool(st.st_mode & stat.S_ISVTX)


def check_private_dir(path: str) -> None:
    """Raise unless ``path`` is a real directory owned by this user that nobody else can enter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a private directory of this user (mode {stat.S_IMODE(st.st_mode):o}, "
            f"owner {st.st_uid}): jupyter_mesh will not listen there"
        )


def default_bind() -> str:
    """The controller's bind: ``JUPYTER_MESH_BIND`` if set (checked), else a new private directory."""
    bind = os.environ.get(ENV_BIND, "").strip()
    if bind:
        check_bind(bind)
        return bind
    sweep_stale_dirs()
    path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_base())  # mode 0700, O_EXCL
    check_private_dir(path)
    # held while this process lives: the sweep of another controller (even one in another pid
    # namespace, where our pid means nothing) sees the directory is in use
    fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held[path] = fd
    return f"ipc://{path}"


@dataclass(frozen=True)
class CurveKeys:
    """A session's CURVE keys (Z85): every TCP server of the session is ``server``, every client
    ``client``; servers admit only ``client_public``. Made by the controller, handed out of band."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def new(cls) -> CurveKeys:
        sp, ss = zmq.curve_keypair()
        cp, cs = zmq.curve_keypair()
        return cls(sp, ss, cp, cs)

    def to_wire(self) -> list[str]:
        return [k.decode() for k in (self.server_public, self.server_secret, self.client_public, self.client_secret)]

    @classmethod
    def from_wire(cls, keys: list[str]) -> CurveKeys:
        sp, ss, cp, cs = (k.encode() for k in keys)
        return cls(sp, ss, cp, cs)


def _insecure() -> bool:
    return os.environ.get(ENV_INSECURE, "") in ("1", "true", "yes")


def curve_wanted(bind: str) -> bool:
    """Whether a session bound at ``bind`` speaks CURVE: every TCP bind does, unless opted out."""
    return bind.startswith("tcp://") and not _insecure() and zmq.has("curve")


def is_loopback(bind: str) -> bool:
    host = bind[len("tcp://") :].strip("[]") if bind.startswith("tcp://") else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_bind(bind: str) -> None:
    """A bind this process may use: a private directory, TCP with CURVE, loopback TCP, or (opted in)
    any TCP interface without CURVE."""
    if bind.startswith("ipc://"):
        check_private_dir(bind[len("ipc://") :])
        return
    if not bind.startswith("tcp://"):
        raise ValueError(f"{ENV_BIND} must be ipc://<private dir> or tcp://<interface>, not {bind!r}")
    if curve_wanted(bind):
        return
    loopback = is_loopback(bind)
    if not loopback and not _insecure():
        raise PermissionError(
            f"refusing to listen on {bind}: this pyzmq has no CURVE, so anyone on that network could "
            f"connect and only the message signature would stand in their way. Bind loopback or leave "
            f"{ENV_BIND} unset (private unix sockets), or set {ENV_INSECURE}=1 to accept the risk"
        )
    global _warned
    if not _warned and not loopback:
        _warned = True
        print(
            f"jupyter_mesh: WARNING: listening on {bind} without encryption or peer authentication "
            f"({ENV_INSECURE}=1): anyone who can reach it can connect",
            file=sys.stderr,
        )


def max_frame() -> int:
    """The largest frame a TCP socket accepts (``ZMQ_MAXMSGSIZE``); a larger one drops the connection
    before it is buffered. Same-host bulk goes through shared memory, so this only bounds peers that
    send over the network."""
    raw = os.environ.get(ENV_MAX_FRAME, "").strip()
    if not raw:
        return 256 << 20
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_MAX_FRAME}={raw!r} is not a number of bytes") from None
    if n < 1 << 16:
        raise ValueError(f"{ENV_MAX_FRAME}={n} is too small for a control message; use at least 65536")
    return n


def check_frames_fit(frames: Sequence[Any]) -> None:
    """Refuse, before it is sent, a message a TCP peer would drop on arrival (and with it the
    connection, silently: the call would wait for ever) for a frame larger than :func:`max_frame`."""
    limit = max_frame()
    for f in frames:
        n = memoryview(f).nbytes
        if n > limit:
            raise FrameTooLarge(
                f"a frame of {n} bytes is larger than the {limit} a peer over TCP accepts ({ENV_MAX_FRAME}): "
                f"raise it to the same value on every host, send less per message, or pass a large tensor "
                f"as an RDMABuffer"
            )


class FrameTooLarge(ValueError):
    """A message with a frame above ``max_frame`` for a TCP peer (never sent)."""


HANDSHAKE_MS = 5000  # a TCP connection that has not finished its handshake by then is dropped
_fd_limit_raised = False


def raise_fd_limit() -> None:
    """A TCP bind can be sent half-open connections by anyone who reaches it: lift the soft limit on
    open files to the hard one (up to 65536), once, so they cannot starve the process of descriptors."""
    global _fd_limit_raised
    if _fd_limit_raised:
        return
    _fd_limit_raised = True
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


class OnlyClientKey:
    """ZAP credentials: a CURVE client is admitted only with the session's client key."""

    def __init__(self, key: bytes):
        self._key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return hmac.compare_digest(key, self._key)


def remove_session_dir(bind: str) -> None:
    """Remove the session's directory (at controller exit; sockets of dead processes are left in it)."""
    path = bind[len("ipc://") :]
    if bind.startswith("ipc://") and os.path.basename(path).startswith(_PREFIX):
        shutil.rmtree(path, ignore_errors=True)
        fd = _held.pop(path, None)
        if fd is not None:
            os.close(fd)


def _locked(path: str) -> bool:
    """Whether a live process holds the lock of session directory ``path``."""
    if path in _held:
        return True
    try:
        fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def sweep_stale_dirs() -> int:
    """Remove session directories of this user whose controller is gone (killed before its exit)."""
    base, removed = _base(), 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or path in _held:
                continue
            fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not a directory of ours, or one without a lock: left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its controller's lock is gone with it
        except OSError:
            continue  # in use
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed
