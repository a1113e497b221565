"""``SlurmJob``: hosts from a real SLURM allocation, one agent per node.

SLURM places the hosts; we only start our agent on each (``srun``), and the agent starts procs on the
node it runs on. The agents dial back: each reads a *job key* (``_wire.keyfile``: this session's keys,
0600, deleted when the job stops) from the user's config directory, which a cluster shares with its
nodes like the home directory it lives in, and advertises the IP its route to the controller leaves
by. Outside an allocation the job is one ``sbatch``; inside one (``SLURM_JOB_ID`` set) it is a step
of it (``srun --overlap``), and stopping ends the step, not the user's allocation.

By default nothing outlives the controller: its agents exit when its heartbeats stop, their
``srun`` then ends, and so does the batch job. ``scancel`` from outside, a node that dies or is cut
off: the ranks on it fail with what SLURM says (``squeue``).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._api.host_mesh import HostMesh
from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.future import Future
from .._core.shape import Shape
from .._runtime.hosts import AgentHandle, Job
from .._wire.addresses import parse_tcp
from .._wire.keyfile import read_key_file
from ..errors import MeshClosedError, MeshError, MeshValueError
from ._dialback import ENDED, JobFiles, jobs_dir, stop_agents, sweep_stale, unlink, wait_agents
from ._monarch import JobState, mesh_slices, monarch_positional, slurm_from_monarch
from .kept import Restored, detach_agents, kept_records, reattach_agents, restore_meshes, saved_meshes, when_created

__all__ = ["SlurmJob"]

# PENDING for a reason it never leaves without an admin: fail at once, naming it, instead of at the timeout
_NEVER = (
    "PartitionNodeLimit",
    "PartitionConfig",
    "PartitionDown",
    "PartitionInactive",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AssocMaxNodesPerJobLimit",
    "AssocMaxCpuPerJobLimit",
    "QOSMaxNodePerJobLimit",
    "ReqNodeNotAvail, UnavailableNodes:",
)
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


def _monarch_form(init: Any) -> Any:
    """``SlurmJob({"mesh0": 2}, "python3", [...])``: after a mapping of meshes (Monarch's first argument),
    positional arguments are Monarch's, in its order (``_monarch.monarch_positional``)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1 and isinstance(args[0], Mapping):
            args, kwargs = args[:1], monarch_positional(args[1:], kwargs)
        init(self, *args, **kwargs)

    return wrapper


MONARCH_KEYWORDS = frozenset(inspect.signature(slurm_from_monarch).parameters) - {"meshes"}
"""Monarch's ``SlurmJob`` keywords that ours takes through ``**monarch``."""


class SlurmJob(Job):
    """``nodes`` hosts from SLURM, one jupyter_mesh agent on each.

    ``partition``, ``time`` (``"HH:MM:SS"``), ``account`` and ``slurm_args`` (more ``sbatch``
    options, e.g. ``["--gres=gpu:4"]``) go to ``sbatch``. ``bind``: this host's IP the nodes reach
    (default: the one on the route to ``slurmctld``). ``python``: the interpreter on the nodes
    (default: this one; a cluster shares it through the file system). Inside an allocation
    (``SLURM_JOB_ID`` set) the agents are a step of it unless ``use_allocation=False``.
    ``preload``: what each node's template imports; by default each imports torch and what this
    program imported of ``jobs.warm``'s list, those the node has, in the background (``[]``: nothing).
    ``keep_alive``: the job outlives this controller (a kernel restart or crash: its agents keep their
    procs) until SLURM ends it or ``stop()``; ``SlurmJob.reattach()`` in the next kernel takes it back.

    Monarch's form works too: ``SlurmJob(meshes={"trainers": 2}, job_name=..., time_limit=...,
    gpus_per_node=8, cpus_per_task=, mem=, qos=, exclusive=, python_exe=)``, positional arguments after the
    meshes in Monarch's order, its host meshes by name from
    ``state()`` (``jobs._monarch`` says which of its keywords are refused here, and why). Unlike
    Monarch's, the job is submitted when it is constructed, and ``exclusive`` is False unless given."""

    extra_keywords = MONARCH_KEYWORDS  # what ``**monarch`` takes (``%mesh up --scheduler`` checks options)

    @_monarch_form
    def __init__(
        self,
        nodes: int | Mapping[str, int] = 1,
        partition: str | None = None,
        time: str | None = "01:00:00",
        account: str | None = None,
        slurm_args: Sequence[str] = (),
        preload: Sequence[str] | None = None,
        bind: str | None = None,
        python: str | None = None,
        name: str = "jupyter-mesh",
        use_allocation: bool | None = None,
        keep_alive: bool = False,
        *,
        meshes: Mapping[str, int] | None = None,
        job_name: str | None = None,
        time_limit: str | None = None,
        python_exe: str | None = None,
        monarch_port: int | None = None,  # Monarch's workers' port: ours dial back, none is opened
        log_dir: str | None = None,  # the output goes to the job's file in ~/.jupyter_mesh/jobs
        **monarch: Any,
    ):
        from .._runtime.controller import Controller

        if isinstance(nodes, Mapping):  # Monarch's first argument: the meshes
            meshes, nodes = nodes, 1
        self._names: dict[str, int] = {"hosts": nodes} if isinstance(nodes, int) else {}
        if meshes is not None or monarch or job_name is not None or time_limit is not None or python_exe:
            unknown = sorted(set(monarch) - MONARCH_KEYWORDS)
            if unknown:
                raise TypeError(
                    f"SlurmJob() got unexpected keyword argument(s) {unknown}; Monarch's are {sorted(MONARCH_KEYWORDS)}"
                )
            m = slurm_from_monarch(
                meshes if meshes is not None else {"hosts": nodes},
                job_name=job_name,
                time_limit=time_limit,
                python_exe=python_exe,
                **monarch,
            )
            nodes, self._names, slurm_args = m.nodes, m.meshes, [*m.sbatch, *slurm_args]
            name, time, python = m.name or name, m.time or time, m.python or python
        if not isinstance(nodes, int) or nodes < 1:
            raise MeshValueError(f"SlurmJob needs nodes >= 1, got {nodes!r}")
        if time is not None and not _TIME.match(time):
            raise MeshValueError(f"time={time!r}: give SLURM's form, e.g. '00:30:00' or '1-00:00:00'")
        for label, value in (("partition", partition), ("account", account), ("name", name)):
            if value is not None and not re.fullmatch(r"[\w.@+-]{1,64}", value):
                raise MeshValueError(f"{label}={value!r} is not a SLURM {label} name")
        if not isinstance(keep_alive, bool):
            raise MeshValueError(f"keep_alive is True or False, got {keep_alive!r}")
        if keep_alive and os.environ.get("SLURM_JOB_ID") and use_allocation is not False:
            raise MeshValueError(
                "keep_alive=True inside an allocation: our step of it would end with this kernel's allocation "
                "anyway; pass use_allocation=False for a batch job of its own"
            )
        self.nodes = nodes
        self.keep_alive = keep_alive
        self.job_id: str | None = None
        self.restored = Restored()  # what reattach() took back
        self._in_allocation = os.environ.get("SLURM_JOB_ID") if use_allocation is not False else None
        if use_allocation and not self._in_allocation:
            raise MeshValueError("use_allocation=True but SLURM_JOB_ID is not set: not inside an allocation")
        ip = bind or _slurmctld_ip()
        self._controller = Controller.reachable_from(ip)
        self._controller.register_job(self)
        self._files = JobFiles(self._controller, "slurm", nodes, "SlurmJob")
        self._key_path = self._files.key_path
        self._log_path = self._files.log_path
        self._lock = threading.Lock()
        self._agents: list[AgentHandle] | None = None
        self._stopped = False
        self._step: subprocess.Popen[bytes] | None = None  # srun inside an allocation
        self._save_state()  # first: a controller killed from here on leaves a record the next sweep finds
        self._waiters: list[Future[dict[str, Any]]] = self._files.write_key(preload, keep_alive)
        agent = [python or sys.executable, "-m", "jupyter_mesh.cli", "agent", "--key-file", self._key_path]
        srun = ["srun", "--ntasks-per-node=1", f"--nodes={nodes}", f"--ntasks={nodes}", "--kill-on-bad-exit=0"]
        try:
            if self._in_allocation:
                self.job_id = self._in_allocation
                with open(self._log_path, "ab") as log:  # the step has its own copy of the descriptor
                    self._step = subprocess.Popen(
                        [*srun, f"--jobid={self.job_id}", "--overlap", *agent],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # a notebook interrupt must not reach it
                    )
            else:
                script = "#!/bin/sh\n" + "exec " + shlex.join([*srun, *agent]) + "\n"
                sbatch = ["sbatch", "--parsable", f"--nodes={nodes}", "--ntasks-per-node=1", f"--job-name={name}"]
                sbatch += [f"--output={self._log_path}"]
                sbatch += [f"--time={time}"] if time else []
                sbatch += [f"--partition={partition}"] if partition else []
                sbatch += [f"--account={account}"] if account else []
                sbatch += list(slurm_args)
                out = _run(sbatch, input=script)
                self.job_id = out.strip().split(";")[0]
        except BaseException:
            self._cleanup_files()
            raise
        self._save_state()

    # -- the Job interface --------------------------------------------------------------------------
    def agents(self, timeout: float = 300.0) -> list[AgentHandle]:
        """Wait until every node's agent reported in; fail at once if SLURM ended the job."""
        with self._lock:
            if self._stopped:
                raise MeshClosedError(f"SLURM job {self.job_id} was stopped; create a new SlurmJob")
            if self._agents is not None:
                return self._agents

            def check(i: int) -> None:
                state, reason = self.slurm_state()
                if state == "PENDING" and reason.startswith(_NEVER):
                    raise MeshError(
                        f"SLURM job {self.job_id} cannot start: it is PENDING ({reason}), which it does not "
                        f"leave by waiting; ask for fewer nodes, another partition, or check the account"
                    )
                if state in ENDED or (state == "" and self._step is None) or self._step_ended():
                    raise MeshError(
                        f"SLURM job {self.job_id} ended ({state or 'gone'}) before the agent of node {i} "
                        f"reported in; its output ({self._log_path}):\n{self._log_tail()}"
                    )

            def timed_out(i: int) -> str:
                state, reason = self.slurm_state()
                return (
                    f"SLURM job {self.job_id} is {state or 'unknown'}{f' ({reason})' if reason else ''}; "
                    f"{i} of {self.nodes} agents reported in. Its output ({self._log_path}):\n{self._log_tail()}"
                )

            out = wait_agents(self._waiters, timeout, check, timed_out)
            self._agents = out
            self._save_state()
            if not self.keep_alive:  # every agent has read it: the session's keys leave the disk (a kept
                self._files.key_read()  # job's stay, 0600, for the kernel that reattaches)
            return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "id": self.job_id}

    def running(self) -> bool:
        return not self._stopped

    def explain_loss(self, addr: str) -> str | None:
        """What SLURM says about a lost host: the job's state when it is no longer running."""
        if not any(a.addr == addr for a in self._agents or []):
            return None
        state, reason = self.slurm_state()
        if state == "COMPLETING":  # what SLURM says of a job it is ending, whatever the cause
            return f"SLURM job {self.job_id} is ending (COMPLETING: scancel, its time limit, or a node failed)"
        if state and state != "RUNNING":
            return f"SLURM job {self.job_id} is {state}{f' ({reason})' if reason else ''}"
        if not state:
            return f"SLURM job {self.job_id} is no longer in the queue (cancelled or ended)"
        return None

    def host_mesh(self) -> HostMesh:
        return HostMesh(self._controller, self, Shape.from_sizes({"hosts": self.nodes}))

    def state(self, cached_path: Any = None) -> JobState:
        """Monarch's: the job's host meshes by name (``state().trainers``; ``hosts`` for ``SlurmJob(n)``),
        each its nodes in order. ``cached_path`` is accepted and unused (``reattach()`` takes a kept job
        back). What SLURM says of the job: :meth:`slurm_state`."""
        if self._stopped:
            raise MeshClosedError(f"SLURM job {self.job_id} was stopped; create a new SlurmJob")
        hosts = self.host_mesh()
        names = getattr(self, "_names", None) or {"hosts": self.nodes}
        if len(names) == 1:
            return JobState({next(iter(names)): hosts})
        return JobState({name: hosts.slice(hosts=part) for name, part in mesh_slices(names).items()})

    def kill(self) -> None:
        """Monarch's name for :meth:`stop`."""
        self.stop()

    def stop(self, timeout: float = 15.0) -> None:
        """Our agents stop their procs; the job (or our step of an allocation) is cancelled and
        waited for, so no SLURM job and no process of ours is left."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if not self._controller.is_closed:
            self._controller.job_stopping(self)  # its meshes are stopped, not failed
        taker = self._taken_by()
        if taker:  # its agents obey the new controller only: the job, its key and record are its now
            if not self._controller.is_closed:
                self._controller.forget_agents([a.addr for a in self._agents or []])
            print(
                f"jupyter_mesh: SLURM job {self.job_id} was taken over by the controller at {taker}: "
                f"left running for it (stop it from there)",
                file=sys.stderr,
            )
            return
        stop_agents(self._controller, self._agents or [])
        deadline = time.monotonic() + timeout
        if self._step is not None:  # our step only: the user's allocation lives on
            while self._step.poll() is None and time.monotonic() < deadline - timeout / 2:
                time.sleep(0.05)
            if self._step.poll() is None:
                self._step.terminate()
                try:
                    self._step.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._step.kill()
                    self._step.wait(5.0)
        elif self.job_id:
            try:
                _run(["scancel", self.job_id])
            except MeshError as e:
                print(f"jupyter_mesh: {e}", file=sys.stderr)
            while time.monotonic() < deadline and self.slurm_state()[0] not in ("", *ENDED):
                time.sleep(0.1)
            state = self.slurm_state()[0]
            if state not in ("", *ENDED):
                print(f"jupyter_mesh: SLURM job {self.job_id} is still {state} after scancel", file=sys.stderr)
        self._cleanup_files()

    # -- kept alive past this controller -----------------------------------------------------------
    def meshes_changed(self) -> None:
        if self.keep_alive and not self._stopped and not self._taken_by():
            self._save_state()

    def _taken_by(self) -> str | None:
        """The controller that took this kept job over (its record names it), or None."""
        if not self.keep_alive:
            return None
        try:
            with open(self._files.state_path) as f:
                ctl = json.load(f).get("controller")
        except (OSError, ValueError, AttributeError):
            return None
        return ctl if isinstance(ctl, str) and ctl != self._controller.address else None

    def detach(self) -> None:
        """This controller goes (a kernel restart or shutdown); the job, its agents and procs stay,
        waiting for ``SlurmJob.reattach()`` until SLURM ends the job (its time limit) or ``stop()``."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        detach_agents(self._controller, self._agents or [])

    @classmethod
    def reattach(
        cls, job_id: str | int | None = None, *, force: bool = False, bind: str | None = None, timeout: float = 30.0
    ) -> SlurmJob:
        """Take over a SLURM job that a kernel now gone kept alive (``keep_alive=True``): its agents,
        and its meshes as they are now (``proc_meshes()``, ``actor_meshes()``; actors keep their state).

        ``job_id``: which one, when several are kept. A job whose controller still runs is refused
        unless ``force=True`` (that controller is then told it lost the job); one whose controller
        went silent a moment ago (a kernel killed) is waited for, at most the heartbeat timeout, until
        it answers (refused) or is taken for dead (taken back); stderr says so. ``timeout`` should
        exceed the heartbeat timeout. Needs a fresh session
        (no meshes of its own yet): the kept job's keys become this session's."""
        from .._runtime.controller import Controller

        d = jobs_dir()
        ended = sweep_stale(d)
        kept, problems = kept_records(d, "slurm")
        if job_id is not None:
            kept = [(t, r) for t, r in kept if str(r.get("job_id")) == str(job_id)]
            ended = [e for e in ended if e.startswith(f"SLURM job {job_id} ")]
        if not kept:
            which = f"SLURM job {job_id}" if job_id is not None else "any SLURM job"
            if ended:
                raise MeshError(
                    f"{', '.join(ended)} ended while no kernel was attached: its agents and meshes are gone "
                    f"(its output: {d}); start a new job"
                )
            if problems:
                raise MeshError(
                    f"no usable record of {which} kept alive in {d}: {'; '.join(problems)}. A record is the job's "
                    f"controller's; fix or delete it (the job itself ends at its time limit, or with scancel)"
                )
            raise MeshError(
                f"no record of {which} kept alive in {d}: a job outlives its kernel only when started with "
                f"SlurmJob(keep_alive=True) (or %mesh up --slurm --keep-alive), and until SLURM ends it"
            )
        if len(kept) > 1:
            ids = ", ".join(str(r.get("job_id")) for _, r in kept)
            raise MeshValueError(f"several SLURM jobs are kept alive ({ids}): pass job_id= to say which")
        token, rec = kept[0]
        job = cls.__new__(cls)
        job.nodes, job.keep_alive, job.job_id = len(rec["agents"]), True, str(rec["job_id"])
        job._in_allocation, job._step, job._waiters = None, None, []
        job._lock, job._agents, job._stopped = threading.Lock(), None, False
        job.restored = Restored()
        state, reason = job.slurm_state()
        if state == "UNKNOWN":
            raise MeshError(
                f"cannot ask SLURM about job {job.job_id} ({reason}); its record and key are kept: try again "
                f"once SLURM answers"
            )
        if state != "RUNNING":
            for ext in (".key", ".json"):
                unlink(os.path.join(d, token + ext))
            raise MeshError(
                f"SLURM job {job.job_id} is {state or 'no longer in the queue'}{f' ({reason})' if reason else ''}: "
                f"its agents and meshes are gone; start a new job"
            )
        kf = read_key_file(os.path.join(d, f"{token}.key"))
        job._controller = ctl = Controller.adopt(kf.key, kf.curve, bind or _slurmctld_ip())
        for other in (j for j in ctl._jobs if isinstance(j, SlurmJob) and j.job_id == job.job_id):
            taker = other._taken_by()  # this session drives it already, or drove it and lost it
            raise MeshValueError(
                f"SLURM job {job.job_id} was taken from this session by the controller at {taker}: take it back "
                f"from a fresh kernel (force=True)"
                if taker
                else f"SLURM job {job.job_id} is attached to this session already: use its SlurmJob "
                f"(proc_meshes(), actor_meshes())"
            )
        job._files = JobFiles(ctl, "slurm", job.nodes, "SlurmJob", token=token)
        job._files.created = when_created(rec.get("created")) or job._files.created
        job._key_path, job._log_path = job._files.key_path, job._files.log_path
        try:
            agents, hosted = reattach_agents(
                ctl,
                token,
                [str(a) for a in rec["agents"]],
                force,
                timeout,
                f"SLURM job {job.job_id}",
                f"`scancel {job.job_id}` ends the job",
            )
        except BaseException:
            job._stopped = True  # this session gave it up: its shutdown neither stops nor detaches it
            raise
        ctl.register_job(job)
        job._agents = agents
        job.restored = restore_meshes(ctl, job, rec.get("meshes") or [], hosted)
        job._save_state()  # this controller owns it now
        return job

    def proc_meshes(self) -> dict[str, ProcMesh]:
        """The proc meshes a reattach took back, by name (empty for a job this kernel started)."""
        return dict(self.restored.procs)

    def actor_meshes(self) -> dict[str, ActorMesh[Any]]:
        """The actor meshes a reattach took back, by name; calls reach the live actors, state kept."""
        return self.restored.actor_meshes()

    # -- SLURM's view -------------------------------------------------------------------------------
    def slurm_state(self) -> tuple[str, str]:
        """(state, reason): ``scontrol``'s (it says CANCELLED while ``squeue`` still says COMPLETING),
        else ``squeue``'s; ("", "") once SLURM forgot the job; ("UNKNOWN", why) when SLURM cannot
        be asked (slurmctld down, no client here): that is not the job's end."""
        if self.job_id is None:
            return "", ""
        return job_state(self.job_id)

    def node_names(self) -> list[str]:
        """The allocation's nodes, in SLURM's order (``scontrol show hostnames``)."""
        if self.job_id is None:
            return []
        out = _run(["squeue", "-h", "-j", self.job_id, "-o", "%N"], check=False).strip()
        return _run(["scontrol", "show", "hostnames", out]).split() if out else []

    def _step_ended(self) -> bool:
        return self._step is not None and self._step.poll() is not None

    def _log_tail(self, n: int = 15) -> str:
        return self._files.log_tail(n)

    def _save_state(self) -> None:
        """A small record under the config dir: which SLURM job, where the controller was; what
        ``jupyter-mesh status`` and a later kernel read."""
        meshes = saved_meshes(self._controller, self) if self.keep_alive else []
        self._files.save_record(self.job_id, self._agents or [], keep_alive=self.keep_alive, meshes=meshes)

    def _cleanup_files(self) -> None:
        self._files.cleanup()

    def __repr__(self) -> str:
        return f"<SlurmJob {self.job_id} nodes={self.nodes}>"


