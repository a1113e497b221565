"""A warm ``LocalJob`` of several hosts imports its warm list once, in its seed (``_runtime/seed.py``),
and each host's template takes an already warm child from it; whatever happens to the seed costs speed,
never a spawn, a proc or a process left behind.

The warm list here is ``seed_warm_import``, which logs the pid of every process that imports it and can
be held (``JM_SLOW_IMPORT_FLAG``) as torch's import on a slow day."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
from _procs import alive, descendants, state, templates_of, wait_dead, wait_for
from seed_actors import Probe

from jupyter_mesh import LocalJob, SupervisionError
from jupyter_mesh._runtime import packets
from jupyter_mesh._runtime import seed as seed_mod
from jupyter_mesh.jobs import warm

pytestmark = pytest.mark.integration

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _imports(log) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


@pytest.fixture
def seeded(monkeypatch, tmp_path):
    """Make a warm LocalJob whose warm list is ``seed_warm_import`` (``flag`` held: its import waits);
    every job made is stopped and checked to leave no process."""
    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    monkeypatch.setattr(warm, "WARM_CANDIDATES", ("seed_warm_import",))
    monkeypatch.setattr(warm, "_installed", lambda name: False)  # (not torch: whether installed or not)
    monkeypatch.setitem(sys.modules, "seed_warm_import", types.ModuleType("seed_warm_import"))
    log, flag, stop = tmp_path / "imports", tmp_path / "hold", tmp_path / "stop"
    jobs: list[LocalJob] = []
    earlier = descendants(os.getpid())  # (other tests' module-scoped meshes and kernels: not ours to check)

    def make(hosts: int, hold: bool = False, inherit: bool = False, stop_child: bool = False) -> LocalJob:
        """``inherit``: the job is given no ``env``; its agents take this process's (set here).
        ``stop_child``: the seed's first warm child stops itself before it says hello."""
        if hold:
            flag.write_text("")
        if stop_child:
            stop.write_text("")
        path = os.pathsep.join(p for p in (TESTS, ROOT, os.environ.get("PYTHONPATH", "")) if p)
        env = {"PYTHONPATH": path, "JM_WARM_IMPORT_LOG": str(log), "JM_SLOW_IMPORT_FLAG": str(flag)}
        env["JM_STOP_AT_FORK_FLAG"] = str(stop)
        if inherit:
            for name, value in env.items():
                monkeypatch.setenv(name, value)
        job = LocalJob(hosts, env=None if inherit else env)
        jobs.append(job)
        return job

    make.log, make.flag, make.stop = log, flag, stop  # type: ignore[attr-defined]
    yield make
    flag.unlink(missing_ok=True)
    below = descendants(os.getpid()) - earlier  # the seeds, agents, templates, warm children and procs
    for job in jobs:
        job.stop()
    left = wait_dead(below, 15.0)
    assert not left, f"processes left behind: {sorted(left)}"


def _where(procs) -> list[tuple[int, int, bool]]:
    return sorted(procs.spawn("probe", Probe).where.call().get(60).values())


@pytest.mark.parametrize("use_seed", [True, False])
def test_several_hosts_import_the_warm_list_once_in_the_seed(seeded, monkeypatch, use_seed):
    """With the seed: one import (the seed's), and every host's procs come from a warm child of the seed;
    without (``JUPYTER_MESH_SEED=0``): one import per host, in each template's own warm child."""
    monkeypatch.setenv("JUPYTER_MESH_SEED", "1" if use_seed else "0")
    job = seeded(3)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 2}, timeout=120)
    where = _where(procs)
    assert len(where) == 6 and all(warm_ for _, _, warm_ in where), where
    forkers = {forker for _, forker, _ in where}
    assert len(forkers) == 3, where  # one fork server per host
    if use_seed:
        assert job.seed_pid and _imports(seeded.log) == [job.seed_pid]
        assert {_ppid(f) for f in forkers} == {job.seed_pid}
    else:
        assert job.seed_pid is None
        assert sorted(_imports(seeded.log)) == sorted(forkers)  # each host's warm child imported it
    procs.stop()


def test_one_host_starts_no_seed(seeded):
    job = seeded(1)
    assert job.seed_pid is None
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    ((_, forker, loaded),) = _where(procs)
    assert loaded and _imports(seeded.log) == [forker]
    procs.stop()


