"""``jupyter-mesh debug``: the paused actors of a running controller, from a shell on the same host.

Connects to a controller's private debug socket (``_runtime.debug_socket``: a kernel's or a script's)
and offers Monarch's commands, with a readline prompt::

    list                                  the paused actors: actor, mesh, rank, where, for how long, who holds it
    attach ACTOR RANK                     pdb's prompt for one (RANK: 3, or coordinates gpus=3 / hosts=0,gpus=3)
    cast ACTOR RANKS CMD                  one pdb command to several: RANKS is Monarch's ranks(1,4),
                                          ranks(0:4), ranks(dp=1:3,tp=(0,2)) or ours gpus=0:4, hosts=0,gpus=1
    continue [ACTOR [RANKS]]              let them run on (all by default)
    quit                                  leave (what is paused stays paused)

In ``attach``, lines go to pdb; ``detach`` (or Ctrl-D) goes back, leaving the actor paused; Ctrl-C while
pdb runs a command detaches too. One front at a time holds a rank's prompt: a second one (the notebook's
cell, another terminal) is told who has it.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Controller", "find_controllers", "main", "parse_rank", "parse_ranks"]

HELP = __doc__.split("::", 1)[1].split("\n\nIn ``attach``")[0].strip("\n")
Selector = Callable[[int, dict[str, int]], bool]

_RANGE = re.compile(r"^(\d*):(\d*)(?::(\d+))?$")


def _numbers(spec: str) -> Callable[[int], bool]:
    """``3``, ``1,4,5``, ``(1,4)``, ``0:4``, ``:4``, ``0:8:2`` -> a test on one number."""
    spec = spec.strip()
    if spec.startswith("(") and spec.endswith(")"):
        spec = spec[1:-1]
    m = _RANGE.match(spec)
    if m:
        start, stop, step = int(m[1] or 0), int(m[2]) if m[2] else None, int(m[3] or 1)
        if step < 1:
            raise ValueError("a range's step is at least 1")
        return lambda n: n >= start and (stop is None or n < stop) and (n - start) % step == 0
    parts = [x.strip() for x in spec.split(",")]
    if not parts or not all(x.isdigit() for x in parts):
        raise ValueError(f"{spec!r} is not a rank, a list of ranks (1,4) or a range (0:4, 0:8:2)")
    chosen = {int(x) for x in parts}
    return lambda n: n in chosen


def _split_top(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_ranks(text: str) -> Selector:
    """Monarch's ``ranks(...)`` or our ``dim=..`` slice (or ``all``) -> a test on (rank, coords)."""
    text = text.strip()
    if text in ("all", "*", "ranks(*)"):
        return lambda rank, coords: True
    if text.startswith("ranks(") and text.endswith(")"):
        text = text[len("ranks(") : -1]
    if "=" not in text:
        on_rank = _numbers(text)
        return lambda rank, coords: on_rank(rank)
    tests: list[tuple[str, Callable[[int], bool]]] = []
    for part in _split_top(text):
        dim, sep, spec = part.partition("=")
        dim = dim.strip()
        if not sep or not dim.isidentifier():
            raise ValueError(f"{part.strip()!r}: write dim=3, dim=0:4 or dim=(1,3)")
        tests.append((dim, _numbers(spec)))
    return lambda rank, coords: all(dim in coords and t(coords[dim]) for dim, t in tests)


def parse_rank(text: str) -> Selector:
    """One rank: ``3`` (global) or coordinates ``gpus=3`` / ``hosts=0,gpus=3``."""
    if text.isdigit():
        return lambda rank, coords: rank == int(text)
    want: dict[str, int] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.strip().isidentifier() or not v.strip().isdigit():
            raise ValueError(f"RANK is a global rank (3) or coordinates (hosts=0,gpus=3), not {text!r}")
        want[k.strip()] = int(v)
    return lambda rank, coords: all(coords.get(k) == v for k, v in want.items())


