"""Nothing outlives a session: no /dev/shm file after a kill -9 of any of its processes, and agents
that exit quietly (no "Fatal Python error" at interpreter shutdown).

Each test runs the controller as a subprocess script, since a kill -9 of the controller (or of the
agents it started) must not touch the test process itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types

import pytest
from _procs import alive, descendants, ppid, templates_of, wait_dead, wait_for, wait_stopped

pytestmark = pytest.mark.integration

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

# Makes shared-memory traffic of every kind, then leaves some of it unclaimed: a proc that is
# stopped (SIGSTOP) cannot map the 2 MiB arguments sent to it, so their segments stay in /dev/shm.
SHM_TRAFFIC = """
import json, os, signal, sys, time
sys.path.insert(0, {tests!r})
import torch
import jupyter_mesh.lowlevel
from jupyter_mesh import LocalJob, RDMABuffer
from jupyter_mesh._runtime.controller import Controller
from actors import Faulty
from rdma_actors import Owner, Puller
from _procs import wait_stopped

jupyter_mesh.lowlevel.set_fault_hook(lambda err: None)  # the stopped proc will be declared dead: expected
job = LocalJob(hosts=1)
pm = job.host_mesh().spawn_procs(per_host={{"gpus": 2}})
owner = pm.spawn("owner", Owner, 1 << 18)
puller = pm.spawn("puller", Puller)
echo = pm.spawn("echo", Faulty)
handle = owner.slice(gpus=1).handle.call_one().get(30)  # a proc's RDMABuffer, read over shm
puller.slice(gpus=0).pull.call_one(handle, 1 << 18).get(30)
mine = RDMABuffer(torch.zeros(1 << 18))  # the controller's RDMABuffer, written by a proc
puller.slice(gpus=1).push.call_one(mine, 1 << 18, 2.0).get(30)
assert echo.slice(gpus=0).echo.call_one(torch.ones(1 << 19)).get(30).sum() == 1 << 19  # 2 MiB: a segment
pids = pm.pids()
os.kill(pids[0], signal.SIGSTOP)
assert wait_stopped(pids[0])
futs = [echo.slice(gpus=0).echo.call_one(torch.ones(1 << 19)) for _ in range(3)]
agent = job.pids()[0]
with open(f"/proc/{{agent}}/task/{{agent}}/children") as f:
    template = int(f.read().split()[0])
info = dict(prefix=Controller.get().transport.shm_prefix, controller=os.getpid(), agent=agent,
            template=template, procs=list(pids.values()))
print(json.dumps(info), flush=True)
time.sleep(float(sys.argv[1]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return env


def _ours(prefix: str, pids: list[int]) -> list[str]:
    torch_names = tuple(f"torch_{p}_" for p in pids)  # torch's own shared-memory files
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix) or n.startswith(torch_names))


@pytest.mark.parametrize("victim", ["controller", "agent", "template"])
def test_no_shm_left_after_kill_9(tmp_path, victim):
    script = tmp_path / "traffic.py"
    script.write_text(SHM_TRAFFIC.format(tests=TESTS))
    linger = "60" if victim == "controller" else "3"  # killing an agent or template: the program ends itself
    # one-shot named segments, the kind a dead receiver can leave in /dev/shm (pooled ones are memfds:
    # they go with the processes that hold them)
    env = {**_env(), "JUPYTER_MESH_SHM_POOL": "0"}
    ctl = subprocess.Popen(
        [sys.executable, str(script), linger], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        line = ctl.stdout.readline() if ctl.stdout else b""
        assert line, f"the script failed:\n{ctl.communicate(timeout=30)[1].decode()[-3000:]}"
        info = json.loads(line)
        pids = [info["controller"], info["agent"], info["template"], *info["procs"]]
        assert wait_for(lambda: _ours(info["prefix"], pids), 10.0), "no segment in /dev/shm: nothing tested"
        os.kill(info[victim], signal.SIGKILL)
        ctl.communicate(timeout=60)
        left = wait_dead(set(pids), 15.0)
        assert not left, f"processes of the session still alive after the kill of the {victim}: {sorted(left)}"
        shm_left = _ours(info["prefix"], pids)
        assert not shm_left, f"left in /dev/shm after kill -9 of the {victim}: {shm_left}"
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.communicate(timeout=10)


CYCLES = """
import sys
sys.path.insert(0, {tests!r})
from actors import Counter
from jupyter_mesh import LocalJob

for i in range({cycles}):
    job = LocalJob(hosts=2)
    pm = job.host_mesh().spawn_procs(per_host={{"gpus": 2}})
    assert list(pm.spawn("c", Counter, 0).incr.call().get(30).values()) == [1, 1, 1, 1]
    pm.stop(timeout=5)
    job.stop()
print("done", flush=True)
"""


def test_agents_exit_quietly(tmp_path):
    """Agents share the script's stderr: none may abort at interpreter shutdown (it did about one
    run in five of a 4-host script, from a thread blocked reading stdin)."""
    script = tmp_path / "cycles.py"
    # the abort came about one cycle in five: 10 cycles catch it about 9 runs in 10
    script.write_text(CYCLES.format(tests=TESTS, cycles=10))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=400, env=_env())  # no hang
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0 and r.stdout.strip() == b"done", err[-3000:]
    assert "Fatal Python error" not in err, err[-3000:]


