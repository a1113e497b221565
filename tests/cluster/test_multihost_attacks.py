"""Agents on other hosts, attacked from the outside (as a user and as an attacker): what must hold.

Each test is a reproduction of a finding of the attack review of the multi-host feature (issue 13):
it fails until the runtime is fixed. Controllers run in their own process (``attack_driver.py``,
steered through stdin) so this process keeps its private unix-socket controller.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import netns
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "attack_driver.py")
PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


class Listener:
    """``jupyter-mesh agent --listen`` in a namespace host; its output is collected as it comes."""

    def __init__(self, host, port: int, *args: str):
        self.host = host
        self.addr = f"tcp://{host.ip}:{port}"
        self.p = netns.run_in(
            host,
            [PY, "-m", "jupyter_mesh.cli", "agent", "--listen", self.addr, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
        first = self.p.stdout.readline().decode()
        assert "waiting to be attached" in first, first
        self.lines: list[str] = [first]
        self._pumper = threading.Thread(target=self._pump, daemon=True)
        self._pumper.start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.decode())

    @property
    def pid(self) -> int:  # the listener itself (self.p is nsenter, which execs it)
        return self.p.pid

    def sessions(self) -> list[str]:
        """What runs in the host besides the listener (session agents, fork servers, procs)."""
        return [
            f"{pid}: {netns.cmdline(pid)[:90]}"
            for pid in netns.netns_pids(self.host.name)
            if pid != self.pid and netns.alive(pid) and "--listen" not in netns.cmdline(pid)
        ]

    def wait_free(self, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while self.sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.sessions()

    def stop(self) -> str:
        try:
            os.killpg(self.p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)
        self._pumper.join(5)
        self.p.stdout.close()
        return "".join(self.lines)


class Driver:
    """A controller process (attack_driver.py) steered one command at a time."""

    def __init__(self, env: dict[str, str] | None = None, host: netns.Host | None = None):
        argv = [PY, DRIVER] if host is None else netns.nsenter_argv(host, [PY, DRIVER])
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env or _env())

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def read(self) -> dict:
        line = self.p.stdout.readline()
        assert line, f"the driver exited (rc={self.p.poll()})"
        return json.loads(line)

    def __call__(self, line: str) -> dict:
        self.send(line)
        return self.read()

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self("quit")
            except (AssertionError, BrokenPipeError, ValueError):
                pass
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except (BrokenPipeError, OSError):
                pass


# -- finding 1: a refused attach is re-sent at once; its stale answer and a phantom session follow ------
def test_a_refused_attach_is_asked_afresh_and_leaves_no_phantom_session(netns_hosts, config_dir):
    """A listener busy with controller A refuses B. Once A is gone, B asking again must get in (not the
    old refusal naming A's dead session), and B stopping its job must leave the listener free for C.

    Now: AttachJob.agents() re-sends the attach the moment it is refused (``self._waiters[i] =
    self._attach(i)``): B's next agents() raises the *old* refusal (naming a session pid that exited),
    and the attach it re-sent then starts a session nobody waits for; since the controller took its
    hello (``_agent_seen``), it heartbeats it for as long as B lives, and the listener refuses C."""
    ls = Listener(netns_hosts[0], 6100)
    a, b, c = Driver(), Driver(), Driver()
    seen: dict[str, object] = {}
    try:
        assert "error" not in a(f"job {ls.addr}")
        ra = a("agents 30")
        assert "error" not in ra, ra
        a_session_pid = ra["agents"][0][1]
        assert "error" not in b(f"job {ls.addr}")
        rb = b("agents 10")
        assert "already serves another controller" in rb.get("error", ""), rb  # refused while A holds: right
        a.close()
        assert ls.wait_free() == [], ls.sessions()
        time.sleep(1.0)  # the listener noticed (it polls its session every 0.2 s)
        rb2 = b("agents 10")  # the listener is free now
        seen["B asks again once A is gone"] = rb2
        seen["it names A's dead session"] = f"agent pid {a_session_pid}" in rb2.get("error", "")
        b("stop_job")
        time.sleep(12)  # past any heartbeat timeout (3 s x 3) of a session nobody wants
        seen["left on the listener's host after B stopped its job"] = ls.sessions()
        c("job " + ls.addr)
        seen["C attaches"] = c("agents 10")
    finally:
        for d in (a, b, c):
            d.close()
        log = ls.stop()
    print(json.dumps(seen, indent=1, default=str), log, sep="\n")
    assert "error" not in seen["B asks again once A is gone"], (seen, log)
    assert seen["left on the listener's host after B stopped its job"] == [], (seen, log)
    assert "error" not in seen["C attaches"], (seen, log)


def _plant_segment(d: Driver) -> str:
    """A one-shot /dev/shm segment of ``d``'s session whose receiver died before mapping it."""
    segment = f"/dev/shm/{d('shm_prefix')['prefix']}{os.getpid():x}-1deadbeefdeadbeef"
    with open(os.open(segment, os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
        f.write(b"x" * 4096)
    return segment


# -- a large argument to a stopped proc on another host holds nobody -------------------------------------
@pytest.mark.parametrize("mib", [1, 64])
def test_a_large_argument_to_a_stopped_proc_on_another_host_returns_at_once_with_value_semantics(
    netns_hosts, config_dir, mib
):
    """Across hosts a tensor travels on the control plane (CURVE TCP). ZeroMQ sent one of 1 MiB or
    more from the caller's memory, and the call waited until ZeroMQ let go of it: the whole message
    written out, which a proc that reads nothing (SIGSTOP) stops, so ``call_one`` itself blocked
    until the proc was declared dead. Now the buffer is copied as it is sent: the call returns at
    once, the proc gets the array as it was at the call, and it answers once resumed."""
    ls = Listener(netns_hosts[2], 6108)
    d = Driver()
    try:
        assert "error" not in d(f"job {ls.addr}")
        assert "error" not in d("agents 30")
        assert "error" not in d("spawn")
        r = d(f"stopped_echo {mib}")
        d("stop_job")
    finally:
        d.close()
        log = ls.stop()
    assert "error" not in r, (r, log)
    assert r["still_stopped"] and r["nbytes"] == mib << 20 and r["unchanged"], r


# -- a controller that exited gives its host up to the next one at once; a silent one keeps it ------------
@pytest.mark.parametrize("fault", ["kill", "stop", "hold_gil"])
def test_the_host_of_an_exited_controller_goes_to_the_next_one_at_once_and_a_silent_ones_does_not(
    netns_hosts, config_dir, fault
):
    """A kernel restart kills its controller, and the new kernel attaches to the same listeners at once.
    They refused it ("already serves another controller") until the dead session's silence timer ended
    it, 3 heartbeat timeouts (9 s) later. Now a listener asked by a second controller checks the first's
    port: refused means it exited, and the host is handed over. A controller that is only silent
    (stopped, or a C call holding its GIL for seconds) keeps its host: its port still accepts, the
    second is refused, and it calls on once it runs again (a hand-over on silence lost it, 4d539f0)."""
    ls = Listener(netns_hosts[2], 6105)
    a, b = Driver(), Driver()
    seen: dict[str, object] = {}
    segment = ""
    try:
        assert "error" not in a(f"job {ls.addr}")
        assert "error" not in a("agents 30")
        r = a("spawn")
        assert "error" not in r, r
        old_procs = r["pids"]
        segment = _plant_segment(a)  # the ended session sweeps it
        if fault == "kill":
            a.p.kill()
            a.p.wait(10)
        elif fault == "stop":
            os.kill(a.p.pid, signal.SIGSTOP)
        else:
            a.send("hold_gil 5")
            time.sleep(0.5)
        assert "error" not in b(f"job {ls.addr}")
        seen["B attaches"] = b("agents 30")
        if fault == "kill":
            seen["B spawns"] = b("spawn")
            deadline = time.monotonic() + 15
            while (any(netns.alive(p) for p in old_procs) or os.path.exists(segment)) and time.monotonic() < deadline:
                time.sleep(0.1)
            seen["A's procs still alive"] = [p for p in old_procs if netns.alive(p)]
            seen["A's segment left"] = os.path.exists(segment)
        else:
            if fault == "stop":
                os.kill(a.p.pid, signal.SIGCONT)
            else:
                seen["A's GIL held"] = a.read()
            seen["A calls once it runs again"] = a("call 20")
        b("stop_job")
    finally:
        if a.p.poll() is None:
            os.kill(a.p.pid, signal.SIGCONT)
        for d in (a, b):
            d.close()
        log = ls.stop()
        if segment and os.path.exists(segment):
            os.unlink(segment)
    print(json.dumps(seen, indent=1, default=str), log, sep="\n")
    if fault == "kill":
        assert "error" not in seen["B attaches"] and "error" not in seen["B spawns"], (seen, log)
        assert seen["A's procs still alive"] == [] and not seen["A's segment left"], (seen, log)
        assert "is gone (its port refuses connections)" in log and "no heartbeat from the controller" not in log, log
    else:
        assert "already serves another controller" in seen["B attaches"].get("error", ""), (seen, log)
        assert "error" not in seen["A calls once it runs again"], (seen, log)
        assert seen["A calls once it runs again"]["pids"] == old_procs, seen


@pytest.mark.parametrize("reject", ["tcp reset", "icmpx port-unreachable"])
def test_a_live_controller_whose_host_rejects_new_connections_keeps_its_host(netns_hosts, config_dir, reject):
    """A refused connection is not proof that a controller exited: a stateful firewall on its host may
    reject new connections (a REJECT of state NEW, a connection limit) while the established ones,
    its agents', work on. A listener asked by a second controller then took the live one's host and
    procs. It now asks its session agent's connection first: still established, the first keeps it."""
    ctl_host, other, listener_host = netns_hosts[0], netns_hosts[1], netns_hosts[2]
    ls = Listener(listener_host, 6107)
    a, b = Driver(host=ctl_host), Driver(host=other)
    seen: dict[str, object] = {}
    table = ["nft", "delete", "table", "inet", "jm_attack"]
    try:
        assert "error" not in a(f"job {ls.addr}")
        assert "error" not in a("agents 30")
        r = a("spawn")
        assert "error" not in r, r
        old_procs = r["pids"]
        port = next(ln for ln in ls.lines if "attached by" in ln).split("attached by ")[1].split()[0].rsplit(":", 1)[1]
        netns.check_output_in(ctl_host, ["nft", "add", "table", "inet", "jm_attack"])
        netns.check_output_in(
            ctl_host, ["nft", "add", "chain", "inet", "jm_attack", "input", "{ type filter hook input priority 0 ; }"]
        )
        rule = f"tcp dport {port} ct state new reject with {reject}"
        netns.check_output_in(ctl_host, ["nft", "add", "rule", "inet", "jm_attack", "input", *rule.split()])
        seen["A calls behind the firewall"] = a("call 20")
        assert "error" not in b(f"job {ls.addr}")
        seen["B attaches"] = b("agents 30")
        seen["A calls after B"] = a("call 20")
        b("stop_job")
    finally:
        try:
            netns.check_output_in(ctl_host, table)
        except subprocess.CalledProcessError:
            pass
        for d in (a, b):
            d.close()
        log = ls.stop()
    print(json.dumps(seen, indent=1, default=str), log, sep="\n")
    assert "error" not in seen["A calls behind the firewall"], (seen, log)
    assert "already serves another controller" in seen["B attaches"].get("error", ""), (seen, log)
    assert "error" not in seen["A calls after B"] and seen["A calls after B"]["pids"] == old_procs, (seen, log)


def test_a_once_listener_whose_controller_exited_refuses_the_next_and_exits(netns_hosts, config_dir):
    """``--once`` serves one session: the first controller exiting ends it, and the second is told why
    it is refused rather than given a second session."""
    ls = Listener(netns_hosts[2], 6106, "--once")
    a, b = Driver(), Driver()
    try:
        assert "error" not in a(f"job {ls.addr}")
        assert "error" not in a("spawn")
        a.p.kill()
        a.p.wait(10)
        assert "error" not in b(f"job {ls.addr}")
        rb = b("agents 30")
        ls.p.wait(20)
    finally:
        for d in (a, b):
            d.close()
        log = ls.stop()
    assert "served its one session (--once)" in rb.get("error", ""), (rb, log)
    assert ls.p.returncode == 0, log
    assert ls.wait_free() == [], log


# -- finding 1b: AttachJob.stop() drops its own SHUTDOWN: the session lingers 9 s, the listener is busy --
def test_stopping_an_attach_job_frees_the_listener_at_once(netns_hosts, config_dir):
    """Attach, then stop before spawning anything (what attach_to_workers and %mesh up do when a later
    step fails). The session agent should end at once and the listener take the next controller.

    Now: stop() sends SHUTDOWN and then ``forget_agents`` closes that socket with linger 0
    (``Transport.forget``), so a SHUTDOWN that has not left yet (no connection to the agent made
    before: nothing spawned) is dropped; the session lives until its 9 s silence timer, and every
    other controller is refused meanwhile. Fix: ``forget_agents`` closes with a linger (~1 s), or
    stop() waits for the SHUTDOWN to leave before forgetting."""
    ls = Listener(netns_hosts[3], 6103)
    d = Driver()
    try:
        d(f"job {ls.addr}")
        r = d("agents 30")
        assert "error" not in r, r
        d("stop_job")
        left = ls.wait_free(15)
    finally:
        d.close()
        log = ls.stop()
    # ended by our SHUTDOWN, not by its silence timer (which says so on its way out)
    assert left == [] and "no heartbeat from the controller" not in log, log


# -- finding 2: a cut host's session lingers after heal and blocks re-attach with a misleading refusal --
def test_after_a_short_cut_the_same_controller_gets_its_host_back(netns_hosts, config_dir):
    """Cut the host mid-call for 5 s, heal it. The controller declared the agent lost (right, and it
    must never take it back); asking for the host again must then work: the listener should end the
    stale session of *this* controller (same controller address) rather than refuse it as "another
    controller", and the controller should tell a lost agent to go once it can (SHUTDOWN).

    Now: "this agent already serves another controller (agent pid N)" until the stale agent's own
    9 s silence timer ends it, and the attach re-sent with each refusal leaves a phantom session."""
    h = netns_hosts[1]
    ls = Listener(h, 6101)
    d = Driver()
    seen: dict[str, object] = {}
    try:
        d(f"job {ls.addr}")
        r = d("agents 30")
        assert "error" not in r, r
        r = d("spawn")
        assert "error" not in r, r
        d.send("nap 30")
        time.sleep(0.5)
        netns_hosts.cut(h)
        t0 = time.monotonic()
        r = d.read()
        assert "unreachable" in r.get("error", ""), r  # lost within the heartbeat timeout: right
        time.sleep(max(0.0, 5 - (time.monotonic() - t0)))
        netns_hosts.heal(h)
        seen["spawn right after heal"] = d("spawn")
        time.sleep(2)
        seen["spawn 2 s later"] = d("spawn")
    finally:
        if netns_hosts.is_cut(h):
            netns_hosts.heal(h)
        d.close()
        log = ls.stop()
    assert "error" not in seen["spawn 2 s later"], (seen, log)
    assert "another controller" not in str(seen), (seen, log)


def test_a_lost_host_reports_each_failed_rank_once(netns_hosts, config_dir):
    """Two proc meshes (one rank each) on one attached host; the host is cut while nothing runs.
    The next call on the second mesh should name its one rank once. Seen in the review (a cut while
    a second spawn was in flight): "2 rank(s) of mesh 'procs0' failed while nothing was waiting on
    it: [hosts=0,gpus=0] ... [hosts=0,gpus=0] ...": the unhandled faults of two meshes merged under
    the first mesh's name, the same coordinates twice."""
    h = netns_hosts[1]
    ls = Listener(h, 6104)
    d = Driver()
    try:
        d(f"job {ls.addr}")
        r = d("agents 30")
        assert "error" not in r, r
        for _ in range(2):
            r = d("spawn")
            assert "error" not in r, r
        netns_hosts.cut(h)
        time.sleep(6)  # past the heartbeat timeout: both meshes' ranks fail with nothing waiting
        after = d("call 10")
    finally:
        if netns_hosts.is_cut(h):
            netns_hosts.heal(h)
        d.close()
        ls.stop()
    err = after.get("error", "")
    assert err, after
    # both meshes lost their rank while nothing waited: one held error names each mesh's rank once
    assert err.count("'procs0' [hosts=0,gpus=0]") == 1 and err.count("'procs1' [hosts=0,gpus=0]") == 1, err
    assert "of meshes 'procs0', 'procs1'" in err, err


# -- finding 3: SIGTERM to a listener ends its session silently: the controller blames the network -----
def test_a_listener_stopped_mid_session_says_so(netns_hosts, config_dir):
    """SIGTERM the listener while its session runs a call: the call fails (right) and should say the
    agent is exiting because its listener was stopped, as a SLURM agent says "it got SIGTERM".

    Now: the session agent just sees EOF on its stdin and exits; the controller waits out the
    heartbeat timeout and says "host ... unreachable (no answer to heartbeats)", which sends the user
    after the network. Same for kill -9 of the session agent (the listener sees "exit -9" and says
    nothing to the controller)."""
    ls = Listener(netns_hosts[2], 6102)
    d = Driver()
    try:
        d(f"job {ls.addr}")
        r = d("agents 30")
        assert "error" not in r, r
        r = d("spawn")
        assert "error" not in r, r
        d.send("nap 30")
        time.sleep(0.5)
        os.kill(ls.pid, signal.SIGTERM)
        r = d.read()
    finally:
        d.close()
        log = ls.stop()
    err = r.get("error", "")
    assert err, r
    assert "unreachable" not in err and "exiting" in err, (err, log)


@pytest.mark.parametrize("how", ["listener_stopped", "session_agent_killed"])
def test_an_ended_session_leaves_no_shared_memory_on_its_host(netns_hosts, config_dir, how):
    """A session agent sweeps its session's /dev/shm segments only when orphaned (its stdin's EOF): one
    ended by SIGTERM (its listener stopped) or killed left them, there for good. The listener now
    sweeps them whenever a session ends."""
    ls = Listener(netns_hosts[2], 6109)
    d = Driver()
    segment = ""
    try:
        assert "error" not in d(f"job {ls.addr}")
        assert "error" not in d("agents 30")
        assert "error" not in d("spawn")
        segment = _plant_segment(d)
        if how == "listener_stopped":
            os.kill(ls.pid, signal.SIGTERM)
            ls.p.wait(20)
        else:
            session = next(ln for ln in ls.lines if "session pid" in ln).split("session pid ")[1].split(")")[0]
            os.kill(int(session), signal.SIGKILL)
            deadline = time.monotonic() + 15
            while not any("session ended" in ln for ln in ls.lines) and time.monotonic() < deadline:
                time.sleep(0.1)
        left = os.path.exists(segment)
    finally:
        d.close()
        log = ls.stop()
        if segment and os.path.exists(segment):
            os.unlink(segment)
    assert not left, log


# -- finding 4: %mesh up --attach to a wrong address blocks the notebook for 5 minutes -------------------
def test_mesh_up_attach_to_nothing_fails_within_a_minute(netns_hosts, config_dir):
    """``%mesh up --attach tcp://IP:PORT`` with nothing listening there: MeshRegistry.up gives every
    non-local job 300 s (meant for a SLURM queue), so the cell hangs 5 minutes before the (clear)
    error. attach_to_workers' own default is 60 s; a refused TCP connect could even fail at once.
    The near-hosts wait (60 s) is cut to 5 s here: were the attach given the queued jobs' wait, the
    cell would still block past the 90 s limit."""
    code = (
        "import time\n"
        "from jupyter_mesh.notebook import meshes\n"
        "from jupyter_mesh.notebook.meshes import MeshRegistry, JobSpec\n"
        "meshes.NEAR_TIMEOUT = 5.0\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    MeshRegistry().up('m', 1, 'procs', 1, [], where=JobSpec('attach', ['tcp://{netns_hosts[3].ip}:6999']))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, round(time.monotonic() - t0), str(e)[:200])\n"
    )
    try:
        p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=90, env=_env())
    except subprocess.TimeoutExpired:
        pytest.fail("%mesh up --attach to an address where nothing listens was still waiting after 90 s")
    assert p.stdout.startswith("MeshTimeoutError"), (p.stdout, p.stderr[-2000:])


# -- finding 5: a SLURM job that can never start waits out the whole timeout -----------------------------
def test_a_slurm_job_that_can_never_start_fails_fast(netns_hosts, slurm, config_dir):
    """nodes=5 on a 4-node partition: SLURM says at once it is PENDING (PartitionNodeLimit), a state
    it never leaves. agents() should fail within seconds naming that reason, not after its timeout
    (300 s under ``%mesh up --slurm``). Same for PartitionConfig, ReqNodeNotAvail with no nodes,
    AssocMaxNodesPerJobLimit, BadConstraints, ..."""
    code = (
        "import time\n"
        "from jupyter_mesh import SlurmJob\n"
        "job = SlurmJob(nodes=5, partition='debug', time='00:05:00')\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    job.agents(60)\n"
        "except Exception as e:\n"
        "    print(round(time.monotonic() - t0), type(e).__name__, str(e)[:300].replace(chr(10), ' '))\n"
        "job.stop()\n"
    )
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, env=_env(**slurm.env))
    assert p.returncode == 0 and p.stdout, p.stderr[-2000:]
    # failed on SLURM's reason ("cannot start"), not at the end of its 60 s wait (a MeshTimeoutError)
    assert "MeshError SLURM job" in p.stdout and "cannot start" in p.stdout, p.stdout
    # SLURM 22.05 names it PartitionConfig at first, PartitionNodeLimit a moment later: both never clear
    assert "PartitionNodeLimit" in p.stdout or "PartitionConfig" in p.stdout, p.stdout
    assert slurm.job_ids() == []


# -- finding 6: a controller killed under SLURM leaves its session's job key behind ----------------------
def test_a_killed_controllers_job_key_does_not_outlive_it(netns_hosts, slurm, config_dir):
    """kill -9 a controller running a SlurmJob: its agents and the SLURM job go within ~10 s (right),
    but <config>/jobs/<token>.key (the session's signing and CURVE keys, on a file system clusters
    share) and its .json stay forever. The next SlurmJob (or ``jupyter-mesh status``) should sweep
    keys whose controller_pid (in the .json) is dead on this host."""
    code = (
        "import sys\n"
        "from jupyter_mesh import SlurmJob\n"
        "job = SlurmJob(nodes=1, partition='debug', time='00:05:00')\n"
        "job.agents(60)\n"
        "print('up', flush=True)\n"
        "sys.stdin.read()\n"
    )
    p = subprocess.Popen(
        [PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(**slurm.env)
    )
    try:
        assert p.stdout.readline().strip() == "up"
        # every agent read its key: it left the disk already; the job's record stays while it runs
        assert [n for n in os.listdir(config_dir / "jobs") if n.endswith(".key")] == []
        assert len([n for n in os.listdir(config_dir / "jobs") if n.endswith(".json")]) == 1
        p.kill()
        p.wait(10)
        deadline = time.monotonic() + 30
        while slurm.job_ids() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert slurm.job_ids() == []  # SLURM side: fine
        again = (
            "from jupyter_mesh import SlurmJob\n"
            "job = SlurmJob(nodes=1, partition='debug', time='00:05:00')\n"
            "job.agents(60)\n"
            "job.stop()\n"
        )
        subprocess.run([PY, "-c", again], check=True, timeout=120, env=_env(**slurm.env), capture_output=True)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        p.stdin.close()
        p.stdout.close()
    left = [n for n in os.listdir(config_dir / "jobs") if n.endswith((".key", ".json"))]
    assert left == [], f"a dead controller's job key is still there: {left}"


# -- finding 7: %mesh up --slurm --partition refuses real SLURM partition names ---------------------------
@pytest.mark.parametrize("partition", ["gpu-a100", "long.q", "debug"])
def test_mesh_up_slurm_takes_slurm_partition_names(partition):
    """``--partition`` is checked as a *mesh* name (a Python identifier): "gpu-a100" (common) is
    refused with "is not a valid mesh name". SlurmJob itself takes ``[\\w.@+-]{1,64}``."""
    from jupyter_mesh.notebook.magic_args import build_parsers

    line, _ = build_parsers()
    args = line.parse_args(["up", "--slurm", "--partition", partition])
    assert args.partition == partition


# -- finding 8: key files: refused, but some refusals mislead or hang ------------------------------------
def _listen_with(key: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [PY, "-m", "jupyter_mesh.cli", "agent", "--listen", "tcp://127.0.0.1:17999", "--key-file", key],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
        )
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture
def private_dir(tmp_path):
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    real = d / "mesh.key"
    subprocess.run([PY, "-m", "jupyter_mesh.cli", "keygen", str(real)], check=True, timeout=60, capture_output=True)
    return d


def test_a_symlinked_key_file_is_refused_naming_the_link(private_dir):
    """Now: ``OSError: [Errno 40] Too many levels of symbolic links`` (O_NOFOLLOW's ELOOP) and a traceback."""
    link = private_dir / "link.key"
    link.symlink_to(private_dir / "mesh.key")
    r = _listen_with(str(link))
    assert r is not None and r.returncode != 0
    assert "Too many levels" not in r.stderr and ("symlink" in r.stderr or "symbolic link" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_key_file_of_another_user_says_whose_it_is(private_dir):
    """Now: "... (mode 600, owner 65534) ...; `chmod 600 F`": chmod is no fix for another owner."""
    key = private_dir / "mesh.key"
    os.chown(key, 65534, 65534)
    r = _listen_with(str(key))
    assert r is not None and r.returncode != 0
    assert "chown" in r.stderr or "owned by" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_key_file_that_is_a_fifo_is_refused_not_waited_on(private_dir):
    """``os.open(O_RDONLY)`` of a FIFO blocks until a writer comes: the agent hangs before it ever
    checks the file (``--key-file <(cat key)`` or a stray pipe). Open with O_NONBLOCK, check S_ISREG
    on the fd, then read."""
    fifo = private_dir / "fifo.key"
    os.mkfifo(fifo, 0o600)
    r = _listen_with(str(fifo), timeout=10)
    assert r is not None, "the agent hung opening a FIFO as its key file"
    assert r.returncode != 0 and "not a private key file" in r.stderr, r.stderr


def test_a_bad_key_file_is_one_line_not_a_traceback(private_dir):
    """The CLI prints a traceback for every refusal (group-readable, bad JSON, a bad --listen
    address); the message at its end is good: print only it (``sys.exit(f"jupyter-mesh agent: {e}")``)."""
    key = private_dir / "mesh.key"
    os.chmod(key, 0o640)
    r = _listen_with(str(key))
    assert r is not None and r.returncode != 0 and "chmod 600" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o640  # never "fixed" behind the user's back


def test_a_key_file_with_malformed_curve_keys_is_refused_as_a_key_file(private_dir):
    """Now: CURVE keys of the wrong length pass read_key_file and fail later in zmq as
    ``ZMQError: Invalid argument``: check them (40 Z85 chars each) where the file is read."""
    bad = private_dir / "bad.key"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"key": "00" * 32, "curve": ["a", "b", "c", "d"]}, f)
    r = _listen_with(str(bad))
    assert r is not None and r.returncode != 0
    assert "not a jupyter_mesh key file" in r.stderr, r.stderr


# -- finding 9: --listen tcp://0.0.0.0:PORT starts, then silently drops every attach --------------------
def test_listening_on_all_interfaces_works_or_is_refused_clearly(netns_hosts, config_dir):
    """``jupyter-mesh agent --listen tcp://0.0.0.0:6000`` (what one types in a container) says
    "waiting to be attached at tcp://0.0.0.0:6000", but every attach is signed for the address the
    controller dialled (tcp://10.213.0.x:6000), so the listener drops it as misaddressed, logs
    nothing, and the controller times out blaming the key or the network. The same happens behind
    any port mapping (docker -p, NAT). Either refuse a wildcard/unspecified bind at start ("give the
    IP controllers reach this host at") or accept an attach addressed to any of our IPs at our port
    (and advertise the session on the interface the controller's packets came in by)."""
    h = netns_hosts[2]
    p = netns.run_in(
        h,
        [PY, "-m", "jupyter_mesh.cli", "agent", "--listen", "tcp://0.0.0.0:6105"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    d = Driver()
    try:
        try:
            rc = p.wait(5)  # refused at start: fine, if it says why
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            d(f"job tcp://{h.ip}:6105")
            r = d("agents 30")  # a loaded 2-core box starts the agent slowly
    finally:
        d.close()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        out = p.communicate(timeout=20)[0].decode()
    if rc is not None:
        assert rc != 0 and "0.0.0.0" in out and "Traceback" not in out, out
    else:
        assert "error" not in r, (r, out)