def _take_ranks(rest: str) -> tuple[str, str]:
    """``ranks(dp=1, tp=0) p x`` -> (``ranks(dp=1, tp=0)``, ``p x``); else the first word and the rest."""
    rest = rest.strip()
    if rest.startswith("ranks("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and ch == ")":
                return rest[: i + 1], rest[i + 1 :].strip()
        raise ValueError("ranks(...) is not closed")
    head, _, tail = rest.partition(" ")
    return head, tail.strip()


# -- the connection ---------------------------------------------------------------------------------
class Controller:
    """One controller's debug socket: ``request(op=...)`` -> its answer."""

    def __init__(self, path: str, timeout: float = 5.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self._reader = self.sock.makefile("rb")
        hello = self.request(op="hello", front=_front())
        if "error" in hello:
            raise PermissionError(hello["error"])
        self.pid, self.title, self.paused = int(hello["pid"]), str(hello["title"]), int(hello["paused"])
        self.sock.settimeout(None)  # pdb commands take as long as they take (Ctrl-C leaves)

    def request(self, **req: Any) -> dict[str, Any]:
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        line = self._reader.readline()
        if not line:
            raise ConnectionError(f"the controller (pid {getattr(self, 'pid', '?')}) closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        self._reader.close()
        self.sock.close()


def _front() -> str:
    try:
        tty = os.ttyname(0)
    except OSError:
        tty = ""
    return f"jupyter-mesh debug (pid {os.getpid()}{', ' + tty if tty else ''})"


def find_controllers(timeout: float = 3.0) -> tuple[list[Controller], list[str]]:
    """The controllers of this user on this host that answer, and why others did not."""
    from .._runtime.debug_socket import debug_dir

    try:
        directory = debug_dir()
    except FileNotFoundError:
        return [], []
    except PermissionError as e:
        return [], [str(e)]
    found, problems = [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.sock"))):
        try:
            found.append(Controller(path, timeout))
        except (ConnectionRefusedError, FileNotFoundError):
            _remove_stale(path)  # its controller died without closing it
        except (OSError, ValueError) as e:
            why = "no answer" if isinstance(e, socket.timeout) else f"{type(e).__name__}: {e}"
            problems.append(f"{path}: {why}")
    return found, problems


def _remove_stale(path: str) -> None:
    pid = os.path.basename(path).split(".")[0]
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        try:
            os.unlink(path)
        except OSError:
            pass
    except (ValueError, OSError):
        pass


# -- the terminal ------------------------------------------------------------------------------------
class Terminal:
    """The command loop over one controller; ``out`` prints, ``read`` reads a line (``input``)."""

    def __init__(self, ctl: Controller, read: Callable[[str], str] = input, out: Callable[[str], None] = print):
        self.ctl, self.read, self.out = ctl, read, out
        self.attached: dict[str, Any] | None = None  # the row of the actor whose prompt we hold

    def rows(self) -> list[dict[str, Any]]:
        return list(self.ctl.request(op="list")["paused"])

    def loop(self) -> int:
        while True:
            prompt = f"[{self._name(self.attached)}] (Pdb) " if self.attached else "(mesh debug) "
            try:
                line = self.read(prompt)
            except EOFError:
                if self.attached:
                    self.out("")
                    self.detach()
                    continue
                return 0
            except KeyboardInterrupt:
                self.out("")
                continue
            try:
                if self.attached:
                    self.pdb_line(line)
                elif not self.command(line):
                    return 0
            except KeyboardInterrupt:  # while pdb ran a command: leave it (the server sees us go)
                self.reconnect()
                self.out("--- interrupted: detached (the actor goes on with its command) ---")

    @staticmethod
    def _name(row: dict[str, Any] | None) -> str:
        return f"{row['actor']} on {row['mesh']} {row['label']}" if row else ""

    def command(self, line: str) -> bool:
        """Run one terminal command; False to leave."""
        words = line.strip().split(None, 1)
        if not words:
            return True
        cmd, rest = words[0], words[1] if len(words) > 1 else ""
        try:
            if cmd in ("q", "quit", "exit"):
                return False
            if cmd in ("h", "help", "?"):
                self.out(HELP)
            elif cmd in ("l", "list", "ls"):
                self.show_list()
            elif cmd in ("a", "attach"):
                self.attach(rest)
            elif cmd == "cast":
                self.cast(rest)
            elif cmd in ("c", "continue", "cont"):
                self.cont(rest)
            else:
                self.out(f"unknown command {cmd!r}; `help` lists them")
        except ValueError as e:
            self.out(f"error: {e}")
        return True

    def show_list(self) -> None:
        rows = self.rows()
        if not rows:
            self.out("no actor is paused in the debugger")
            return
        now = time.time()
        table = [("actor", "mesh", "rank", "paused at", "for", "")]
        for r in sorted(rows, key=lambda r: (r["actor"], r["mesh"], r["rank"])):
            by = f"being debugged from {r['by']}" if r["by"] else ("post-mortem" if r["pm"] else "")
            table.append(
                (r["actor"], r["mesh"], f"{r['rank']} ({r['label']})", r["where"], f"{now - r['since']:.0f} s", by)
            )
        widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
        for t in table:
            self.out("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())

    def _pick(self, actor: str, sel: Selector) -> list[dict[str, Any]]:
        return [r for r in self.rows() if (actor in ("", "*") or r["actor"] == actor) and sel(r["rank"], r["coords"])]

    def attach(self, rest: str) -> None:
        parts = rest.split()
        if len(parts) != 2:
            raise ValueError("usage: attach ACTOR RANK   (RANK: 3, or gpus=3 / hosts=0,gpus=3)")
        found = self._pick(parts[0], parse_rank(parts[1]))
        if not found:
            raise ValueError(f"no actor {parts[0]!r} is paused at rank {parts[1]}; `list` shows the paused ones")
        row = found[0]
        ans = self.ctl.request(op="attach", key=row["key"])
        if "error" in ans and "text" not in ans:
            self.out(f"error: {ans['error']}")
            return
        self.attached = row
        self.out(f"--- attached to {self._name(row)}, paused at {row['where']} ('detach' leaves it paused) ---")
        self._show(ans)

    def _show(self, ans: dict[str, Any]) -> None:
        text = str(ans.get("text", ""))
        body = text.removesuffix("(Pdb) ")
        if body:
            self.out(body.rstrip("\n"))
        if ans.get("error"):
            self.out(f"--- {ans['error']} ---")
        if ans.get("ended") and self.attached is not None:
            if not ans.get("error"):
                self.out(f"--- {self._name(self.attached)} runs on ---")
            self.attached = None

    def pdb_line(self, line: str) -> None:
        if line.strip() == "detach":
            self.detach()
            return
        self._show(self.ctl.request(op="line", line=line))

    def detach(self) -> None:
        row, self.attached = self.attached, None
        self.ctl.request(op="detach")
        self.out(f"--- detached; {self._name(row)} stays paused ---")

    def cast(self, rest: str) -> None:
        actor, _, more = rest.strip().partition(" ")
        if not actor or not more.strip():
            raise ValueError(
                "usage: cast ACTOR RANKS CMD   (e.g. cast trainer ranks(0:4) p loss, cast trainer gpus=1 n)"
            )
        where, line = _take_ranks(more)
        if not line:
            raise ValueError("cast needs a pdb command after the ranks")
        found = self._pick(actor, parse_ranks(where))
        if not found:
            self.out(f"no actor {actor!r} is paused in {where}; `list` shows the paused ones")
            return
        ans = self.ctl.request(op="cast", keys=[r["key"] for r in found], line=line)
        for o in sorted(ans["out"], key=lambda o: o["label"]):
            self.out(f"--- {o['label']} ---")
            if "error" in o:
                self.out(f"error: {o['error']}")
            else:
                body = str(o["text"]).removesuffix("(Pdb) ").rstrip("\n")
                if body:
                    self.out(body)
                if o.get("ended"):
                    self.out("(runs on)")

    def cont(self, rest: str) -> None:
        words = shlex.split(rest) if rest.strip() else []
        if words in ([], ["all"]):
            rows = self.rows()
        else:
            actor, ranks = words[0], " ".join(words[1:]) or "all"
            rows = self._pick(actor, parse_ranks(ranks))
        if not rows:
            self.out("no actor is paused")
            return
        ans = self.ctl.request(op="continue", keys=[r["key"] for r in rows])
        for label in ans["continued"]:
            self.out(f"continued {label}")
        for why in ans["skipped"]:
            self.out(f"not continued: {why}")

    def reconnect(self) -> None:
        """After Ctrl-C in the middle of a request: a fresh connection (the server gives back what
        the old one held once it sees it closed)."""
        path = self.ctl.path
        self.ctl.close()
        self.attached = None
        self.ctl = Controller(path)


def _choose(found: list[Controller], pid: int | None, out: Callable[[str], None]) -> Controller | None:
    if pid is not None:
        chosen = [c for c in found if c.pid == pid]
        if not chosen:
            out(f"no controller with pid {pid} answers; running ones: {', '.join(str(c.pid) for c in found) or 'none'}")
        return chosen[0] if chosen else None
    if len(found) == 1:
        return found[0]
    busy = [c for c in found if c.paused]
    if len(busy) == 1:
        return busy[0]
    out("several controllers run here; choose one with --pid:")
    for c in found:
        out(f"  pid {c.pid}: {c.title} ({c.paused} paused)")
    return None


def main(pid: int | None = None, command: list[str] | None = None, timeout: float = 3.0) -> int:
    """``jupyter-mesh debug [--pid PID] [COMMAND ...]``: a command loop, or one command then exit
    (``attach`` then reads pdb lines from stdin until ``detach`` or its end)."""
    found, problems = find_controllers(timeout)
    for p in problems:
        print(f"jupyter-mesh debug: {p}", file=sys.stderr)
    if not found:
        which = f" with pid {pid}" if pid is not None else ""
        print(
            f"jupyter-mesh debug: no running jupyter_mesh controller{which} of this user on this host "
            "(a kernel or script that imported jupyter_mesh and started a mesh)",
            file=sys.stderr,
        )
        return 1
    ctl = _choose(found, pid, lambda s: print(s, file=sys.stderr))
    for c in found:
        if c is not ctl:
            c.close()
    if ctl is None:
        return 2
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass

    def out(s: str) -> None:
        print(s, flush=True)

    term = Terminal(ctl, input, out)
    try:
        if command:
            term.command(" ".join(command))
            if term.attached is None:
                return 0
        else:
            out(f"jupyter-mesh debug: {ctl.title} (pid {ctl.pid}), {ctl.paused} actor(s) paused; `help` for commands")
        return term.loop()
    except (ConnectionError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (None, errno.EPIPE, errno.ECONNRESET):
            raise
        print(f"jupyter-mesh debug: the controller went away ({e})", file=sys.stderr)
        return 1
    finally:
        term.ctl.close()