@pytest.mark.parametrize("end", ["stop", "kill", "exit"])
def test_what_a_proc_started_ends_with_it(host, end):
    """A proc's own children and orphaned grandchildren (its process group) end with it: when its
    mesh stops, when it is killed, when it exits. A child that started a session of its own is left,
    as its author asked (and killed here)."""
    from actors import Starter

    pm = host.spawn_procs(per_host={"gpus": 2})
    starter = pm.spawn("starter", Starter)
    child = starter.slice(gpus=1).start.call_one().get(30)
    orphan = starter.slice(gpus=1).fork_and_leave.call_one().get(30)
    away = starter.slice(gpus=1).start.call_one(own_session=True).get(30)
    proc = pm.pids()[1]
    try:
        assert all(os.path.exists(f"/proc/{p}") for p in (child, orphan, away))
        if end == "stop":
            pm.stop(timeout=5)
        elif end == "kill":
            os.kill(proc, signal.SIGKILL)
        else:
            starter.slice(gpus=1).exit_now.broadcast(5)
        assert not wait_dead({proc, child, orphan}, 10.0), "the proc's children outlived it"
        assert os.path.exists(f"/proc/{away}")
    finally:
        os.kill(away, signal.SIGKILL)
        pm.stop(timeout=5)


@pytest.mark.parametrize("forker", ["template", "warm child", "seed's warm child"])
def test_what_procs_started_ends_when_their_fork_server_or_agent_is_killed(monkeypatch, forker):
    """``kill -9`` of a host's fork server (template) or of its agent kills its procs (PR_SET_PDEATHSIG),
    and nobody was left to end their process groups: what they started outlived everything. Whichever
    process forked them (``forker``), running or stopped, their children and orphaned grandchildren
    end with them now. Host 0 loses its template; host 1 its agent, its forker stopped. A child that
    started a session of its own is left, and the mesh reports both procs lost as before."""
    from actors import Starter

    from jupyter_mesh import LocalJob, SupervisionError
    from jupyter_mesh.jobs import warm

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")]))
    if forker != "template":  # a warm list that imports at once (not torch): a warm child forks
        monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
        monkeypatch.setenv("JUPYTER_MESH_SEED", "1" if forker == "seed's warm child" else "0")
        monkeypatch.setattr(warm, "WARM_CANDIDATES", ("seed_warm_import",))
        monkeypatch.setattr(warm, "_installed", lambda name: False)
        monkeypatch.setitem(sys.modules, "seed_warm_import", types.ModuleType("seed_warm_import"))
    earlier = descendants(os.getpid())  # (the module's host, other tests' meshes: not ours to check)
    job = LocalJob(hosts=2)
    away: list[int] = []
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
        starter = pm.spawn("starter", Starter)
        started = set()
        for h in (0, 1):
            one = starter.slice(hosts=h)
            started |= {one.start.call_one().get(30), one.fork_and_leave.call_one().get(30)}
            away.append(one.start.call_one(own_session=True).get(30))
        procs, agents = pm.pids(), job.pids()
        forkers = [ppid(procs[h]) for h in (0, 1)]
        parents = [ppid(f) for f in forkers]
        if forker == "template":
            assert parents == agents, (forkers, agents)
        elif forker == "warm child":
            assert [ppid(p) for p in parents] == agents, (forkers, parents, agents)
        else:
            assert parents == [job.seed_pid] * 2, (forkers, parents, job.seed_pid)
        (template,) = [p for p in templates_of(agents[0]) if ppid(p) == agents[0]]
        host1 = {agents[1], forkers[1], *templates_of(agents[1])}  # its template and warm child too
        calls = [starter.slice(hosts=h).sleep.call_one(60) for h in (0, 1)]
        os.kill(forkers[1], signal.SIGSTOP)
        assert wait_stopped(forkers[1])
        os.kill(template, signal.SIGKILL)
        os.kill(agents[1], signal.SIGKILL)
        left = wait_dead(started | host1 | set(procs.values()), 15.0)
        assert not left, f"left after kill -9 of host 0's template and host 1's agent: {sorted(left)}"
        assert all(alive(p) for p in away), "a process that left its proc's session was killed"
        with pytest.raises(SupervisionError, match=rf"fork server \(template, pid {template}\) was killed by SIGKILL"):
            calls[0].get(30)
        with pytest.raises(SupervisionError, match=rf"pid {agents[1]}\) killed by SIGKILL"):
            calls[1].get(30)
    finally:
        for p in away:
            os.kill(p, signal.SIGKILL)
        job.stop()
    left = wait_dead(descendants(os.getpid()) - earlier, 15.0)
    assert not left, f"processes left behind: {sorted(left)}"