def test_a_seed_killed_while_it_imports_leaves_each_host_to_warm_up_alone(seeded):
    """The spawn that waits for the warm list neither fails nor hangs: each template starts its own warm
    child, as without a seed."""
    job = seeded(2, hold=True)
    seed = job.seed_pid
    assert wait_for(lambda: seed in _imports(seeded.log), 30), "the seed did not start its import"
    result: dict[str, object] = {}

    def spawn() -> None:
        try:
            result["where"] = _where(job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60))
        except BaseException as e:  # noqa: BLE001
            result["err"] = e

    th = threading.Thread(target=spawn, daemon=True)
    th.start()
    th.join(1.0)
    assert th.is_alive(), "the spawn did not wait for the warm list"
    os.kill(seed, signal.SIGKILL)
    assert wait_for(lambda: len(_imports(seeded.log)) == 3, 30), "the hosts did not warm up alone"
    seeded.flag.unlink()
    th.join(60)
    assert not th.is_alive(), "the spawn hung after the seed was killed"
    where = result.get("where")
    assert isinstance(where, list) and all(w for _, _, w in where), result
    assert {_ppid(f) for _, f, _ in where}.isdisjoint({seed}), where  # the templates' own warm children


@pytest.mark.parametrize("seed_alive", [True, False])
def test_a_seeded_warm_child_killed_takes_its_hosts_procs_and_says_how(seeded, seed_alive):
    """It is its host's fork server: killed, that host's procs fail with its pid and signal as the
    cause (or, once the seed is gone, with what is known), the other host's procs live on, and the next
    spawn works, warm."""
    job = seeded(2)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    where = _where(procs)
    forkers = sorted({f for _, f, _ in where})
    victim = forkers[0]
    if not seed_alive:
        os.kill(job.seed_pid, signal.SIGKILL)
        assert not wait_dead({job.seed_pid}, 10), "the seed outlived a SIGKILL"
        assert _where(procs) == where  # its children serve on
    templates = {t for a in job.pids() for t in templates_of(a)}
    assert len(templates) == 2, templates  # (a seeded warm child and its procs show the seed's argv)
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: not all(alive(t) for t in templates), 10), "no template ended with its warm child"
    how = "was killed by SIGKILL" if seed_alive else "how is unknown: the job's seed, its parent, is gone"
    with pytest.raises(SupervisionError, match=f"warm child, pid {victim}.*{how}"):
        _where(procs)
    after = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    again = _where(after)
    assert all(w for _, _, w in again) and victim not in {f for _, f, _ in again}, again
    # the new template asks the seed again; with the seed gone, it warms up alone
    parents = {_ppid(f) for _, f, _ in again}
    assert (job.seed_pid in parents) == seed_alive, (parents, job.seed_pid)
    after.stop()
    procs.stop()


def test_a_seeded_hosts_template_killed_takes_its_warm_child_and_the_next_template_asks_the_seed(seeded):
    """The template of a seeded host killed: its warm child (the seed's, not its own) sees the
    template's end and ends too, the host's procs fail naming the template, the other host's live on,
    and the agent's next template takes a new warm child from the seed."""
    job = seeded(2)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    forkers = {f for _, f, _ in _where(procs)}
    template_pid = templates_of(job.pids()[0])[0]
    os.kill(template_pid, signal.SIGKILL)
    assert wait_for(lambda: any(not alive(f) for f in forkers), 10), "no warm child ended with its template"
    (survivor,) = [f for f in forkers if alive(f)]
    with pytest.raises(SupervisionError, match=f"template, pid {template_pid}.*SIGKILL"):
        _where(procs)
    after = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    again = _where(after)
    assert all(w for _, _, w in again) and {_ppid(f) for _, f, _ in again} == {job.seed_pid}, again
    assert survivor in {f for _, f, _ in again} and not forkers >= {f for _, f, _ in again}
    after.stop()
    procs.stop()


