"""Starting a real `mesh` kernel through jupyter_client and running cells on it (every wait bounded)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import queue
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from _procs import descendants, wait_dead


def isolate_jupyter_dirs() -> None:
    """Keep tests away from the user's Jupyter config, data and runtime dirs (the kernelspec installed
    in the venv's share/jupyter stays visible)."""
    base = tempfile.mkdtemp(prefix="jm-jupyter-")
    atexit.register(shutil.rmtree, base, ignore_errors=True)  # the kernels using it are gone by then
    for var in ("JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        os.environ[var] = os.path.join(base, var.lower())


@dataclass
class Cell:
    reply: dict[str, Any]
    msg_id: str
    msgs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def stream(self, name: str | None = None) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.msgs
            if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name)
        )

    @property
    def result(self) -> str | None:
        for m in self.msgs:
            if m["msg_type"] == "execute_result":
                return m["content"]["data"]["text/plain"]
        return None

    @property
    def error(self) -> dict[str, Any] | None:
        for m in self.msgs:
            if m["msg_type"] == "error":
                return m["content"]
        return None


class Kernel:
    def __init__(self, name: str = "mesh"):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name=name, startup_timeout=60)
        self.pid: int = self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 60.0) -> Cell:
        msgs: list[dict[str, Any]] = []
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
        return Cell(reply, reply["parent_header"]["msg_id"], msgs)

    def ok(self, code: str, timeout: float = 60.0) -> Cell:
        cell = self.run(code, timeout)
        assert cell.status == "ok", f"cell failed: {cell.error and cell.error['evalue']}\n{cell.stream()}"
        return cell

    def debug_request(self, content: Any, timeout: float = 30, raw: bool = False) -> dict[str, Any]:
        """What the sidebar sends on the control channel: the reply's content. ``raw``: ``content`` goes
        packed as-is (jupyter_client's ``msg`` only takes a dict; a raw client need not)."""
        msg = self.kc.session.msg("jupyter_mesh_debug_request", {} if raw else content)
        if raw:
            msg["content"] = json.dumps(content).encode()
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["msg_type"] == "jupyter_mesh_debug_reply"
                return dict(reply["content"])
        raise AssertionError(f"no answer to {content!r} within {timeout} s")

    def workers(self) -> set[int]:
        return descendants(self.pid)

    def shutdown(self, now: bool = False) -> set[int]:
        """Shut the kernel down; returns the processes below it that are still alive 5 s later."""
        before = self.workers()
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=now)
        # jupyter_client leaves private event loops and sockets to the garbage collector: collect
        # them now, inside the test (whose marks say which warnings to ignore), not at the session's end
        gc.collect()
        return wait_dead(before, 5.0)


def mesh_kernel(actors: str) -> Iterator[Kernel]:
    """For a module fixture: a kernel with a 4-proc ``%mesh up`` mesh and ``actors`` (a cell) run in
    it; on the way out, its shutdown must leave no process."""
    isolate_jupyter_dirs()
    k = Kernel()
    k.ok("%mesh up --gpus 4")
    k.ok(actors)
    yield k
    assert not k.shutdown(), "processes left after the kernel shut down"


@contextlib.contextmanager
def fresh_kernel() -> Iterator[Kernel]:
    """A `mesh` kernel in Jupyter dirs of its own (environment variables set before this are its own);
    on the way out, its shutdown must leave no process."""
    isolate_jupyter_dirs()
    k = Kernel()
    try:
        yield k
    finally:
        assert not k.shutdown(), "processes left after the kernel shut down"