SEEDED_FAMILIES = """
import json, sys, time, types
sys.path.insert(0, {tests!r})
from jupyter_mesh.jobs import warm
warm.WARM_CANDIDATES = ("seed_warm_import",)  # a warm list that imports at once (not torch)
warm._installed = lambda name: False
sys.modules["seed_warm_import"] = types.ModuleType("seed_warm_import")
from _procs import ppid
from actors import Starter
from jupyter_mesh import LocalJob

job = LocalJob(hosts=2)
pm = job.host_mesh().spawn_procs(per_host={{"gpus": 1}}, timeout=60)
procs = list(pm.pids().values())
assert {{ppid(ppid(p)) for p in procs}} == {{job.seed_pid}}, "not forked by the seed's warm children"
starter = pm.spawn("starter", Starter)
started = []
for h in (0, 1):
    one = starter.slice(hosts=h)
    started += [one.start.call_one().get(30), one.fork_and_leave.call_one().get(30)]
    one.ignore_sigterm.call_one().get(30)  # (its agent kills it 1 s after its SIGTERM)
print(json.dumps(dict(seed=job.seed_pid, agents=job.pids(), procs=procs, started=started)), flush=True)
if sys.argv[1] == "stop":
    job.stop()
else:
    time.sleep(60)
"""


@pytest.mark.parametrize("end", ["kill -9", "stop"])
def test_what_procs_started_ends_with_a_seeded_job(tmp_path, end):
    """A ``LocalJob`` of several hosts forks its procs from its seed's warm children (the default where
    torch is installed). As the job ended, each agent killed its seeded warm child, and at a ``kill -9``
    of the program the seed did too, at once: the procs died with it (PR_SET_PDEATHSIG) before anyone
    ended their groups, and what they started outlived the job. Now each warm child is resumed, not
    killed, and ends with its template, the groups first (the seed kills what is left after a while)."""
    script = tmp_path / "seeded.py"
    script.write_text(SEEDED_FAMILIES.format(tests=TESTS))
    env = {**_env(), "JUPYTER_MESH_WARM": "1", "JUPYTER_MESH_SEED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([TESTS, env["PYTHONPATH"]])  # (the warm list's module)
    argv = [sys.executable, str(script), end]
    ctl = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    left: set[int] = set()
    try:
        line = ctl.stdout.readline() if ctl.stdout else b""
        assert line, f"the script failed:\n{ctl.communicate(timeout=30)[1].decode()[-3000:]}"
        info = json.loads(line)
        if end == "kill -9":
            ctl.kill()
        err = ctl.communicate(timeout=60)[1].decode()
        assert end != "stop" or ctl.returncode == 0, err[-3000:]
        left = wait_dead({info["seed"], *info["agents"], *info["procs"], *info["started"]}, 15.0)
        assert not left, f"left after the job's end (what its procs started: {info['started']}): {sorted(left)}"
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.communicate(timeout=10)
        for p in left:
            os.kill(p, signal.SIGKILL)
