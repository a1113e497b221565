"""``jupyter-mesh status``: the meshes of the running kernels, asked over each kernel's control channel.

The meshes live in a kernel's controller, not in the terminal's process, so the command connects to
each kernel (its connection file in Jupyter's runtime dir, like ``jupyter console --existing``) and
sends a ``jupyter_mesh_status_request`` on the **control** channel. ipykernel serves that channel on a
thread of its own, so a kernel busy running a cell answers at once (the shell channel, which comms
use, waits for the cell to end). Why not a state file the controller keeps current, or a socket of
our own: the control channel is there already, and only a holder of the kernel's key (its 0600
connection file) can sign a request; nothing new listens, nothing is written that could go stale.

A kernel that does not know the request (no ``jupyter_mesh`` loaded) sends no reply; the command
follows it with a ``kernel_info_request`` on the same channel, which every kernel answers, in order:
when that answer comes first, the kernel has no meshes to tell. Kernels are named by their notebook
when a Jupyter server of this user (its ``jpserver-*.json`` in the runtime dir) knows them.
"""

from __future__ import annotations

import glob
import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .wire import MeshWire

__all__ = ["REQUEST", "KernelMeshes", "connection_files", "notebook_names", "query_kernel", "serve", "status_main"]

REQUEST = "jupyter_mesh_status_request"
REPLY = "jupyter_mesh_status_reply"


