"""Fixtures for multi-host tests: 4 namespace hosts (`netns_hosts`) and a real SLURM over them (`slurm`).

Both are module-scoped: set-up is well under a second, and the daemons (children of pytest) must not
outlive the cluster tests into tests that count this process's children or sockets. SLURM state carries
across the tests of a module, so each test must leave no job behind (checked after every test that uses
`slurm`). Everything under
tests/cluster is marked ``cluster``: ``pytest -m cluster`` runs them alone, ``-m "not cluster"`` skips.

Outside CI the tests skip with the reason when the machine cannot run them (not root, no `ip netns`, no
slurm-wlm/munge: ``make cluster``). With ``CI=true`` they fail instead: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import netns
import pytest
import slurm as slurm_mod

N_HOSTS = 4
_TIMINGS: list[tuple[str, float]] = []
_HERE = os.path.dirname(os.path.abspath(__file__))


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _missing_prerequisite(need_slurm: bool) -> str | None:
    if os.geteuid() != 0:
        return "cluster tests need root (network namespaces, veths, slurmd); run them as root"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "cluster tests need iproute2 (`ip`) and util-linux (`nsenter`)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return f"`ip netns list` failed: {r.stderr.strip()} (this kernel or container has no network namespaces)"
    if need_slurm:
        missing = slurm_mod.missing_binaries()
        if missing:
            return f"SLURM/munge programs missing: {missing}; install them with `make cluster` (apt slurm-wlm munge)"
    return None


def _require(need_slurm: bool) -> None:
    problem = _missing_prerequisite(need_slurm)
    if problem is None:
        return
    if _in_ci():
        pytest.fail(f"CI=true and the cluster tests cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.path).startswith(_HERE + os.sep):
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter) -> None:
    if _TIMINGS:
        terminalreporter.write_sep("-", "cluster fixtures")
        for what, seconds in _TIMINGS:
            terminalreporter.write_line(f"{what}: {seconds:.2f} s")


@pytest.fixture(scope="module")
def netns_hosts():
    """4 namespace hosts jmh0..jmh3 at 10.213.0.2..5 on bridge jmbr0 (10.213.0.1, the root namespace)."""
    _require(need_slurm=False)
    hosts = netns.Hosts(N_HOSTS)
    hosts.setup()
    _TIMINGS.append((f"netns_hosts set-up ({N_HOSTS} hosts)", hosts.setup_s))
    try:
        yield hosts
    finally:
        hosts.teardown()
        _TIMINGS.append(("netns_hosts teardown", hosts.teardown_s))
    left = netns.ours()
    assert not left["namespaces"] and not left["links"], f"namespace hosts left after teardown: {left}"


@pytest.fixture(scope="module")
def slurm(netns_hosts):
    """A real SLURM: nodes n0..n3 (n<i> on jmh<i>), partition debug; use `.run([...])` or `.environ()`."""
    _require(need_slurm=True)
    cluster = slurm_mod.SlurmCluster(netns_hosts)
    cluster.start()
    _TIMINGS.append((f"slurm set-up (munged, slurmctld, {N_HOSTS} slurmd, nodes idle)", cluster.setup_s))
    marker = cluster.dir
    try:
        yield cluster
    finally:
        cluster.stop()
        _TIMINGS.append(("slurm teardown (scancel, daemons stopped)", cluster.teardown_s))
    left = slurm_mod.daemons_of(marker, [h.name for h in netns_hosts])
    assert not left, f"SLURM/munge daemons left after teardown: {left}"
    assert not os.path.exists(marker), f"SLURM temp dir left after teardown: {marker}"


@pytest.fixture(autouse=True)
def _leaves_cluster_clean(request):
    """After each test: no host still cut off, no SLURM job still queued or running (both are undone,
    so the next test starts clean, and the test that left them fails)."""
    yield
    problems = []
    if "netns_hosts" in request.fixturenames:
        hosts = request.getfixturevalue("netns_hosts")
        for h in hosts:
            if hosts.is_cut(h):
                hosts.heal(h)
                problems.append(f"host {h.name} ({h.ip}) left cut off (healed now)")
    if "slurm" in request.fixturenames:
        cluster = request.getfixturevalue("slurm")
        deadline = time.monotonic() + 10.0  # a job the test cancelled may still be COMPLETING
        while (jobs := cluster.job_ids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if jobs:
            cluster.cancel_all()
            problems.append(f"SLURM jobs {jobs} left queued or running (cancelled now)")
    assert not problems, "; ".join(problems)


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    """A private config dir with a fresh mesh key, for this test's controllers and agents."""
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(d))
    subprocess.run([sys.executable, "-m", "jupyter_mesh.cli", "keygen"], check=True, timeout=60, capture_output=True)
    return d
