"""``%mesh`` (up, status, stacks, debug, reattach, down, scale, kill, respawn, logs, push, pull, reload,
torchrun) and ``%%mesh`` (run a cell on every proc).

Arguments are parsed with argparse from ``shlex.split(line)`` and never evaluated (:mod:`.magic_args`); a
bad argument is an IPython ``UsageError`` that ends with the usage line. Errors from the meshes themselves
(a rank that raised, a proc that died) are raised as they are and rendered by :mod:`.tracebacks`.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import uuid
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .._core.future import Future
from .._core.shape import Shape
from .._core.value_mesh import ValueMesh
from ..errors import MeshError, MeshTimeoutError, MeshValueError, fold_coords
from . import debug_magic
from .magic_args import HelpShown, build_parsers, parse_slice
from .meshes import JobSpec, MeshRegistry, NamedMesh
from .output import SYNC_PREFIX, OutputRouter, fold_label, group_by_rank
from .reload import INTERNAL_ACTORS, Redefinitions
from .remote_exec import CellError, RemoteExec
from .torchrun import run as run_torchrun

__all__ = ["MeshMagics"]


@magics_class
class MeshMagics(Magics):
    """State of one kernel's meshes plus the magics that drive them."""

    def __init__(self, shell: Any, router: OutputRouter):
        super().__init__(shell)
        self.router = router
        self.meshes = MeshRegistry()
        self.redefinitions: Redefinitions | None = None  # set by the front
        self._line_parser, self._cell_parser = build_parsers()

    @line_cell_magic
    def mesh(self, line: str, cell: str | None = None) -> Any:
        """%mesh up|status|stacks|debug|down|scale|kill|respawn|logs|push|pull|reload|reattach|torchrun ...   %%mesh [--on SLICE] [--name NAME] [--no-stream] [--timeout S]

        `%mesh -h` and `%mesh up -h` explain each command.
        """
        parser = self._line_parser if cell is None else self._cell_parser
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"cannot split the arguments: {e}\n{parser.format_usage().strip()}") from None
        try:
            args = parser.parse_args(argv)
        except HelpShown:
            return None
        try:
            if cell is not None:
                return self._run_cell(args, cell)
            return getattr(self, f"_cmd_{args.cmd}")(args)
        except LookupError as e:
            raise UsageError(str(e.args[0] if e.args else e)) from None

    # -- %mesh commands -------------------------------------------------------------------------
    def _cmd_up(self, args: argparse.Namespace) -> None:
        kind = "slurm" if args.slurm else "attach" if args.attach else args.scheduler or "local"
        if (args.partition or args.time or args.keep_alive) and kind != "slurm":
            raise UsageError(
                "--partition, --time and --keep-alive are for --slurm (TorchX: --scheduler-arg partition=NAME)"
            )
        if args.scheduler_arg and not args.scheduler:
            raise UsageError("--scheduler-arg is for --scheduler")
        if args.scheduler:
            self._check_scheduler(args.scheduler, bool(args.scheduler_arg))
        if args.attach and args.hosts not in (None, len(args.attach)):
            raise UsageError(f"--attach names {len(args.attach)} agents, --hosts says {args.hosts}")
        if args.name in self.meshes and self.meshes.get(args.name).procs.stopped:
            self.down([args.name])  # its procs were stopped (procs.stop()): its agents go too, then up again
        if args.name in self.meshes:
            raise UsageError(f"mesh '{args.name}' is already up: `%mesh down {args.name}` first, or pick --name")
        dim, n = ("gpus", args.gpus) if args.gpus else ("procs", args.procs or 2)
        preload = [m for group in args.preload for m in group] if args.preload else None  # None: warm
        where = JobSpec(kind, args.attach or [], args.partition, args.time, dict(args.scheduler_arg), args.keep_alive)
        hosts = len(args.attach) if args.attach else (args.hosts or 1)
        try:
            entry = self.meshes.up(args.name, hosts, dim, n, preload, where=where)
        except KeyboardInterrupt:  # its job was stopped on the way out (MeshRegistry.up): say so in a line
            raise UsageError(f"Interrupted: %mesh up {args.name} was cancelled; nothing of it runs") from None
        except (OSError, ValueError) as e:  # a key file missing or refused, an address: what to do, no traceback
            raise UsageError(str(e)) from None
        self.shell.user_ns[args.name] = entry.procs
        job_id = getattr(entry.job, "job_id", None)
        kept = f"; SLURM job {job_id} outlives this kernel: `%mesh reattach` takes it back" if args.keep_alive else ""
        print(f"mesh '{args.name}' is up: {entry.procs.sizes} (bound to the variable `{args.name}`){kept}")

    def _cmd_reattach(self, args: argparse.Namespace) -> None:
        from ..jobs import SlurmJob

        try:
            job = SlurmJob.reattach(args.job_id, force=args.force)
        except (MeshError, OSError, ValueError) as e:  # no kept job, a refusal, an unreadable key: what to do
            raise UsageError(str(e)) from None
        bound: list[str] = []
        notes = list(job.restored.notes)
        for name, procs in job.proc_meshes().items():
            execs = [a for p, a in job.restored.actors if p == name and a.name == "mesh_exec"]
            sizes = procs.sizes
            dim = list(sizes)[-1]
            executor = execs[0] if execs else None
            if executor is None:  # kept from Python: no %%mesh executor yet
                try:
                    executor = procs.spawn("mesh_exec", RemoteExec)
                except MeshError:  # a rank is down: spawned at the first %%mesh once it runs again
                    notes.append(f"%%mesh on '{name}' waits for its ranks to run again (`{name}.respawn()`)")
            entry = NamedMesh(
                name,
                job,
                procs,
                executor,
                sizes.get("hosts", 1),
                dim,
                sizes[dim],
                [],
                JobSpec("slurm", keep_alive=True),
            )
            self.meshes.adopt(entry)
            if name.isidentifier():
                self.shell.user_ns[name] = procs
                bound.append(name)
        for name, mesh in job.actor_meshes().items():
            if mesh._name not in INTERNAL_ACTORS and name.isidentifier():
                self.shell.user_ns[name] = mesh
                bound.append(name)
        hosts = ", ".join(sorted({a.addr.split("//")[-1].rsplit(":", 1)[0] for a in job.agents(1.0)}))
        print(f"reattached SLURM job {job.job_id} ({job.nodes} hosts: {hosts}); bound: {', '.join(bound) or 'nothing'}")
        for note in notes:
            print(f"  {note}")

    @staticmethod
    def _check_scheduler(spec: str, has_args: bool) -> None:
        """Before anything starts: a scheduler that is not installed (or does not load) is a usage error."""
        from ..jobs.registry import job_class

        name = spec.partition(":")[0]
        if name == "attach":
            raise UsageError("the attach scheduler takes agents' addresses: --attach tcp://IP:PORT,...")
        if name in ("local", "slurm") and (has_args or ":" in spec):
            raise UsageError(f"--scheduler {spec}: the {name} scheduler takes neither :SUB nor --scheduler-arg")
        try:
            job_class(name)
        except MeshError as e:
            raise UsageError(str(e)) from None

    def _cmd_stacks(self, args: argparse.Namespace) -> None:
        entry = self.meshes.get(args.name)
        try:
            print(entry.procs.stacks(args.rank, timeout=args.timeout, all_threads=args.all_threads))
        except (MeshValueError, IndexError, KeyError) as e:
            raise UsageError(str(e.args[0] if e.args else e)) from None

    def _cmd_debug(self, args: argparse.Namespace) -> None:
        debug_magic.run(args, parse_slice)

    def _cmd_status(self, args: argparse.Namespace) -> None:
        rows = self.meshes.status_rows()
        if not rows:
            print("no mesh is up (`%mesh up` starts one)")
            return
        cols = list(rows[0])
        width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
        print("  ".join(c.ljust(width[c]) for c in cols))
        for r in rows:
            print("  ".join(str(r[c]).ljust(width[c]) for c in cols))
        print("(* = the default mesh of %%mesh and %mesh commands)")
        stopped = self.meshes.stopped()
        for e in stopped:
            print(
                f"mesh '{e.name}' is stopped (procs.stop()): `%mesh up --name {e.name}` starts a new one in its "
                f"place; `%mesh down {e.name}` drops it"
            )
        if getattr(self.shell, "kernel", None) is not None:  # and the grid, in a notebook
            from IPython.display import display

            from ..ui import snapshot

            view = snapshot()  # as it is now: a finished cell keeps its own state (ui.widget() is live)
            view.meshes += [m for e in stopped for m in snapshot(e.procs).meshes]  # the running ones, and these
            display(view)

    def _cmd_down(self, args: argparse.Namespace) -> None:
        entries = self.down(None if args.all else [self.meshes.get(args.name).name])
        print(f"stopped: {', '.join(e.name for e in entries) or 'nothing was up'}")

    def down(self, names: list[str] | None) -> list[NamedMesh]:
        """Stop meshes (``None``: all) with their agents and templates, and unbind their variables:
        ``%mesh down``, and the sidebar's Stop mesh (:meth:`down_mesh_id`), so both leave one truth."""
        entries = self.meshes.down_all() if names is None else [self.meshes.down(n) for n in names]
        for e in entries:
            if self.shell.user_ns.get(e.name) is e.procs:
                del self.shell.user_ns[e.name]
        return entries

    def down_mesh_id(self, mesh_id: str) -> bool:
        """``%mesh down`` for the mesh of that id, if ``%mesh up`` brought it up (else False)."""
        for e in self.meshes.entries():
            if e.procs.state().mesh_id == mesh_id:
                try:
                    self.down([e.name])
                except KeyError:  # taken down meanwhile (a %mesh down in a cell): the same outcome
                    pass
                return True
        return False

    def _cmd_scale(self, args: argparse.Namespace) -> None:
        old = self.meshes.get(args.name)
        dim, n = ("gpus", args.gpus) if args.gpus else ("procs", args.procs)
        hosts = args.hosts or old.hosts
        why = f"the dim changes from '{old.dim}' to '{dim}'"
        if dim == old.dim:  # in place: running procs, their actors and %%mesh variables stay
            try:
                if hosts != old.hosts and n != old.per_host:
                    raise MeshValueError("hosts and procs per host both change")
                if hosts != old.hosts:
                    old.procs.resize(hosts=hosts)
                elif n != old.per_host:
                    old.procs.resize(**{dim: n})
                old.hosts, old.per_host = hosts, n
                print(
                    f"mesh '{old.name}' resized in place to {old.procs.sizes} (new procs start with empty %%mesh namespaces)"
                )
                return
            except MeshValueError as e:
                why = str(e).split(";")[0].split(":")[0]
        print(f"resizing '{old.name}' in place is not possible ({why}); restarting it")
        self.meshes.down(old.name)
        if self.shell.user_ns.get(old.name) is old.procs:
            del self.shell.user_ns[old.name]
        entry = self.meshes.up(old.name, hosts, dim, n, old.preload, where=old.where)
        self.shell.user_ns[old.name] = entry.procs
        print(
            f"mesh '{old.name}' restarted at {entry.procs.sizes} (procs restart: actors and %%mesh variables start fresh)"
        )

    def _cmd_kill(self, args: argparse.Namespace) -> None:
        entry = self.meshes.get(args.name)
        try:
            entry.procs.kill(args.rank, getattr(signal, f"SIG{args.signal}"))
        except MeshValueError as e:
            raise UsageError(str(e)) from None
        rank = args.rank if isinstance(args.rank, int) else ",".join(f"{k}={v}" for k, v in args.rank.items())
        print(f"sent SIG{args.signal} to rank {rank} of '{entry.name}'; `%mesh respawn` brings it back")

    def _cmd_respawn(self, args: argparse.Namespace) -> None:
        entry = self.meshes.get(args.name)
        if entry.procs.stopped:  # procs.stop(): respawn brings back failed ranks, not a stopped mesh
            raise UsageError(
                f"mesh '{entry.name}' was stopped (procs.stop()): it has no ranks to respawn; "
                f"`%mesh up --name {entry.name}` starts a new one in its place"
            )
        try:
            ranks = entry.procs.respawn(args.ranks or None)
        except MeshValueError as e:
            raise UsageError(str(e)) from None
        print(
            f"respawned ranks {ranks or 'none (nothing had failed)'} of '{entry.name}' "
            "(actors re-created; their %%mesh variables start empty)"
        )

    def _cmd_logs(self, args: argparse.Namespace) -> None:
        entries = [self.meshes.get(args.name)] if args.name or len(self.meshes.names()) == 1 else self.meshes.entries()
        if args.rank is not None:
            sizes = [len(e.procs) for e in entries]
            if not any(0 <= args.rank < n for n in sizes):
                raise UsageError(
                    f"--rank {args.rank} is out of range: the mesh has ranks 0-{max(sizes, default=1) - 1}"
                )
        lines = [ln for e in entries for ln in e.procs.logs(args.rank, None) if SYNC_PREFIX not in ln]
        if not (args.all or args.save):
            lines = lines[-args.tail :]
        text = "".join(ln + "\n" for ln in lines)
        if args.save:
            try:
                with open(args.save, "w") as f:
                    f.write(text)
            except OSError as e:
                raise UsageError(
                    f"--save {args.save}: cannot write there ({e.strerror or e}); give a writable path"
                ) from None
            print(f"wrote {len(lines)} lines to {args.save}")
        elif not lines:
            print("no worker output kept yet")
        else:
            print(text, end="")

    def _cmd_reload(self, args: argparse.Namespace) -> None:
        if self.redefinitions is None:
            raise UsageError("%mesh reload needs the notebook front (%load_ext jupyter_mesh)")
        try:
            lines = self.redefinitions.reload(args.names)
        except TypeError as e:
            raise UsageError(str(e)) from None
        print("\n".join(lines))

    def _cmd_torchrun(self, args: argparse.Namespace) -> None:
        run_torchrun(self.meshes.get(args.name), args)

    def _cmd_push(self, args: argparse.Namespace) -> None:
        entry = self.meshes.get(args.mesh)
        missing = [n for n in args.names if n not in self.shell.user_ns]
        if missing:
            raise UsageError(f"not defined here: {', '.join(missing)}")
        values = {n: self.shell.user_ns[n] for n in args.names}
        executor = entry.exec_mesh()
        _wait(executor.push.call(values))
        print(f"pushed {', '.join(args.names)} to {len(executor)} procs of '{entry.name}'")

    def _cmd_pull(self, args: argparse.Namespace) -> ValueMesh[Any]:
        entry = self.meshes.get(args.mesh)
        return _wait(entry.exec_mesh().pull.call(args.var))

    # -- %%mesh ---------------------------------------------------------------------------------
    def _run_cell(self, args: argparse.Namespace, code: str) -> ValueMesh[Any] | None:
        entry = self.meshes.get(args.name)
        view = entry.exec_mesh()
        if args.on:
            try:
                view = view.slice(**parse_slice(args.on))
            except MeshError as e:
                raise UsageError(f"--on {args.on}: {e}") from None
        filename = self.shell.compile.cache(code, self.shell.execution_count)
        token = uuid.uuid4().hex
        synced = self.router.expect_sync(token, 2 * len(view))
        self.router.set_collect(args.no_stream)
        try:
            results = _wait(view.run.call(code, filename, token), args.timeout)
            synced.wait(2.0)  # the procs' last lines travel by another path than the replies
            self.router.flush()  # shown before the result
        finally:
            self.router.forget_sync(token)
            if args.no_stream:
                self.router.publish("stdout", group_by_rank(self.router.take_collected()))
        values, errors = [], []
        for point, (ok, value) in results.items():
            values.append(value)
            if not ok:
                errors.append((",".join(f"{k}={v}" for k, v in point.items()), value))
        if errors:
            self._show_errors(errors, len(values))
        if all(v is None for v in values):
            return None
        return ValueMesh(Shape.from_sizes(results.sizes), values)

    def _show_errors(self, errors: list[tuple[str, CellError]], total: int) -> None:
        """What ranks raised, folded; then the ranks where the cell ran but its value could not come back."""
        self.router.flush()
        parts = []
        for ran in (False, True):
            these = [(label, err) for label, err in errors if err.ran == ran]
            if not these:
                continue
            folded: dict[str, list[str]] = {}
            for label, err in these:
                folded.setdefault(err.traceback.rstrip(), []).append(label)
            if ran:
                parts.append(
                    f"the cell ran on {len(these)} of {total} ranks, but its last value could not be sent back\n"
                )
            else:
                parts.append(
                    f"{len(these)} of {total} ranks raised (their other results are in the returned ValueMesh)\n"
                )
            for tb, labels in folded.items():
                parts.append(f"-------- [{fold_label(labels)}] --------\n{tb}\n")
        self.router.publish("stderr", "".join(parts))


def _wait(fut: Future[Any], timeout: float | None = None) -> Any:
    """Wait for a call; on Interrupt, cancel it (where the runtime can) and let the interrupt through.
    At ``timeout`` it is cancelled the same way: left running, its output and side effects would land in
    the next cells, which would wait behind it."""
    try:
        return fut.get(timeout)
    except KeyboardInterrupt:
        cancel = getattr(fut, "cancel", None)
        if cancel is not None:
            cancel()
        raise
    except MeshTimeoutError as e:
        raise _timed_out(fut, e) from None


def _timed_out(fut: Future[Any], e: MeshTimeoutError) -> MeshTimeoutError:
    """``e``, after cancelling ``fut`` as an interrupt does, saying how that went."""
    report = fut._cancel_reported()
    still = getattr(report, "still_running", None)
    if report is None:
        how = "it was cancelled on its ranks"
    elif still:
        how = (
            f"it was cancelled, but {fold_coords(still)} still run (native code that ignores signals): "
            "`%mesh kill RANK` then `%mesh respawn` stops them"
        )
    else:
        how = str(report).removeprefix("Interrupted: ")
    return MeshTimeoutError(e.phase, e.seconds, f"{e.what}; {how}" if e.what else how)
