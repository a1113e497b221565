"""Warm by default: a local host's fork server preloads torch (when installed) from the moment the host
exists, the ``mesh`` kernel starts its host at kernel start, and none of it outlives its owner.

The rest of the suite runs with ``JUPYTER_MESH_WARM=0`` (conftest); these tests turn it on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
from _procs import alive, descendants, open_pipes, wait_dead, wait_for

from jupyter_mesh import LocalJob
from jupyter_mesh.config import configured
from jupyter_mesh.jobs import warm

pytestmark = pytest.mark.integration

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
torch_installed = warm._installed("torch")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def templates(pid: int) -> list[int]:
    """The fork servers below ``pid`` (their procs, forked, show the same command line)."""
    mark = "jupyter_mesh._runtime.template"
    return [p for p in descendants(pid) if mark in _cmdline(p) and mark not in _cmdline(_ppid(p))]


def fork_servers(pid: int) -> list[int]:
    """Before any proc is forked: the fork servers below ``pid``, a template and its warm child."""
    return [p for p in descendants(pid) if "jupyter_mesh._runtime.template" in _cmdline(p)]


def has_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (TESTS, ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# -- what is preloaded --------------------------------------------------------------------------------
def test_default_preload_is_torch_when_installed_plus_heavy_libraries_already_imported(monkeypatch):
    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    monkeypatch.setitem(sys.modules, "pandas", types.ModuleType("pandas"))
    got = warm.default_preload()
    assert "pandas" in got
    assert ("torch" in got) == torch_installed
    assert "IPython" not in got and "zmq" not in got  # only libraries safe to fork after


@pytest.mark.parametrize("how", ["env", "configure"])
def test_warm_can_be_turned_off(monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("JUPYTER_MESH_WARM", "0")
        assert warm.default_preload() == []
    else:
        monkeypatch.delenv("JUPYTER_MESH_WARM")
        with configured(warm=False):
            assert warm.default_preload() == []
        assert warm.enabled()


def test_asking_whether_torch_is_installed_does_not_import_it():
    code = "import sys, jupyter_mesh; from jupyter_mesh.jobs import warm; warm.default_preload(); print(sorted(m for m in ('torch', 'numpy', 'zmq', 'IPython') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(JUPYTER_MESH_WARM="1")
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- a script's first spawn ---------------------------------------------------------------------------
@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("warm_on", [True, False])
def test_the_first_spawn_forks_from_a_template_that_preloaded_torch_unless_opted_out(monkeypatch, warm_on):
    monkeypatch.setenv("JUPYTER_MESH_WARM", "1" if warm_on else "0")
    job = LocalJob(1)  # no preload named: the default
    try:
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120)
        agent = job.pids()[0]
        (template,) = templates(agent)
        assert not has_torch(template)  # warm imports are its warm child's, the template forks on meanwhile
        from warm_actors import Probe

        infos = list(procs.spawn("probe", Probe).info.call().get(60).values())
        # forked by the host's template (cold), or by its warm child
        assert all((ppid if not warm_on else _ppid(ppid)) == template for ppid, _ in infos), (infos, template)
        assert all(has_torch(ppid) == warm_on for ppid, _ in infos)
        assert all(had == warm_on for _, had in infos)  # torch was there before the actor's own code
        procs.stop()
    finally:
        job.stop()


@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("how", ["preload", "warm"])
def test_procs_forked_from_one_template_draw_different_random_numbers(monkeypatch, how):
    """Forked procs would share the template's generator state: the same "random" draws, the same
    data order and dropout masks on every rank. Procs must seed as separately started processes (Monarch's)
    do: Python's, numpy's and torch's CPU generator, forked by the template (a named preload) or by its
    warm child."""
    from warm_actors import Draws

    if how == "warm":
        monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
        job = LocalJob(1, env={"PYTHONPATH": _env()["PYTHONPATH"]})
    else:
        job = LocalJob(1, preload=["numpy", "torch"])
    try:
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 3}, timeout=120)
        draws = list(procs.spawn("draws", Draws).draw.call().get(60).values())
        python, numpy, torch = zip(*draws, strict=True)
        assert len(set(python)) == 3 and len(set(numpy)) == 3 and len(set(torch)) == 3, draws
        procs.stop()
    finally:
        job.stop()


@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("how", ["warm", "preload", "cold", "opted out"])
def test_a_procs_full_collection_leaves_its_templates_objects_and_pages_alone(monkeypatch, how):
    """A forked proc shares its template's pages until it writes them; a full collection used to walk
    (and so write to) every object the template had: with torch, 80 ms and ~40 MiB made private per
    proc, ~10 GiB at 256 procs. The template freezes what it holds before it forks (``gc.freeze``),
    unless ``JUPYTER_MESH_GC_FREEZE=0`` (cycles among its objects are then collected in procs again)."""
    from warm_actors import Collector

    monkeypatch.setenv("JUPYTER_MESH_WARM", "0" if how == "cold" else "1")
    env = {"JUPYTER_MESH_GC_FREEZE": "0"} if how == "opted out" else None
    job = LocalJob(1, preload=["torch"] if how == "preload" else None, env=env)
    try:
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120)
        types = ["zmq.Socket", "jupyter_mesh._runtime.proc.main"] + ([] if how == "cold" else ["torch.Tensor"])
        for grown, walked in procs.spawn("c", Collector).full_collection.call(types).get(60).values():
            assert walked == dict.fromkeys(types, how == "opted out"), walked
            if how in ("warm", "preload"):
                assert grown < 10, f"a full collection made {grown:.1f} MiB of the template's pages private"
        procs.stop()
    finally:
        job.stop()


# -- a fork server that dies ----------------------------------------------------------------------------
def _slow_job(flag: str) -> LocalJob:
    return LocalJob(
        1, preload=["slow_warm_import"], env={"PYTHONPATH": _env()["PYTHONPATH"], "JM_SLOW_IMPORT_FLAG": flag}
    )


def test_a_fork_server_killed_during_a_spawn_fails_it_clearly_and_the_next_spawn_works(tmp_path):
    flag = tmp_path / "slow"
    flag.write_text("")
    job = _slow_job(str(flag))
    try:
        agent = job.agents(60)[0].pid
        assert wait_for(lambda: templates(agent), 30), "no fork server started"
        result: dict[str, object] = {}
        th = _spawn_in_background(job, 2, result)
        deadline, killed = time.monotonic() + 30, set()
        while th.is_alive() and time.monotonic() < deadline:  # kill every template it may wait on
            for t in templates(agent):
                os.kill(t, signal.SIGKILL)
                killed.add(t)
            th.join(0.3)
        assert not th.is_alive(), "the spawn hung after its fork server was killed"
        err = result.get("err")
        assert err is not None and "fork server" in str(err), f"not a clear error: {err!r}"
        flag.unlink()  # the new template finishes its preload now
        # the loop may have killed one more, restarted after the spawn failed: a spawn asked during the
        # crash loop's pause fails at once with its cause (by design); the next one is after it
        assert wait_for(lambda: [t for t in templates(agent) if t not in killed and alive(t)], 30)
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=60)
        from warm_actors import Probe

        assert len(list(procs.spawn("probe", Probe).info.call().get(60).values())) == 2
        procs.stop()
    finally:
        flag.unlink(missing_ok=True)
        job.stop()


def test_a_fork_server_busy_preloading_dies_with_its_agent(tmp_path):
    flag = tmp_path / "slow"
    flag.write_text("")
    job = _slow_job(str(flag))
    try:
        agent = job.agents(60)[0].pid
        tmpl = wait_for(lambda: templates(agent), 30)
        assert tmpl
        os.kill(agent, signal.SIGKILL)
        assert not wait_dead(tmpl, 10.0), "the template outlived its agent while importing"
    finally:
        flag.unlink(missing_ok=True)
        job.stop()


WARM_SCRIPT = """
import json, sys, time
from jupyter_mesh import this_host
host = this_host()
print(json.dumps(host._job.pids()), flush=True)
time.sleep(120)
"""


def test_kill_9_of_a_script_leaves_no_agent_or_warming_template():
    p = subprocess.Popen(
        [sys.executable, "-c", WARM_SCRIPT], stdout=subprocess.PIPE, text=True, env=_env(JUPYTER_MESH_WARM="1")
    )
    try:
        (agent,) = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        assert wait_for(lambda: templates(agent), 30), "no fork server started"
        below = descendants(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        assert not wait_dead(below, 10.0), "the agent or its template outlived a kill -9 of the script"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        p.stdout.close()  # type: ignore[union-attr]


# -- the kernel -----------------------------------------------------------------------------------------
PROBE_CELL = """
import os, sys
from jupyter_mesh import Actor, endpoint, this_host

class Probe(Actor):
    def __init__(self):
        self.had_torch = "torch" in sys.modules

    @endpoint
    def info(self):
        return os.getppid(), self.had_torch

procs = this_host().spawn_procs(per_host={"gpus": 2})
print(sorted(set(procs.spawn("probe", Probe).info.call().get(60).values())))
"""


@pytest.mark.kernel
@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
def test_the_mesh_kernel_starts_a_warm_template_at_kernel_start(monkeypatch):
    from _kernel import fresh_kernel

    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    with fresh_kernel() as k:
        # no cell has run: the kernel started its host, and its template's warm child preloads torch
        tmpl = wait_for(lambda: [t for t in fork_servers(k.pid) if has_torch(t)], 120, interval=0.2)
        assert len(tmpl) == 1, f"no warm template below the kernel: {fork_servers(k.pid)}"
        out = k.ok(PROBE_CELL, timeout=120).stream("stdout")
        assert f"[({tmpl[0]}, True)]" in out  # both procs forked from it, torch already loaded


@pytest.mark.kernel
def test_the_mesh_kernel_starts_nothing_when_opted_out(monkeypatch):
    from _kernel import fresh_kernel

    monkeypatch.setenv("JUPYTER_MESH_WARM", "0")
    with fresh_kernel() as k:
        k.ok("1")
        assert not templates(k.pid)


# -- the first tensor call --------------------------------------------------------------------------------
@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
def test_the_first_tensor_call_to_a_fresh_proc_imports_nothing_of_torch(monkeypatch):
    """A warm proc's first call with a tensor in and out (unpickled, computed on, pickled back) finds
    every torch module it needs already loaded: the template imported them before the fork."""
    import torch
    from warm_actors import Loaded

    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    job = LocalJob(1)
    try:
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120)
        probe = procs.spawn("probe", Loaded)
        assert list(probe.had.call(["torch"]).get(60).values()) == [{"torch": True}] * 2
        out = probe.double.call(torch.arange(4.0)).get(60)
        assert all(torch.equal(t, torch.arange(4.0) * 2) for t in out.values())
        new = probe.imported_since_start.call().get(60)
        for rank, names in new.items():
            torchy = [n for n in names if n.split(".")[0] in ("torch", "numpy", "functorch")]
            assert torchy == [], f"rank {rank}'s first tensor call imported {torchy}"
        procs.stop()
    finally:
        job.stop()


# -- a spawn before the warm imports are done ------------------------------------------------------------
EARLY_SCRIPT = """
import json, os, sys, threading, time, types
wait, flag = sys.argv[1] == "wait", sys.argv[2]
from _procs import wait_for
from jupyter_mesh import LocalJob
from jupyter_mesh.jobs import warm
from test_warm import _ppid, templates
from warm_actors import Probe

# the warm list gets slow_warm_import first (a library "this program imported"), held while FLAG exists
warm.WARM_CANDIDATES = (*warm.WARM_CANDIDATES, "slow_warm_import")
sys.modules["slow_warm_import"] = types.ModuleType("slow_warm_import")
job = LocalJob(1, env={"JM_SLOW_IMPORT_FLAG": flag})
(template,) = wait_for(lambda: templates(job.pids()[0]), 30)

pipes = {}

def spawn(label=None, **kw):
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120, **kw)
    probe = procs.spawn("probe", Probe)
    infos = set(probe.info.call().get(60).values())
    if label:
        pipes[label] = sorted(probe.pipes.call().get(60).values())
    return [("template" if ppid == template else "warm child" if _ppid(ppid) == template else ppid, had)
            for ppid, had in sorted(infos)]

