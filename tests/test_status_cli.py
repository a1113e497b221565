"""``jupyter-mesh status`` against a real Jupyter server and its kernels: a kernel busy in a cell is
listed with its meshes, named by its notebook; a kernel without a mesh only with ``--all``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from _kernel import isolate_jupyter_dirs
from _procs import descendants, wait_dead, wait_for

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A jupyter_server of this user, with a token; sessions (notebook -> kernel) through its REST API."""

    def __init__(self, root: str):
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{_free_port()}"
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--allow-root"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        assert wait_for(self._up, 60.0), "the Jupyter server did not come up"

    def _up(self) -> bool:
        try:
            self.api("GET", "/api/status")
            return True
        except OSError:
            return False

    def api(self, method: str, path: str, body: dict | None = None) -> object:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = resp.read()
        return json.loads(data) if data else None

    def session(self, path: str, kernel: str) -> str:
        """Open ``path`` on a new kernel; returns the kernel id."""
        out = self.api("POST", "/api/sessions", {"path": path, "type": "notebook", "kernel": {"name": kernel}})
        assert isinstance(out, dict)
        return out["kernel"]["id"]

    def stop(self) -> set[int]:
        below = descendants(self.proc.pid) | {self.proc.pid}
        self.proc.send_signal(signal.SIGINT)  # the server asks to confirm on one ^C: a second stops it
        time.sleep(0.2)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return wait_dead(below, 10.0)


def _ready(connection_file: str, timeout: float):
    """A client of the kernel of ``connection_file``, once it answers. A client connecting before the
    kernel bound its heartbeat takes it for dead (jupyter_client's heartbeat starts out "beating", and
    one missed ping within 1 s says "died"): the mesh kernel, slower to start on a loaded machine, is
    asked again with a fresh client."""
    from jupyter_client import BlockingKernelClient

    deadline = time.monotonic() + timeout
    while True:
        kc = BlockingKernelClient(connection_file=connection_file)
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            return kc
        except RuntimeError:
            kc.stop_channels()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_mesh.cli", "status", "--timeout", "5", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def _started(kc, msg_id: str, timeout: float) -> bool:
    """Wait (at most ``timeout``) until the kernel says it runs cell ``msg_id``."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            m = kc.get_iopub_msg(timeout=left)
        except Exception:  # noqa: BLE001 - queue.Empty
            return False
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "execute_input":
            return True
    return False


def test_status_sees_a_busy_kernel_by_its_notebook_and_hides_kernels_without_meshes(tmp_path):
    from jupyter_core.paths import jupyter_runtime_dir

    isolate_jupyter_dirs()
    (tmp_path / "exp").mkdir()
    server = Server(str(tmp_path))
    kc = None
    try:
        mesh_id = server.session("exp/train.ipynb", "mesh")
        server.session("plain.ipynb", "python3")
        kc = _ready(os.path.join(jupyter_runtime_dir(), f"kernel-{mesh_id}.json"), 60.0)
        reply = kc.execute_interactive("%mesh up --procs 2 --name trainers", timeout=60)
        assert reply["content"]["status"] == "ok"
        msg_id = kc.execute("import time; time.sleep(30)")  # the shell is busy from now on
        assert _started(kc, msg_id, 10.0), "the cell did not start"

        res = _status()
        out = res.stdout
        assert res.returncode == 0, res.stdout + res.stderr
        assert "exp/train.ipynb (mesh kernel): 1 mesh(es)" in out, out
        assert "trainers" in out and "2 idle" in out, out
        assert "plain.ipynb" not in out and "1 kernel(s) without a mesh not shown" in out, out

        listed = _status("--all").stdout
        assert "exp/train.ipynb" in listed and "plain.ipynb: no jupyter_mesh in this kernel" in listed, listed
    finally:
        if kc is not None:
            kc.stop_channels()
        left = server.stop()
    assert not left, f"processes left after the server stopped: {sorted(left)}"
