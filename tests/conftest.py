from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# Templates preload nothing unless a test asks (tests/test_warm.py turns it on): torch imported by every
# LocalJob's template would cost this 2-core machine seconds per job. Kernels and scripts started by
# the tests inherit it.
os.environ.setdefault("JUPYTER_MESH_WARM", "0")

from _procs import descendants, wait_dead

PROC_PREFIXES = ("jupyter_mesh._runtime",)


@pytest.fixture(scope="session", autouse=True)
def recorded_faults():
    """Like a kernel: record unhandled failures instead of failing fast, so one test's deliberate
    kill does not raise in the next test (fail-fast itself is tested in a subprocess)."""
    import jupyter_mesh.lowlevel

    seen = []
    prev = jupyter_mesh.lowlevel.set_fault_hook(seen.append)
    yield seen
    jupyter_mesh.lowlevel.set_fault_hook(prev)


@pytest.fixture(scope="session", autouse=True)
def session_dirs_swept():
    """Programs the tests kill (kill -9 of a controller, a killed kernel) leave their private socket
    directory behind; the next controller sweeps it. At the end of the run nothing of ours is left."""
    yield
    from jupyter_mesh._wire import channels

    channels.sweep_stale_dirs()
    base = channels._base()
    left = [n for n in os.listdir(base) if n.startswith("jupyter-mesh-")]
    live = [n for n in left if channels._locked(os.path.join(base, n))]
    assert left == live, f"session directories left with no live controller: {sorted(set(left) - set(live))}"


@pytest.fixture(scope="session")
def host():
    """One local host mesh for the whole session (its agent and template start once)."""
    from jupyter_mesh import this_host
    from jupyter_mesh._runtime.controller import Controller

    h = this_host()
    yield h
    me = os.getpid()
    before = descendants(me)
    Controller.get().shutdown()
    left = wait_dead(before, 5.0)
    assert not left, f"processes left after controller shutdown: {sorted(left)}"


@pytest.fixture
def procs(host):
    """A fresh 4-proc mesh per test, stopped after it; every proc must be gone afterwards."""
    pm = host.spawn_procs(per_host={"gpus": 4})
    pids = set(pm.pids().values())
    yield pm
    pm.stop(timeout=5)
    left = wait_dead(pids, 5.0)
    assert not left, f"procs leaked: {sorted(left)}"
