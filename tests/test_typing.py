"""Endpoints are typed: mypy (with ``jupyter_mesh.mypy_plugin``) checks calls through a mesh.

Each test writes a snippet, runs ``python -m mypy`` on it against this checkout (no processes, ~5 s
each) and compares mypy's report line by line with the snippet's markers: ``# R: <type>`` for the type
``reveal_type`` must show (module prefixes dropped), ``# E: <code>`` for an error mypy must report on
that line. Every other line must pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]

# with the plugin: every call through the mesh is checked against Trainer's endpoints
TYPED = """
from __future__ import annotations

from collections.abc import Coroutine, Iterator
from typing import Any

from jupyter_mesh import Actor, ActorMesh, Endpoint, Future, ValueMesh, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    def step(self, batch: int, *, scale: float = 1.0) -> str:
        return str(batch * scale)

    @endpoint
    async def loss(self) -> float:
        return self.lr

    def helper(self) -> int:
        local: str = self.step(1, scale=2.0)  # on an instance: the plain method, called here
        pending: Coroutine[Any, Any, float] = self.loss()
        pending.close()
        self.step("one")  # E: arg-type
        self.step.call_one(1)  # E: attr-defined
        return len(local)


procs = this_host().spawn_procs({"gpus": 2})
mesh = procs.spawn("trainers", Trainer, 0.1)
reveal_type(mesh)  # R: ActorMesh[Trainer]
reveal_type(mesh.loss)  # R: MeshEndpoint[[], float]
reveal_type(mesh.step.call_one(1).get())  # R: str

# what the five adverbs give
one: Future[str] = mesh.slice(gpus=0).step.call_one(1)
every: Future[ValueMesh[str]] = mesh.step.call(2, scale=0.5)
chosen: Future[str] = mesh.step.choose(batch=3)
streamed: Iterator[Future[str]] = mesh.step.stream(4)
reveal_type(mesh.step.broadcast(5))  # R: None
awaited: Future[float] = mesh.loss.call_one()  # async def: R is what the coroutine returns
first: str = every.get().item(gpus=0)

# the mesh's own attributes keep their types
ready: Future[None] | None = mesh.initialized
part: ActorMesh[Trainer] = mesh.slice(gpus=slice(0, 1))
size: int = mesh.size("gpus")
name: str = mesh.name

# the descriptor on the class
declared: Endpoint[[], float] = Trainer.loss


def later(m: ActorMesh[Trainer]) -> Future[str]:
    return m.step.call_one(7)


# wrong arguments
mesh.step.call_one("one")  # E: arg-type
mesh.step.call(1, scale="big")  # E: arg-type
mesh.step.stream()  # E: call-arg
mesh.loss.choose(1)  # E: call-arg
mesh.step.broadcast(1, 2)  # E: call-arg
# a wrong use of the result
wrong: int = mesh.step.call_one(1).get()  # E: assignment
mesh.step.call(1).get().item(gpus=0).upper()
mesh.step.call(1).get().item(gpus=0) + 1  # E: operator
# not endpoints
mesh.helper.call_one()  # E: attr-defined
mesh.nothing  # E: attr-defined
mesh.lr  # E: attr-defined
mesh._ref.name
mesh._private  # E: attr-defined
"""

# without the plugin: annotations alone, so endpoints are untyped (never wrongly rejected)
UNTYPED = """
from __future__ import annotations

from jupyter_mesh import Actor, Future, endpoint, this_host


class Trainer(Actor):
    @endpoint
    def step(self, batch: int) -> str:
        return str(batch)


mesh = this_host().spawn_procs({"gpus": 2}).spawn("trainers", Trainer)
reveal_type(mesh.step)  # R: MeshEndpoint[..., Any]
reveal_type(mesh.step.call_one("one"))  # R: Future[Any]
ready: Future[None] | None = mesh.initialized
mesh.slice(gpus="zero")  # E: arg-type
"""

_LINE = re.compile(r"^snippet\.py:(\d+): (error|note): (.*?)(?:  \[([a-z-]+)\])?$")
_QUALIFIED = re.compile(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")


def _mypy(tmp_path: Path, source: str, plugin: bool) -> tuple[dict[int, str], dict[int, set[str]], str]:
    """Run mypy on ``source``: (line -> revealed type, line -> error codes, the whole report)."""
    (tmp_path / "snippet.py").write_text(textwrap.dedent(source).lstrip())
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\n"
        "python_version = 3.11\n"
        "ignore_missing_imports = True\n"
        f"mypy_path = {ROOT}\n"  # this checkout's jupyter_mesh, whatever the venv has installed
        + ("plugins = jupyter_mesh.mypy_plugin\n" if plugin else "")
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MYPYPATH", None)
    cache = str(tmp_path / "cache")
    flags = ["--no-error-summary", "--hide-error-context", "--no-pretty", "--show-error-codes", "--cache-dir", cache]
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), *flags, "snippet.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = out.stdout + out.stderr
    assert out.returncode in (0, 1), report  # 2: mypy itself failed (a crash, a bad config, no plugin)
    revealed: dict[int, str] = {}
    errors: dict[int, set[str]] = {}
    for line in report.splitlines():
        m = _LINE.match(line)
        if m is None:
            assert not line.startswith("snippet.py"), f"unparsed mypy line: {line}\n{report}"
            continue
        lineno, kind, text, code = int(m[1]), m[2], m[3], m[4]
        if kind == "error":
            errors.setdefault(lineno, set()).add(code or "")
        elif text.startswith("Revealed type is "):
            revealed[lineno] = _QUALIFIED.sub(r"\1", text.removeprefix("Revealed type is ").strip('"'))
    return revealed, errors, report


def _expected(source: str) -> tuple[dict[int, str], dict[int, set[str]]]:
    revealed: dict[int, str] = {}
    errors: dict[int, set[str]] = {}
    for lineno, line in enumerate(textwrap.dedent(source).lstrip().splitlines(), 1):
        if "# R: " in line:
            revealed[lineno] = line.split("# R: ", 1)[1].strip()
        if "# E: " in line:
            errors[lineno] = {line.split("# E: ", 1)[1].strip()}
    return revealed, errors


def _check(tmp_path: Path, source: str, plugin: bool) -> None:
    revealed, errors, report = _mypy(tmp_path, source, plugin)
    want_revealed, want_errors = _expected(source)
    assert revealed == want_revealed, report
    assert errors == want_errors, report


def test_mesh_endpoints_are_typed(tmp_path: Path) -> None:
    """Right calls pass with the endpoint's result type; wrong arguments, a wrong use of the result, and
    attributes that are no endpoints are errors, on their lines."""
    _check(tmp_path, TYPED, plugin=True)


def test_without_the_plugin_endpoints_are_any(tmp_path: Path) -> None:
    """Without the plugin a mesh's endpoints are ``MeshEndpoint[..., Any]``: nothing checked, nothing
    wrongly rejected; the mesh's own methods are still checked."""
    _check(tmp_path, UNTYPED, plugin=False)