got = {}
th = threading.Thread(target=lambda: got.update(first=spawn() if wait else spawn(warm=False)), daemon=True)
th.start()
th.join(3.0)  # a cold spawn answers in well under a second; the warm child waits on FLAG for 60 s
early = {"done_while_warming": not th.is_alive()}
if wait:  # a warm=False spawn behind the held one is not held with it
    beside = threading.Thread(target=lambda: got.update(beside=spawn("beside", warm=False)), daemon=True)
    beside.start()
    beside.join(10.0)
    early["beside"] = got.get("beside")
print(json.dumps(early), flush=True)
os.unlink(flag)
th.join(120)
later = spawn()  # waits for the warm child, if still importing
after = spawn("after", warm=False)
print(json.dumps({"first": got["first"], "later": later, "after": after, "pipes": pipes}), flush=True)
job.stop()
"""


@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("how", ["wait", "warm=False"])
def test_a_spawn_before_the_warm_imports_waits_for_them_unless_told_not_to(tmp_path, how):
    """Warm imports (torch: seconds per host) run in the template's warm child: a spawn meanwhile waits
    for them and forks warm, or with ``warm=False`` forks at once, cold; once warm, every spawn is."""
    flag = tmp_path / "slow"
    flag.write_text("")
    out = subprocess.run(
        [sys.executable, "-c", EARLY_SCRIPT, how, str(flag)],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(JUPYTER_MESH_WARM="1"),
    )
    assert out.returncode == 0, out.stderr
    first_line, second_line = (json.loads(line) for line in out.stdout.splitlines())
    assert first_line["done_while_warming"] == (how != "wait")
    if how == "wait":  # forked cold by the template while the first spawn's forks wait for the warm child
        assert first_line["beside"] == [["template", False]]
    # cold: forked at once by the template itself; warm: by its warm child, once that was ready
    assert second_line["first"] == [["warm child", True] if how == "wait" else ["template", False]]
    assert second_line["later"] == [["warm child", True]]
    assert second_line["after"] == [["warm child", True]]  # once warm, warm=False forks warm too
    if how == "wait":  # a proc forked beside held forks holds none of their pipes (their output's EOF)
        assert second_line["pipes"]["beside"] == second_line["pipes"]["after"], second_line["pipes"]


def _slow_warm_job(monkeypatch, flag: str, only_slow: bool = False) -> LocalJob:
    """A LocalJob whose template's warm child imports ``slow_warm_import`` (held while ``flag`` exists)
    then torch (not with ``only_slow``)."""
    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    candidates = () if only_slow else warm.WARM_CANDIDATES
    monkeypatch.setattr(warm, "WARM_CANDIDATES", (*candidates, "slow_warm_import"))
    if only_slow:  # not even torch (which the warm list gets whenever it is installed)
        monkeypatch.setattr(warm, "_installed", lambda name: False)
    monkeypatch.setitem(sys.modules, "slow_warm_import", types.ModuleType("slow_warm_import"))
    return LocalJob(1, env={"PYTHONPATH": _env()["PYTHONPATH"], "JM_SLOW_IMPORT_FLAG": flag})


def _spawn_in_background(job: LocalJob, gpus: int, result: dict[str, object]) -> threading.Thread:
    """``spawn_procs`` on a thread of its own (the test kills what it waits on meanwhile): the mesh
    lands in ``result["procs"]``, or the error in ``result["err"]``."""

    def spawn() -> None:
        try:
            result["procs"] = job.host_mesh().spawn_procs(per_host={"gpus": gpus}, timeout=60)
        except BaseException as e:  # noqa: BLE001
            result["err"] = e

    th = threading.Thread(target=spawn, daemon=True)
    th.start()
    return th


def _warm_child(template: int) -> int:
    return wait_for(lambda: next((p for p in fork_servers(template) if _ppid(p) == template), 0), 30)


@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_warm_child_that_dies_or_stops_while_importing(monkeypatch, tmp_path, fault):
    """Killed: the spawn that waited for it forks cold from the template; stopped: that spawn fails with
    the cause (as for a stopped template), and once resumed the host forks warm."""
    from warm_actors import Probe

    from jupyter_mesh import SupervisionError

    flag = tmp_path / "slow"
    flag.write_text("")
    job = _slow_warm_job(monkeypatch, str(flag))
    try:
        (template,) = wait_for(lambda: templates(job.pids()[0]), 30)
        child = _warm_child(template)
        assert child, "no warm child started"
        result: dict[str, object] = {}

        def spawn() -> None:
            try:
                procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=60)
                probe = procs.spawn("probe", Probe)
                result["infos"] = sorted(set(probe.info.call().get(60).values()))
                result["pipes"] = sorted(probe.pipes.call().get(60).values())
                procs.stop()
            except BaseException as e:  # noqa: BLE001
                result["err"] = e

        th = threading.Thread(target=spawn, daemon=True)
        th.start()
        th.join(1.0)
        assert th.is_alive(), "the spawn did not wait for the warm child"
        os.kill(child, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        try:
            th.join(60)
            assert not th.is_alive(), "the spawn held for a warm child hung after that child " + fault
        finally:
            if fault == "stop":
                os.kill(child, signal.SIGCONT)
        if fault == "kill":
            assert result.get("infos") == [(template, False)], result  # forked by the template, no torch
            pipes = result["pipes"]
            assert isinstance(pipes, list) and pipes[0] == pipes[1], result  # neither holds the other's
        else:
            err = result.get("err")
            assert isinstance(err, SupervisionError) and f"pid {child}" in str(err) and "stopped" in str(err), err
            flag.unlink()
            procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
            assert list(procs.spawn("probe", Probe).info.call().get(60).values()) == [(child, True)]
            procs.stop()
    finally:
        flag.unlink(missing_ok=True)
        job.stop()


@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_warm_child_that_serves_is_the_fork_server(monkeypatch, tmp_path, fault):
    """Once it took over, the warm child is the host's fork server: killed, its procs go with it, the
    agent says so and starts a new one; stopped, the spawns waiting on it fail with that cause."""
    from warm_actors import Probe

    from jupyter_mesh import SupervisionError

    flag = tmp_path / "slow"  # (never created: the warm imports run through)
    job = _slow_warm_job(monkeypatch, str(flag))
    try:
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120)
        infos = sorted(set(procs.spawn("probe", Probe).info.call().get(60).values()))
        ((child, had),) = infos
        (template,) = templates(job.pids()[0])
        assert had and _ppid(child) == template
        if fault == "kill":
            os.kill(child, signal.SIGKILL)
            assert not wait_dead({template}, 10.0), "the template outlived its warm child"
            # the cause names the process that forked them, and how it died (not its parent's exit code)
            with pytest.raises(SupervisionError, match=f"warm child, pid {child}\\) was killed by SIGKILL"):
                procs.spawn("again", Probe).info.call().get(30)
            after = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
            assert after.spawn("probe", Probe).info.call().get(60)  # a new fork server forks
            after.stop()
        else:
            os.kill(child, signal.SIGSTOP)
            try:
                with pytest.raises(
                    SupervisionError, match=f"fork server \\(the template's warm child, pid {child}\\) is stopped"
                ):
                    job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
                assert procs.spawn("still", Probe).info.call().get(30)  # its procs live on
            finally:
                os.kill(child, signal.SIGCONT)
            after = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
            assert after.spawn("probe", Probe).info.call().get(60)
            after.stop()
    finally:
        job.stop()


def test_a_warm_child_that_dies_while_taking_over_ends_the_fork_server_with_that_cause(monkeypatch, tmp_path):
    """The template hands a warm child that is ready the forks that waited for it (120 here: more than
    the socket holds at once, so the hand-over takes a while) and the agent's socket. Killed at its first
    fork, the spawn fails with the warm child's pid and signal as the cause (the template crashed with a
    BrokenPipeError before), no process is left, and the next spawn works."""
    from warm_actors import Probe

    from jupyter_mesh import SupervisionError

    flag = tmp_path / "slow"
    flag.write_text("")
    job = _slow_warm_job(monkeypatch, str(flag), only_slow=True)  # (torch's import may start children)
    try:
        (template,) = wait_for(lambda: templates(job.pids()[0]), 30)
        child = _warm_child(template)
        result: dict[str, object] = {}
        th = _spawn_in_background(job, 120, result)
        time.sleep(1.0)  # the forks are held
        flag.unlink()
        assert wait_for(lambda: descendants(child), 30, 0.001), "the warm child never forked"
        os.kill(child, signal.SIGSTOP)  # it reads no more: the template blocks handing over the rest
        time.sleep(0.3)
        mid_handover = open_pipes(template) > 20  # it closes the held forks' pipes once all are handed over
        os.kill(child, signal.SIGKILL)
        th.join(60)
        assert not th.is_alive(), "the spawn hung after the warm child died"
        err = result.get("err")
        assert isinstance(err, SupervisionError), result
        assert f"warm child, pid {child}" in str(err) and "SIGKILL" in str(err), err
        assert not wait_dead({template}, 10.0), "the template outlived its warm child"
        after = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
        assert after.spawn("probe", Probe).info.call().get(60)
        after.stop()
    finally:
        flag.unlink(missing_ok=True)
        job.stop()
    if not mid_handover:  # (the machine was too slow to catch it: the warm child had taken over)
        pytest.skip("the hand-over was over before the warm child was stopped")
    assert "while it took over from the template" in str(err), err


@pytest.mark.parametrize("hosts", [1, 3])
def test_a_spawn_that_times_out_waiting_for_warm_imports_says_so_once_for_all_hosts(monkeypatch, tmp_path, hosts):
    """Its error names the likely wait and the way around it; with several hosts the spawn's timeout
    bounds the whole spawn (each host's reply had the full timeout before: N x timeout)."""
    from jupyter_mesh import MeshTimeoutError

    flag = tmp_path / "slow"
    flag.write_text("")
    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    monkeypatch.setattr(warm, "WARM_CANDIDATES", ("slow_warm_import",))
    monkeypatch.setitem(sys.modules, "slow_warm_import", types.ModuleType("slow_warm_import"))
    job = LocalJob(hosts, env={"PYTHONPATH": _env()["PYTHONPATH"], "JM_SLOW_IMPORT_FLAG": str(flag)})
    try:
        job.agents(60)
        t0 = time.monotonic()
        with pytest.raises(MeshTimeoutError, match=r"warm=False\) does not wait"):
            job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=3.0)
        # one timeout plus the undo (up to 2 s), not one per host (3 x 3 s before)
        assert time.monotonic() - t0 < 8.0
        cold = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30, warm=False)
        cold.stop()
    finally:
        flag.unlink(missing_ok=True)
        job.stop()
