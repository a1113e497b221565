"""A real kernel through jupyter_client, with every IOPub message kept (comm traffic from background
threads has no reliable parent, so nothing may be dropped by msg_id matching)."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable
from typing import Any

from _procs import descendants, wait_dead
from jupyter_client.manager import start_new_kernel


class Kernel:
    def __init__(self, kernel_name: str = "python3", **kw: Any):
        self.km, self.kc = start_new_kernel(kernel_name=kernel_name, startup_timeout=60, **kw)
        self.iopub: list[dict[str, Any]] = []

    def _drain(self, timeout: float) -> dict[str, Any] | None:
        try:
            msg = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None
        self.iopub.append(msg)
        return msg

    def execute(self, code: str, timeout: float = 60) -> str:
        """Run ``code``; returns its stdout; raises with the traceback if it failed."""
        msg_id = self.kc.execute(code)
        deadline = time.monotonic() + timeout
        out, error = [], None
        while time.monotonic() < deadline:
            msg = self._drain(max(0.01, deadline - time.monotonic()))
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            c = msg["content"]
            if msg["msg_type"] == "stream" and c["name"] == "stdout":
                out.append(c["text"])
            elif msg["msg_type"] == "error":
                error = "\n".join(c["traceback"])
            elif msg["msg_type"] == "status" and c["execution_state"] == "idle":
                break
        else:
            raise TimeoutError(f"no idle after {timeout} s running {code!r}")
        if error:
            raise AssertionError(f"cell failed: {code!r}\n{error}")
        return "".join(out)

    def comm_open(self, target: str, data: dict[str, Any] | None = None) -> str:
        comm_id = uuid.uuid4().hex
        self.kc.shell_channel.send(
            self.kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": target, "data": data or {}})
        )
        return comm_id

    def comm_send(self, comm_id: str, data: dict[str, Any]) -> None:
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))

    def comm_msgs(self, comm_id: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["content"].get("comm_id") == comm_id]

    def sidebar_mesh(self, comm_id: str, name: str) -> dict[str, Any] | None:
        """The latest view of mesh ``name`` on a sidebar channel (None once removed)."""
        latest = None
        for m in self.comm_msgs(comm_id):
            d = m["content"].get("data", {})
            if d.get("type") in ("snapshot", "update"):
                for mesh in d["meshes"]:
                    if mesh["name"] == name:
                        latest = mesh
                if latest is not None and latest["mesh_id"] in d.get("removed", []):
                    latest = None
        return latest

    def wait(self, pred: Callable[[], Any], timeout: float) -> Any:
        """Read IOPub until ``pred()`` is true (returns its value) or ``timeout`` runs out (returns it falsy)."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v or time.monotonic() >= deadline:
                return v
            self._drain(min(0.05, max(0.0, deadline - time.monotonic())))

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    def shutdown_reaped(self) -> set[int]:
        """Shut down; the kernel's processes (it and everything below it) still alive 10 s later."""
        pid = self.km.provisioner.process.pid  # type: ignore[union-attr]
        below = descendants(pid) | {pid}
        self.shutdown()
        return wait_dead(below, 10)
