"""A real SLURM on one machine: munged and slurmctld in the root namespace, one slurmd per namespace host.

Why: `SlurmJob` must be tested against the scheduler it will meet (Debian 12's slurm-wlm 22.05), not a
fake: real sbatch/srun/squeue/scancel, job steps started by a slurmd on another "host" (a network
namespace with its own address). Everything lives in one temp dir (config, munge key and socket, state,
spool, logs) and every client finds it through ``SLURM_CONF``, so /etc/slurm and a system munged are
never read or touched.

Nodes are ``n0``, ``n1``, ... on the hosts of a `netns.Hosts` (``n<i>`` at ``hosts[i].ip``), all in
partition ``debug`` (the default). slurmctld listens on a non-default port (`CTLD_PORT`) so a system
slurmctld, if any, is never reached by mistake; each slurmd listens on 6818 in its own namespace.

Behaviour measured here (slurm-wlm 22.05.8), worth knowing when writing `SlurmJob` and its tests:
- start-up (munged, slurmctld, 4 slurmd, all idle) ~0.3 s; `sbatch` to RUNNING ~0.5-0.8 s; `srun -N2`
  ~0.1 s; `scancel` to gone from squeue ~0.1 s (KillWait=2).
- squeue lists pending/running/completing jobs only: a finished or cancelled job prints nothing; use
  ``squeue -t all -j ID`` (state kept MinJobAge=300 s) or ``scontrol show job ID`` to see CANCELLED.
- srun forwards its stdin to *every* task by default (``--input=0`` for rank 0 only); tasks get pipes,
  not a tty, so a Python task's print is block-buffered unless flushed (or PYTHONUNBUFFERED, which
  the job inherits like the rest of the submitting environment, SLURM_CONF included).
- ``srun --jobid=ID --overlap`` starts a step in a running allocation at once, even when the
  allocation's CPUs are taken; without --overlap it waits for free CPUs.
- kill -9 of srun ends its tasks within ~0.1 s; kill -9 of one task leaves the other tasks and srun
  running unless ``--kill-on-bad-exit=1``; a host cut off for 8 s keeps its step (output arrives after
  the heal); cut off longer than SlurmdTimeout (60 s here), the node goes DOWN and its jobs die.
- Task env: SLURM_LAUNCH_NODE_IPADDR / SLURM_SRUN_COMM_HOST = 10.213.0.1 (the controller side),
  SLURMD_NODENAME = n<i>; every namespace host has the same hostname.

Set-up first kills daemons a killed run left (found by the temp-dir prefix on their command line) and
removes its dirs; that is safe because `netns.Hosts` holds the machine-wide lock for the whole run.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence

import netns

TMP_PREFIX = "jm-slurm-"
CTLD_PORT = 17817
DAEMONS = ("munged", "slurmctld", "slurmscriptd", "slurmd", "slurmstepd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")


class SlurmError(RuntimeError):
    """The local SLURM did not start, did not answer, or did not stop cleanly."""


def missing_binaries() -> list[str]:
    """Programs this module needs that are not on PATH (install them with `make cluster`)."""
    need = ("munged", "mungekey", "slurmctld", "slurmd", *CLIENTS, "nsenter", "ip")
    return [b for b in need if shutil.which(b) is None]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _environ(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def daemons_of(marker: str, namespaces: Sequence[str] = ()) -> list[tuple[int, str]]:
    """SLURM/munge daemons (pid, name) that are ours: ``marker`` (a temp-dir path or prefix) on their
    command line or in their environment (slurmctld's helper renames itself ": slurmscriptd"), or
    running inside one of ``namespaces`` (slurmstepd)."""
    inodes = set()
    for name in namespaces:
        try:
            inodes.add(os.stat(f"{netns.NETNS_DIR}/{name}").st_ino)
        except OSError:
            pass
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        comm = _comm(pid)
        if comm not in DAEMONS or not netns.alive(pid):
            continue
        if marker in netns.cmdline(pid) or marker in _environ(pid) or (inodes and _netns_inode(pid) in inodes):
            found.append((pid, comm))
    return sorted(found)


def _kill_and_wait(pids: Sequence[int], timeout: float) -> list[int]:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    left = [p for p in pids if netns.alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if netns.alive(p)]
    return left


def clean_stale(tmp_root: str | None = None) -> None:
    """Kill daemons and remove temp dirs a killed run left. Only while holding the netns lock."""
    tmp_root = tmp_root or tempfile.gettempdir()
    stale = daemons_of(os.path.join(tmp_root, TMP_PREFIX))
    left = _kill_and_wait([p for p, _ in stale], 5.0)
    if left:
        raise SlurmError(f"daemons of an earlier run would not die: {left}; kill them by hand (kill -9)")
    for d in glob.glob(os.path.join(tmp_root, TMP_PREFIX + "*")):
        shutil.rmtree(d, ignore_errors=True)


def _detected_cpus() -> int:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    for word in out.split():
        if word.startswith("CPUs="):
            return int(word.split("=", 1)[1])
    return os.cpu_count() or 1


def client_environ(extra: dict[str, str]) -> dict[str, str]:
    """os.environ without a surrounding allocation's SLURM_* variables, plus ``extra``: a client
    started from inside some other job must still talk to this cluster only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}
    env.update(extra)
    return env


