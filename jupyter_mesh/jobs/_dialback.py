"""What every dial-back job shares (``SlurmJob``, ``TorchXJob``): its files under the config dir.

A scheduler starts ``jupyter-mesh agent --key-file F --host-index I`` on each host; the agent reads the
*job key* F (this session's keys, the controller's address, the job's nonce), dials back and says
hello with ``NONCE/I``. Three files per job, in ``<config dir>/jobs/`` (0700), named by a random token:

* ``TOKEN.key``: the job key, 0600, deleted once every agent has read it or when the job stops;
* ``TOKEN.json``: a record (which scheduler and job, where the controller is, which hosts) that
  ``jupyter-mesh status`` lists, and from which the next job sweeps the key of a controller killed
  without stopping (``kill -9``);
* ``TOKEN.log``: where the scheduler puts the agents' output, kept after the job for a post-mortem.

Keys never go on a command line or in the environment: ``ps`` and ``/proc`` show those to every user.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.context import host_key
from .._core.future import Future
from .._runtime.hosts import AgentHandle
from .._wire.addresses import host_of
from .._wire.keyfile import KeyFile, config_dir, write_key_file
from .._wire.protocol import VERSION, Kind
from ..errors import MeshTimeoutError, MeshValueError
from .warm import split

if TYPE_CHECKING:
    from .._runtime.controller import Controller

__all__ = [
    "ENDED",
    "SLURM_JOB_ID",
    "JobFiles",
    "jobs_dir",
    "kept_job_ended",
    "stop_agents",
    "sweep_stale",
    "unlink",
    "wait_agents",
]


class JobFiles:
    """One dial-back job's key, record and log paths, and the waiters for its ``nodes`` agents."""

    def __init__(self, controller: Controller, scheduler: str, nodes: int, what: str, token: str | None = None):
        """``token``: the files of an existing job (a kept job taken back), else a new one."""
        if controller.transport.curve is None:
            raise MeshValueError(f"{what} needs a CURVE session (JUPYTER_MESH_INSECURE is set): refused")
        self.controller = controller
        self.scheduler = scheduler
        self.nodes = nodes
        self.token = token or secrets.token_hex(8)
        self.dir = jobs_dir()
        self.created = time.time()
        if token is None:
            sweep_stale(self.dir)
        self.key_path = os.path.join(self.dir, f"{self.token}.key")
        self.log_path = os.path.join(self.dir, f"{self.token}.log")
        self.state_path = os.path.join(self.dir, f"{self.token}.json")

    def write_key(self, preload: Sequence[str] | None, keep_alive: bool = False) -> list[Future[dict[str, Any]]]:
        """Write the job key (0600) and start waiting for every host's hello (``TOKEN/INDEX``).
        ``preload``: None warms each host with what it has installed (``jobs.warm``).
        ``keep_alive``: the agents outlive the controller, waiting for the next (``kept``)."""
        named, warm = split(preload)
        ctl = self.controller
        assert ctl.transport.curve is not None  # checked in __init__
        write_key_file(
            self.key_path,
            KeyFile(
                ctl.key,
                ctl.transport.curve,
                {
                    "v": VERSION,
                    "controller": ctl.address,
                    "nonce": self.token,
                    "hb_timeout": ctl.hb_timeout,
                    "preload": named,
                    "warm": warm,
                    "keep_alive": keep_alive,
                },
            ),
        )
        return [ctl.expect_agent(f"{self.token}/{i}") for i in range(self.nodes)]

    def stop_expecting(self) -> None:
        """A hello still on its way is told to shut down, not admitted (the job stopped first)."""
        for i in range(self.nodes):
            self.controller.stop_expecting(f"{self.token}/{i}")

    def save_record(self, job_id: str | None, agents: Sequence[AgentHandle] = (), **extra: Any) -> None:
        """The record ``jupyter-mesh status`` and the next job's sweep read (written atomically, 0600)."""
        record = {
            "scheduler": self.scheduler,
            "job_id": job_id,
            "nodes": self.nodes,
            "controller": self.controller.address,
            "controller_pid": os.getpid(),
            "controller_host": host_key(),  # a shared home may hold records of other login nodes' controllers
            "agents": [a.addr for a in agents],
            "hosts": [host_of(a.addr) for a in agents],
            "created": self.created,
            **extra,
        }
        tmp = f"{self.state_path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.state_path)

    def key_read(self) -> None:
        """Every agent has read the key: the session's keys leave the disk."""
        unlink(self.key_path)

    def cleanup(self) -> None:
        """The job is over: its key and record go (its log stays)."""
        for p in (self.key_path, self.state_path):
            unlink(p)

    def log_tail(self, n: int = 15, path: str | None = None) -> str:
        try:
            with open(path or self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:]) or "(empty)"
        except OSError:
            return "(no output yet)"