def test_a_seeded_warm_child_stopped_before_its_hello_is_named(seeded):
    """Stopped right after the seed forked it, before it said hello to its template: the spawn that
    waits on it fails naming that warm child (the seed told the template its pid), not the running
    seed's import; resumed, it takes over and the host spawns warm."""
    job = seeded(2, stop_child=True)
    seed = job.seed_pid
    children = lambda: [p for p in descendants(seed) if p != seed]  # noqa: E731
    assert wait_for(lambda: not seeded.stop.exists() and children(), 30)
    assert wait_for(lambda: any(state(p) == "T" for p in children()), 10)
    (victim,) = [p for p in children() if state(p) == "T"]
    try:
        stopped = rf"fork server \(the template's warm child, pid {victim}\) is stopped .*SIGCONT"
        with pytest.raises(SupervisionError, match=stopped):
            job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
    finally:
        os.kill(victim, signal.SIGCONT)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
    where = _where(procs)
    assert all(w for _, _, w in where) and victim in {f for _, f, _ in where}, where
    assert _imports(seeded.log) == [seed]
    procs.stop()


def test_a_stopped_seed_fails_the_spawn_that_waits_on_it_with_that_cause(seeded):
    """Stopped while it imports, every host's held forks wait on it: the spawn fails naming it and
    what to do, and once resumed the hosts spawn warm."""
    job = seeded(2, hold=True)
    seed = job.seed_pid
    assert wait_for(lambda: seed in _imports(seeded.log), 30)
    os.kill(seed, signal.SIGSTOP)
    try:
        stopped = rf"its job's seed \(pid {seed}\), which imports the warm list for every host, is stopped .*SIGCONT"
        with pytest.raises(SupervisionError, match=stopped):
            job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
    finally:
        os.kill(seed, signal.SIGCONT)
    seeded.flag.unlink()
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
    where = _where(procs)
    assert all(w for _, _, w in where) and {_ppid(f) for _, f, _ in where} == {seed}, where
    assert _imports(seeded.log) == [seed]
    procs.stop()


def test_the_seed_refuses_a_template_of_another_environment_and_says_why():
    """A module imported under another interpreter, path or environment is another module: the seed
    answers ``refused`` and closes the socket it got (the template then warms up alone)."""
    env = {**os.environ, "JM_SEED_TEST": "theirs"}
    seed = seed_mod.Seed([], env)
    link = seed.link()
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine = seed_mod.fingerprint()
        assert packets.send_or_ignore(link, {"op": "warm", "fingerprint": mine}, [theirs.fileno()])
        theirs.close()
        link.settimeout(30)
        msg = json.loads(link.recv(1 << 16))
        assert msg["op"] == "refused" and "another" in msg["why"], msg
        ours.settimeout(30)
        assert ours.recv(16) == b""  # closed: no child was forked
        # bad requests: no socket, or two, are ignored (the seed serves on)
        assert packets.send_or_ignore(link, {"op": "warm", "fingerprint": mine})
        assert packets.send_or_ignore(link, {"op": "bogus"}, [ours.fileno(), ours.fileno()])
        time.sleep(0.2)
        assert seed.proc.poll() is None
        ours.close()
    finally:
        link.close()
        seed.stop()
    assert seed.proc.returncode is not None


def test_mismatch_names_what_differs():
    mine = {"exe": "/py", "path": ["a"], "cwd": "/w", "env": {"A": "1", "B": "2"}}
    assert seed_mod.mismatch(mine, dict(mine)) == ""
    assert seed_mod.mismatch(mine, {**mine, "exe": "/other"}) == "another exe"
    assert seed_mod.mismatch(mine, {**mine, "path": ["b"]}) == "another path"
    assert seed_mod.mismatch(mine, {**mine, "env": {"A": "1"}}) == "another environment (B)"
    assert seed_mod.mismatch(mine, {**mine, "env": {"A": "9", "B": "2"}}) == "another environment (A)"
    assert seed_mod.mismatch(mine, None) == "no fingerprint"


def test_a_host_added_in_another_environment_takes_it_and_warms_up_alone(seeded, monkeypatch):
    """A job given no ``env`` starts each agent in this process's environment as it is then, with a
    seed or without: a host added after it changed gets the change, and the seed, which imported in
    the old one, refuses its template (it warms up alone)."""
    job = seeded(2, inherit=True)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    assert {_ppid(f) for _, f, _ in _where(procs)} == {job.seed_pid}
    monkeypatch.setenv("JM_SEED_LATER", "1")
    job.add_hosts(1, 60)
    more = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    probes = more.spawn("probe", Probe)
    where = probes.where.call().get(60)
    seen = probes.env.call("JM_SEED_LATER").get(60)
    assert [seen.item(hosts=h, gpus=0) for h in range(3)] == [None, None, "1"], seen
    parents = [_ppid(where.item(hosts=h, gpus=0)[1]) for h in range(3)]
    assert parents[:2] == [job.seed_pid] * 2 and parents[2] != job.seed_pid, parents
    assert all(w for _, _, w in where.values()), where
    more.stop()
    procs.stop()


