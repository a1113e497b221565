"""Keys handed to agents on other hosts out of band: a small JSON file only its owner can read.

A local agent gets the session key over its stdin pipe. An agent on another host cannot: a scheduler
starts it, or a person does. It then reads a *key file*: the signing key and CURVE keys, in a file of
mode 0600 in a directory of mode 0700 — never on a command line (``ps`` shows it to every user) and
never in clear on the wire. Two kinds:

* a **mesh key** (``jupyter-mesh keygen``, default ``~/.jupyter_mesh/mesh.key``): long-lived, shared
  by the user's controllers and the agents they start by hand with ``--listen``. It only admits a
  controller to an agent; the session then gets fresh keys of its own (sent inside the CURVE channel).
* a **job key**: written by a controller for one job (SLURM), holding that session's keys, the
  controller's address and the job's nonce; deleted when the job stops.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the module itself stays free of zmq: importing jupyter_mesh is light
    from .channels import CurveKeys

__all__ = ["KeyFile", "config_dir", "default_key_path", "new_mesh_key", "read_key_file", "write_key_file"]

ENV_CONFIG = "JUPYTER_MESH_CONFIG_DIR"


def config_dir() -> str:
    """``$JUPYTER_MESH_CONFIG_DIR`` or ``~/.jupyter_mesh``: made private (0700) if it is new."""
    path = os.environ.get(ENV_CONFIG) or os.path.join(os.path.expanduser("~"), ".jupyter_mesh")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def default_key_path() -> str:
    return os.path.join(config_dir(), "mesh.key")


class KeyFile:
    """What a key file holds: the signing key, the CURVE keys, and for a job key where to dial."""

    def __init__(self, key: bytes, curve: CurveKeys, extra: dict[str, Any] | None = None):
        self.key = key
        self.curve = curve
        self.extra = dict(extra or {})

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.hex(), "curve": self.curve.to_wire(), **self.extra}


def write_key_file(path: str, kf: KeyFile) -> str:
    """Write ``kf`` to ``path`` (mode 0600, created exclusively: a file already there is replaced only
    if it is ours). The directory must be private too: anyone who can enter it could swap the file."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    _check_private(parent, want_dir=True)
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(kf.to_json(), f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_key_file(path: str) -> KeyFile:
    """Read a key file, refusing one another user could have read or written."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        # O_NONBLOCK: a FIFO (a stray pipe, ``<(cat key)``) would block the open until a writer came;
        # it is then refused by the check below, which looks at what was opened, not at the name
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no key file at {path}: make one with `jupyter-mesh keygen {path}` (for agents you start by "
            f"hand), or pass the job's key file"
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PermissionError(
                f"{path} is a symbolic link: jupyter_mesh reads keys only from a regular file of this user "
                f"(whoever controls the link controls the key); point at the file itself"
            ) from None
        raise
    with os.fdopen(fd) as f:
        _check_private(path, want_dir=False, st=os.fstat(f.fileno()))
        _check_private(os.path.dirname(path), want_dir=True)
        try:
            raw = json.load(f)
            from .channels import CurveKeys

            key = bytes.fromhex(raw.pop("key"))
            keys = raw.pop("curve")
            if not (
                isinstance(keys, list) and len(keys) == 4 and all(isinstance(k, str) and len(k) == 40 for k in keys)
            ):
                raise ValueError("its CURVE keys are not four 40-character Z85 keys")
            curve = CurveKeys.from_wire(keys)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{path} is not a jupyter_mesh key file ({e!r}); make a new one with `jupyter-mesh keygen`"
            ) from None
    if len(key) < 16:
        raise ValueError(f"{path}: its signing key is too short")
    return KeyFile(key, curve, raw)


def new_mesh_key(path: str | None = None, overwrite: bool = False) -> str:
    """Make a mesh key (``jupyter-mesh keygen``); an existing one is kept unless ``overwrite``."""
    path = os.path.abspath(os.path.expanduser(path or default_key_path()))
    if os.path.exists(path) and not overwrite:
        read_key_file(path)  # still check it is private and well formed
        return path
    from .channels import CurveKeys

    return write_key_file(path, KeyFile(secrets.token_bytes(32), CurveKeys.new()))


def _check_private(path: str, want_dir: bool, st: os.stat_result | None = None) -> None:
    st = st or os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    what = "directory" if want_dir else "key file"
    if kind_ok and st.st_uid != os.geteuid():
        raise PermissionError(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): jupyter_mesh uses only keys "
            f"of your own; make one with `jupyter-mesh keygen`"
        )
    if not kind_ok or st.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a private {what} of this user (mode {stat.S_IMODE(st.st_mode):o}, owner {st.st_uid}): "
            f"jupyter_mesh keeps keys only where nobody else can read or replace them; "
            f"`chmod {'700' if want_dir else '600'} {path}`"
        )