class SlurmCluster:
    """munged + slurmctld + one slurmd per namespace host; a context manager.

    `env` is what a client needs on top of its environment (``SLURM_CONF``); `environ()` is a whole
    environment for a subprocess. Timings of the last start and stop: `setup_s`, `teardown_s`."""

    def __init__(
        self,
        hosts: netns.Hosts,
        *,
        cpus_per_node: int | None = None,
        memory_mb: int = 1024,
        partition: str = "debug",
        slurmd_timeout: int = 60,
        ready_timeout: float = 30.0,
    ) -> None:
        self.hosts = hosts
        self.partition = partition
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.slurmd_timeout = slurmd_timeout  # a node cut off longer than this goes DOWN, its jobs are killed
        self.ready_timeout = ready_timeout
        self.nodes = [f"n{h.index}" for h in hosts]
        self._addr = {f"n{h.index}": h.ip for h in hosts}
        self.controller_host = socket.gethostname().split(".")[0]  # slurmctld checks it is this host (`hostname -s`)
        self.controller_ip = hosts.bridge_ip
        self.dir = ""
        self.env: dict[str, str] = {}
        self.setup_s = self.teardown_s = 0.0
        self._procs: dict[str, subprocess.Popen] = {}

    # -- names -----------------------------------------------------------------------------------

    def node_addr(self, name: str) -> str:
        try:
            return self._addr[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; the nodes are {self.nodes}") from None

    def host_of(self, node: str) -> netns.Host:
        return self.hosts.by_ip(self.node_addr(node))

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, "slurm.conf")

    def _p(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -- clients ---------------------------------------------------------------------------------

    def environ(self) -> dict[str, str]:
        return client_environ(self.env)

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, check: bool = True, **kw
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client (``["squeue", ...]``) against this cluster; SlurmError with its stderr
        on a non-zero exit when ``check``."""
        kw.setdefault("env", self.environ())
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed (rc={r.returncode}): {r.stderr.strip()}")
        return r

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job_ids(self) -> list[str]:
        return self.run(["squeue", "-h", "-o", "%i"]).stdout.split()

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, nodelist) of a job as squeue shows it; ("", "") once it has left squeue."""
        out = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%N"], check=False).stdout.strip()
        state, _, nodes = out.partition("|")
        return state, nodes

    def wait_job_state(self, job_id: str, states: Sequence[str], timeout: float = 30.0) -> tuple[str, str]:
        """Wait (bounded) until the job is in one of ``states`` ("" = gone from squeue)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.job_state(job_id)
            if got[0] in states:
                return got
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"job {job_id} is {got[0] or 'gone'!r} after {timeout:.0f} s, not one of {list(states)}; "
                    f"see {self._p('log', 'slurmctld.log')}"
                )
            time.sleep(0.1)

    # -- lifecycle -------------------------------------------------------------------------------

    def _write_conf(self, cpus: int) -> None:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self._addr[n]} CPUs={cpus} RealMemory={self.memory_mb} State=UNKNOWN"
            for n in self.nodes
        )
        conf = f"""\
# written by tests/cluster/slurm.py; clients find it through SLURM_CONF
ClusterName=jmtest
SlurmctldHost={self.controller_host}({self.controller_ip})
SlurmctldPort={CTLD_PORT}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout={self.slurmd_timeout}
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as f:
            f.write(conf)
        open(self._p("plugstack.conf"), "w").close()

    def _spawn(self, key: str, argv: list[str]) -> subprocess.Popen:
        log = open(self._p("log", f"{key}.out"), "wb")
        try:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.environ(), "SLURM_CONF": self.conf},
                start_new_session=True,  # a Ctrl-C of pytest reaches the teardown, not the daemons
            )
        finally:
            log.close()
        self._procs[key] = p
        return p

    def _wait(self, what: str, pred, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            for key, p in self._procs.items():
                if p.poll() is not None:
                    raise SlurmError(f"{key} exited (rc={p.returncode}) while waiting for {what}\n{self._logs()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}\n{self._logs()}")
            time.sleep(0.05)

    def _logs(self, lines: int = 15) -> str:
        out = []
        for path in sorted(glob.glob(self._p("log", "*"))):
            with open(path, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
            if tail:
                out.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out) or f"(no logs under {self._p('log')})"

    def start(self) -> SlurmCluster:
        if self.hosts._lock_fd is None:
            raise SlurmError("the namespace hosts are not set up: start netns.Hosts first (it holds the lock)")
        missing = missing_binaries()
        if missing:
            raise SlurmError(f"missing programs {missing}: install them with `make cluster` (apt slurm-wlm munge)")
        t0 = time.monotonic()
        clean_stale()
        self.dir = tempfile.mkdtemp(prefix=TMP_PREFIX)
        self.env = {"SLURM_CONF": self.conf}
        try:
            self._start()
        except BaseException:
            self.stop(check=False)
            raise
        self.setup_s = time.monotonic() - t0
        return self

    def _start(self) -> None:
        for sub in ("munge", "state", "spool", "run", "log"):
            os.makedirs(self._p(sub))
        # munged wants its socket dir searchable by all and its key private (0600, not group/world readable)
        os.chmod(self.dir, 0o755)
        os.chmod(self._p("munge"), 0o755)
        key = self._p("munge", "munge.key")
        subprocess.run(["mungekey", "-c", "-k", key], check=True, capture_output=True, timeout=30)
        self._write_conf(self.cpus_per_node or _detected_cpus())
        sock = self._p("munge", "munge.sock")
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={self._p('munge', 'munged.pid')}",
                f"--seed-file={self._p('munge', 'munged.seed')}",
                f"--log-file={self._p('log', 'munged.log')}",
            ],
        )
        self._wait("munged's socket", lambda: os.path.exists(sock), 10.0)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        ping = lambda: "UP" in self.run(["scontrol", "ping"], check=False, timeout=10).stdout  # noqa: E731
        self._wait("slurmctld to answer `scontrol ping`", ping, self.ready_timeout)
        for h, node in zip(self.hosts, self.nodes):
            self._spawn(f"slurmd-{node}", netns.nsenter_argv(h, ["slurmd", "-D", "-N", node, "-f", self.conf]))
        idle = lambda: all(self.node_states().get(n) == "idle" for n in self.nodes)  # noqa: E731
        self._wait(f"nodes {self.nodes} to be idle in sinfo", idle, self.ready_timeout)

    def cancel_all(self, timeout: float = 20.0) -> None:
        """scancel every job and wait (bounded) until squeue lists none."""
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids], check=False)
        self._wait("every job to leave squeue after scancel", lambda: not self.job_ids(), timeout)

    def leftovers(self) -> list[tuple[int, str]]:
        """Our daemons (and slurmstepds in our hosts) still alive."""
        if not self.dir:
            return []
        return daemons_of(self.dir, [h.name for h in self.hosts])

    def stop(self, check: bool = True) -> None:
        """scancel every job, stop the daemons (SIGTERM, then SIGKILL), check that none is left, and
        remove the temp dir (kept, and named in the error, when something is left)."""
        if not self.dir:
            return
        t0 = time.monotonic()
        problems = []
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.cancel_all()
            except (SlurmError, subprocess.TimeoutExpired) as e:
                problems.append(f"jobs did not end: {e}")
        order = [k for k in self._procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for key in order:
            p = self._procs.get(key)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                problems.append(f"{key} (pid {p.pid}) ignored SIGTERM for 5 s; killed")
                p.kill()
                p.wait(timeout=5)
        stray = self.leftovers()  # slurmstepds and job processes outlive slurmd by design
        left = _kill_and_wait([p for p, _ in stray], 5.0)
        if stray:
            problems.append(f"left after the daemons stopped (killed): {stray}")
        if left:
            problems.append(f"would not die: {left}")
        self._procs.clear()
        self.teardown_s = time.monotonic() - t0
        if problems and check:
            raise SlurmError("; ".join(problems) + f"\nlogs kept in {self.dir}\n{self._logs()}")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = ""

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
