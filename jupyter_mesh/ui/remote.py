"""``jupyter-mesh status``: ask running kernels for their meshes, over the sidebar's comm.

The meshes live in a kernel's controller, not in the terminal's process, so the command connects
to each kernel (its connection file in Jupyter's runtime dir, like ``jupyter console --existing``),
opens a ``jupyter_mesh.sidebar`` comm and renders the snapshot it gets. A kernel without the target
closes the comm at once: it is reported as "not a mesh kernel". A kernel busy with a cell answers
when the cell ends, so each kernel gets a bounded wait.
"""

from __future__ import annotations

import glob
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .sidebar_comm import TARGET
from .wire import MeshWire

__all__ = ["KernelMeshes", "connection_files", "query_kernel", "status_main"]


@dataclass
class KernelMeshes:
    connection_file: str
    kernel: str = ""  # what the kernel says it is ("mesh", "python"); "" when it did not answer
    meshes: list[MeshWire] = field(default_factory=list)
    error: str = ""


def connection_files() -> list[str]:
    """Connection files of the kernels of this user, newest first."""
    from jupyter_core.paths import jupyter_runtime_dir

    files = glob.glob(os.path.join(jupyter_runtime_dir(), "kernel-*.json"))
    return sorted(files, key=os.path.getmtime, reverse=True)


def query_kernel(connection_file: str, timeout: float = 3.0) -> KernelMeshes:
    """The meshes of one kernel (or why there are none), waiting at most ``timeout`` seconds."""
    from jupyter_client import BlockingKernelClient

    out = KernelMeshes(connection_file)
    kc = BlockingKernelClient()
    try:
        kc.load_connection_file(connection_file)
    except (OSError, ValueError) as e:
        out.error = f"cannot read the connection file: {e}"
        return out
    kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    comm_id = uuid.uuid4().hex
    try:
        time.sleep(0.2)  # let the IOPub subscription settle, or the snapshot may go by unseen
        kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": TARGET, "data": {}}))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg: dict[str, Any] = kc.get_iopub_msg(timeout=left)
            except Exception:  # noqa: BLE001 - queue.Empty: no answer in time
                break
            content = msg.get("content", {})
            if content.get("comm_id") != comm_id:
                continue
            if msg["msg_type"] == "comm_close":
                out.error = "not a mesh kernel (start the 'Python 3 (mesh)' kernel or run %load_ext jupyter_mesh.ui)"
                return out
            data = content.get("data", {})
            if msg["msg_type"] == "comm_msg" and data.get("type") == "snapshot":
                out.kernel, out.meshes = data["kernel"], data["meshes"]
                return out
        out.error = f"no answer within {timeout:g} s (the kernel may be busy running a cell)"
        return out
    finally:
        kc.shell_channel.send(kc.session.msg("comm_close", {"comm_id": comm_id, "data": {}}))
        kc.stop_channels()


def status_main(files: list[str] | None = None, timeout: float = 3.0) -> int:
    """Print the meshes of every running kernel (or of ``files``); exit status 0 if any answered."""
    from rich.console import Console
    from rich.text import Text

    from .terminal import render

    console = Console()
    files = files if files is not None else connection_files()
    if not files:
        console.print("no running Jupyter kernel found (looked in the Jupyter runtime dir)", style="yellow")
        return 1
    answered = 0
    for f in files:
        res = query_kernel(f, timeout)
        name = os.path.basename(f)
        if res.error:
            console.print(Text(f"{name}: {res.error}", style="dim"))
            continue
        answered += 1
        console.print(Text(f"{name} ({res.kernel} kernel): {len(res.meshes)} mesh(es)", style="bold"))
        console.print(render(res.meshes))
    return 0 if answered else 1
