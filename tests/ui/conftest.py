"""A real JupyterLab server (temp dirs, token, free port) and Debian's Chromium driven by Playwright.

Runs in its own pytest invocation (``make test`` does both). Every wait is bounded; the server, its
kernels and their meshes, and the browser are gone when the session ends.

The sidebar is the one built in the checkout under test (``jupyter_mesh/labextension``, from ``npm run
build:labextension``) when there is one: an editable install copies the built extension into the
environment once, so without this a test would drive whatever was built when the venv was made.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from _procs import descendants, wait_dead

CHROMIUM = os.environ.get("JUPYTER_MESH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


@dataclass
class Lab:
    url: str
    token: str
    root: Path

    def api(self, path: str) -> object:
        req = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    base = tmp_path_factory.mktemp("lab")
    root, settings = base / "root", base / "settings" / "@jupyterlab" / "apputils-extension"
    root.mkdir()
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    data = base / "data"  # first on JupyterLab's extension path: the checkout's build wins over the installed one
    built = Path(__file__).resolve().parents[2] / "jupyter_mesh" / "labextension"
    if (built / "package.json").is_file():
        shutil.copytree(built, data / "labextensions" / "jupyter-mesh")
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_PATH": str(data),  # searched first (JUPYTER_DATA_DIR comes after the venv's own)
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "ws"),
    }
    log = open(base / "server.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--allow-root",
            "--LabApp.expose_app_in_browser=True",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    deadline = time.monotonic() + 60
    while True:
        try:
            lab.api("/api/status")
            break
        except OSError as e:
            if server.poll() is not None or time.monotonic() > deadline:
                log.close()
                raise RuntimeError("jupyter lab did not start:\n" + (base / "server.log").read_text()[-3000:]) from e
            time.sleep(0.2)
    yield lab
    below = descendants(server.pid)  # kernels, their agents and procs
    server.send_signal(signal.SIGINT)  # the server shuts its kernels down
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(5)
    log.close()
    left = wait_dead(below, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left after the server stopped: {sorted(left)}"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield b
    b.close()
    pw.stop()


@pytest.fixture
def page(browser, lab):
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = ctx.new_page()
    p.set_default_timeout(30_000)
    yield p
    ctx.close()