def wait_agents(
    waiters: Sequence[Future[dict[str, Any]]],
    timeout: float,
    check: Callable[[int], None],
    timed_out: Callable[[int], str],
) -> list[AgentHandle]:
    """Wait for every host's hello, in host order. Between polls (twice a second) ``check(i)`` asks the
    scheduler whether host ``i``'s agent can still come, and raises if not (the job ended, it can never
    start): a dead job fails at once instead of at the deadline. At the deadline, a timeout error whose
    detail is ``timed_out(i)``."""
    deadline = time.monotonic() + timeout
    out = []
    for i, w in enumerate(waiters):
        while True:
            try:
                h = w.get(min(0.5, max(0.01, deadline - time.monotonic())))
                break
            except MeshTimeoutError:
                pass
            check(i)
            if time.monotonic() >= deadline:
                raise MeshTimeoutError("spawn", timeout, timed_out(i))
        out.append(AgentHandle(i, h["addr"], h["pid"], h["hk"]))
    return out


def stop_agents(controller: Controller, agents: Sequence[AgentHandle]) -> None:
    """Tell a job's agents to stop their procs and exit ("we are still here, stop"), and stop
    heartbeating them; what the scheduler does next (cancel, wait) is the job's."""
    from .._wire.transport import Message  # zmq: imported with a job, not the package

    if not controller.is_closed:
        controller.agents_stopping([a.addr for a in agents])
    for a in agents:
        try:
            if not controller.is_closed:
                controller.transport.send(a.addr, Message({"k": Kind.SHUTDOWN}))
        except Exception:  # noqa: BLE001 - the scheduler's cancel ends it anyway
            pass
    if not controller.is_closed:
        controller.forget_agents([a.addr for a in agents])


def jobs_dir() -> str:
    """``<config dir>/jobs`` (0700), made if missing."""
    d = os.path.join(config_dir(), "jobs")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def sweep_stale(jobs_dir: str) -> list[str]:
    """Job keys and records of controllers of this host that died without stopping (``kill -9``):
    their jobs end on their own (the agents stop hearing heartbeats), their keys must not stay; and
    those of kept jobs SLURM says ended. Returns the kept jobs swept ("SLURM job 12 (CANCELLED)")."""
    ended = []
    for name in os.listdir(jobs_dir):
        token, ext = os.path.splitext(name)
        if ext != ".json":
            continue
        path = os.path.join(jobs_dir, name)
        try:
            with open(path) as f:
                rec = json.load(f)
            if not isinstance(rec, dict):
                continue  # not one of our records: left alone
            if rec.get("keep_alive") is True:  # outlives its controller on purpose, until its job ends
                state = kept_job_ended(rec)
                if state is None:
                    continue
                ended.append(f"SLURM job {rec['job_id']} ({state or 'no longer known to SLURM'})")
                raise ProcessLookupError
            pid = int(rec["controller_pid"])
            if rec.get("controller_host") != host_key():
                continue  # another machine's controller: its pid means nothing here
            os.kill(pid, 0)
            continue  # its controller lives
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, or a pid we may not signal (alive): left alone
        unlink(os.path.join(jobs_dir, token + ".key"))
        unlink(path)
    return ended


def kept_job_ended(rec: dict[str, Any]) -> str | None:
    """The state a kept job ended in ("" when SLURM no longer knows it), or None while the scheduler
    still has it — or cannot say (slurmctld down, no SLURM client here, a record that names no job
    id): only SLURM saying the job ended, or that it forgot it, makes its key go."""
    job_id = str(rec.get("job_id"))
    if rec.get("scheduler") != "slurm" or not SLURM_JOB_ID.fullmatch(job_id):
        return None
    import subprocess

    try:
        p = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return "" if "Invalid job id specified" in p.stderr else None  # SLURM forgot it, or cannot say
    state = (p.stdout.split() or [""])[0]
    return state if not state or state in ENDED else None


SLURM_JOB_ID = re.compile(r"\d{1,12}(_\d{1,9})?")
"""What a SLURM job id looks like (an array task: ``12_3``); a record's is checked against it."""

ENDED = ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL")
"""SLURM job states it does not leave."""