def test_a_stopped_seeded_warm_child_ends_with_its_job(seeded):
    """A seeded warm child is not its template's child: stopped (SIGSTOP), it would never read the EOF
    that ends it, and would outlive the job holding its output. ``job.stop()`` ends it (the fixture
    checks that nothing is left)."""
    job = seeded(2)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    forkers = sorted({f for _, f, _ in _where(procs)})
    os.kill(forkers[0], signal.SIGSTOP)
    job.stop()
    assert not wait_dead(set(forkers), 15), "a seeded warm child outlived its job"


def test_a_stopped_seeded_warm_child_of_a_dead_agent_ends_with_its_host(seeded):
    """Its agent killed (so nothing of its host is left to end it), a stopped seeded warm child is
    killed by the seed once the host's link closes, long before the job ends: no process holds the
    job's output for ever (helper-59)."""
    job = seeded(2)
    procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=120)
    forker = sorted({f for _, f, _ in _where(procs)})[0]
    assert _ppid(forker) == job.seed_pid
    os.kill(forker, signal.SIGSTOP)
    for agent in job.pids():  # (whichever host it serves)
        os.kill(agent, signal.SIGKILL)
    assert not wait_dead({forker}, 15), "a stopped seeded warm child outlived its host's agent"
    assert alive(job.seed_pid)  # the seed itself serves on until its job ends


def test_a_peer_that_closed_with_our_messages_unread_still_has_its_last_word_read():
    """Linux reports ECONNRESET once on a socket whose peer closed with our messages unread, before
    what the peer sent last: the template's ``ending`` (how its warm child died) must not be lost to it,
    nor a seeded warm child's last message to its template."""
    from jupyter_mesh._runtime.forkserver import ForkServer

    for read in (lambda sock: packets.recv(sock)[0], lambda sock: ForkServer.recv(types.SimpleNamespace(sock=sock))):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours:
            ours.send(b'{"op": "fork"}')  # never read
            theirs.send(b'{"op": "ending"}')
            theirs.close()
            assert read(ours) == {"op": "ending"}
            assert read(ours) is None


@pytest.mark.parametrize("stopped", ["", "warm child", "seed"])
def test_a_killed_controller_leaves_no_seed_and_no_warm_child(tmp_path, stopped):
    """kill -9 of the program that owns the job: the seed exits on its control socket's EOF, and kills
    its warm children (a stopped one too, which would not see its host end); a stopped seed, which
    would not see its EOF, is killed by the orphaned agents."""
    script = tmp_path / "owner.py"
    script.write_text(
        "import json, os, sys, types\n"
        "from jupyter_mesh.jobs import warm\n"
        "warm.WARM_CANDIDATES = ('seed_warm_import',)\n"
        "warm._installed = lambda name: False\n"
        "sys.modules['seed_warm_import'] = types.ModuleType('seed_warm_import')\n"
        "from jupyter_mesh import LocalJob\n"
        "from seed_actors import Probe\n"
        "job = LocalJob(2)\n"
        "procs = job.host_mesh().spawn_procs(per_host={'gpus': 1}, timeout=120)\n"
        "where = procs.spawn('p', Probe).where.call().get(60)\n"
        "print(json.dumps({'seed': job.seed_pid, 'where': list(where.values())}), flush=True)\n"
        "sys.stdin.read()\n"
    )
    path = os.pathsep.join(p for p in (TESTS, ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "JUPYTER_MESH_WARM": "1"}
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line, "the owner did not start its mesh"
        info = json.loads(line)
        below = descendants(p.pid)
        assert info["seed"] in below and all(alive(pid) for pid, _, _ in info["where"])
        if stopped:
            os.kill(info["where"][0][1] if stopped == "warm child" else info["seed"], signal.SIGSTOP)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        left = wait_dead(below, 20.0)
        assert not left, f"left behind by a killed controller: {sorted(left)}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdin.close()  # type: ignore[union-attr]
        p.stdout.close()  # type: ignore[union-attr]