def job_state(job_id: str) -> tuple[str, str]:
    """SLURM's (state, reason) of a job: see ``SlurmJob.state``."""
    why = ""
    for argv in (["scontrol", "-o", "show", "job", job_id], ["squeue", "-h", "-j", job_id, "-o", "%T|%r"]):
        try:
            p = _ask(argv)
        except MeshError as e:
            why = str(e)
            continue
        if p.returncode != 0:
            if _FORGOT in p.stderr:
                return "", ""  # SLURM no longer knows the job: it ended a while ago
            why = f"`{shlex.join(argv)}` failed (exit {p.returncode}): {p.stderr.strip()[:300]}"
            continue
        if argv[0] == "scontrol":
            fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
            if fields.get("JobId") == job_id and fields.get("JobState"):
                reason = fields.get("Reason", "")
                return fields["JobState"], "" if reason in ("None", "") else reason
            continue
        line = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
        state, _, reason = line.partition("|")
        return state.strip(), "" if reason.strip() in ("None", "") else reason.strip()
    return "UNKNOWN", why


_FORGOT = "Invalid job id specified"
"""What ``scontrol``/``squeue`` say (exit 1) of a job SLURM no longer knows."""


def _ask(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise MeshError(f"`{argv[0]}` is not installed here: SlurmJob needs the SLURM client commands") from None
    except subprocess.TimeoutExpired:
        raise MeshError(f"`{shlex.join(argv)}` did not answer within {timeout:.0f} s: is slurmctld up?") from None


def _run(argv: list[str], input: str | None = None, check: bool = True, timeout: float = 30.0) -> str:
    try:
        p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise MeshError(f"`{argv[0]}` is not installed here: SlurmJob needs the SLURM client commands") from None
    except subprocess.TimeoutExpired:
        raise MeshError(f"`{shlex.join(argv)}` did not answer within {timeout:.0f} s: is slurmctld up?") from None
    if check and p.returncode != 0:
        raise MeshError(f"`{shlex.join(argv)}` failed (exit {p.returncode}): {p.stderr.strip()[:500]}")
    return p.stdout


def _slurmctld_ip() -> str:
    """The address of slurmctld (``scontrol show config``): the nodes reach it, so they most likely
    reach us on the interface whose route leads there."""
    out = _run(["scontrol", "show", "config"])
    m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
    if not m:
        raise MeshError("cannot find SlurmctldHost in `scontrol show config`; pass bind='<this host's IP>'")
    addr = m.group(2) or m.group(1)
    try:
        return parse_tcp(f"tcp://{addr}:1")[0]  # an IP, or the name resolved
    except ValueError as e:
        raise MeshError(f"cannot resolve slurmctld's host {addr!r} ({e}); pass bind='<this host's IP>'") from None