# -- the kernel's end ------------------------------------------------------------------------------
def serve(kernel: Any, name: str) -> None:
    """Answer ``jupyter-mesh status`` on ``kernel``'s control channel (its thread, not the shell's)."""

    def handle(stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        from .hub import hub

        try:
            content: dict[str, Any] = {"status": "ok", "kernel": name, "meshes": hub().meshes()}
        except Exception as e:  # noqa: BLE001 - say it to the asker, keep the kernel
            content = {"status": "error", "kernel": name, "meshes": [], "error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, REPLY, content, parent, ident)

    kernel.control_handlers[REQUEST] = handle


# -- the command's end -----------------------------------------------------------------------------
@dataclass
class KernelMeshes:
    connection_file: str
    kernel: str = ""  # what the kernel says it is ("mesh", "python"); "" when it did not answer
    meshes: list[MeshWire] = field(default_factory=list)
    error: str = ""
    notebook: str = ""  # the notebook's path, when a Jupyter server says which one runs this kernel

    @property
    def title(self) -> str:
        return self.notebook or os.path.basename(self.connection_file)


def connection_files() -> list[str]:
    """Connection files of the kernels of this user, newest first."""
    from jupyter_core.paths import jupyter_runtime_dir

    files = glob.glob(os.path.join(jupyter_runtime_dir(), "kernel-*.json"))
    return sorted(files, key=os.path.getmtime, reverse=True)


def _kernel_id(connection_file: str) -> str:
    base = os.path.basename(connection_file)
    return base[len("kernel-") : -len(".json")] if base.startswith("kernel-") and base.endswith(".json") else ""


def notebook_names(timeout: float = 1.0) -> dict[str, str]:
    """Kernel id -> notebook path, from every Jupyter server of this user that answers (``/api/sessions``)."""
    from jupyter_core.paths import jupyter_runtime_dir

    names: dict[str, str] = {}
    for info_file in glob.glob(os.path.join(jupyter_runtime_dir(), "jpserver-*.json")):
        try:
            with open(info_file) as f:
                info = json.load(f)
            os.kill(int(info["pid"]), 0)  # a file left by a server that is gone
            req = urllib.request.Request(
                info["url"].rstrip("/") + "/api/sessions", headers={"Authorization": f"token {info.get('token', '')}"}
            )
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # the user's own server, from its own file
                sessions = json.load(resp)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not running, not reachable, or it wants a password: name by connection file
        for s in sessions:
            kid, path = (s.get("kernel") or {}).get("id"), s.get("path") or s.get("name")
            if kid and path:
                names[kid] = path
    return names


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
    kc.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        ask = kc.session.msg(REQUEST, {})
        kc.control_channel.send(ask)
        info = kc.session.msg("kernel_info_request", {})
        kc.control_channel.send(info)  # answered after ours: if it comes first, ours is unknown there
        try:
            while True:
                msg: dict[str, Any] = kc.control_channel.get_msg(timeout=timeout)
                parent = msg.get("parent_header", {}).get("msg_id")
                if parent == ask["header"]["msg_id"] and msg["msg_type"] == REPLY:
                    content = msg["content"]
                    out.kernel, out.meshes, out.error = (
                        content.get("kernel", ""),
                        content["meshes"],
                        content.get("error", ""),
                    )
                    return out
                if parent == info["header"]["msg_id"]:
                    out.kernel = msg["content"].get("implementation", "")
                    out.error = "no jupyter_mesh in this kernel (the 'Python 3 (mesh)' kernel has it; or %load_ext jupyter_mesh)"
                    return out
        except Exception:  # noqa: BLE001 - queue.Empty: no answer in time
            out.error = f"no answer within {timeout:g} s (the kernel may be gone: its connection file is left over)"
            return out
    finally:
        kc.stop_channels()


def scheduler_jobs() -> list[str]:
    """One line per scheduler job a controller of this user holds (``SlurmJob`` and ``TorchXJob`` keep
    a record under the config dir while they run): its id, hosts, the controller's pid, whether it is
    kept alive past its kernel, and for SLURM what ``squeue`` says (a TorchX ``local_cwd`` app is known
    only to its controller's runner)."""
    import glob
    import json
    import shutil
    import subprocess

    from .._wire.keyfile import config_dir

    lines = []
    for path in sorted(glob.glob(os.path.join(config_dir(), "jobs", "*.json"))):
        try:
            with open(path) as f:
                rec = json.load(f)
            if rec.get("job_id") is None:
                continue  # being submitted
            job_id, pid = str(rec["job_id"]), int(rec["controller_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        kept = bool(rec.get("keep_alive"))
        try:
            os.kill(pid, 0)
            owner = f"controller pid {pid}" + ("; kept alive past its kernel" if kept else "")
        except ProcessLookupError:
            owner = f"controller pid {pid} is gone: " + (
                "kept alive past its kernel, it runs on" if kept else "the job ends when its agents notice"
            )
        except PermissionError:
            owner = f"controller pid {pid}" + ("; kept alive past its kernel" if kept else "")
        state = ""
        if rec.get("scheduler") == "slurm" and shutil.which("squeue"):
            try:
                out = subprocess.run(
                    ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=5
                ).stdout.strip()
                state = out or "not in the queue"
            except (OSError, subprocess.TimeoutExpired):
                state = ""
        hosts = ", ".join(rec.get("hosts") or []) or "agents not up yet"
        lines.append(
            f"{rec.get('scheduler', 'job')} job {job_id}: {rec.get('nodes')} host(s) ({hosts}); {owner}"
            + (f"; {state}" if state else "")
        )
    return lines


def status_main(files: list[str] | None = None, timeout: float = 3.0, show_all: bool = False) -> int:
    """Print the meshes of every running kernel (or of ``files``); exit status 0 if any has a mesh
    (with ``show_all``: if any answered). Kernels without a mesh are counted, listed with ``show_all``."""
    from rich.console import Console
    from rich.text import Text

    from .terminal import render

    console = Console()
    for line in scheduler_jobs():
        console.print(Text(line, style="bold"))
    files = files if files is not None else connection_files()
    if not files:
        console.print("no running Jupyter kernel found (looked in the Jupyter runtime dir)", style="yellow")
        return 1
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        names = pool.submit(notebook_names)
        results = list(pool.map(lambda f: query_kernel(f, timeout), files))
        by_id = names.result()
    for res in results:
        res.notebook = by_id.get(_kernel_id(res.connection_file), "")
    shown = [r for r in results if r.meshes or (show_all and (r.kernel or r.error))]
    for res in shown:
        if not res.meshes:
            console.print(Text(f"{res.title}: {res.error or 'no mesh'}", style="dim"))
            continue
        kind = f" ({res.kernel} kernel)" if res.kernel else ""
        console.print(Text(f"{res.title}{kind}: {len(res.meshes)} mesh(es)", style="bold"))
        console.print(render(res.meshes))
    hidden = len(results) - len(shown)
    if hidden:
        console.print(Text(f"{hidden} kernel(s) without a mesh not shown (--all lists them)", style="dim"))
    if not any(r.meshes for r in results) and not show_all:
        console.print("no kernel has a mesh", style="yellow")
    return 0 if any(r.meshes for r in results) or (show_all and any(r.kernel for r in results)) else 1
