"""``%mesh debug``: the actors paused in ``breakpoint()``, and pdb commands for one or many of them.

%mesh debug                              list them: actor, mesh, rank, where, for how long
%mesh debug attach [ACTOR [RANK]]        pdb's prompt here for one (default: the oldest pause)
%mesh debug cast ACTOR 'gpus=0:4' next   one pdb command to each paused rank in the slice
                                         (or Monarch's ranks(1,4), ranks(dp=1:3), ranks(0:8:2))
%mesh debug continue [all]               let the oldest (or every) paused actor run on
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from .. import debug
from ..errors import MeshError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, rank_type: Callable[[str], Any]) -> None:
    p = sub.add_parser("debug", help="actors paused in breakpoint(): list, attach, cast a pdb command, continue")
    p.add_argument("action", nargs="?", default="list", choices=["list", "attach", "cast", "continue", "post-mortem"])
    p.add_argument(
        "rest", nargs=argparse.REMAINDER, help="attach [ACTOR [RANK]] | cast ACTOR SLICE LINE | continue [all]"
    )
    p.set_defaults(rank_type=rank_type)


def run(args: argparse.Namespace, parse_slice: Callable[[str], dict[str, int | slice]]) -> None:
    now = debug.paused()  # oldest pause first: what attach and continue take
    if args.action == "list":
        _list(sorted(now, key=lambda p: (p.mesh, p.rank, p.actor)))
    elif args.action == "continue":
        if args.rest not in ([], ["all"]):
            raise UsageError("usage: %mesh debug continue [all]")
        chosen = now if args.rest == ["all"] else now[:1]
        if not chosen:
            print("no actor is paused")
        for p in chosen:
            if p.attached:  # another front (`jupyter-mesh debug`) is in the middle of a session with it
                print(f"not continued: {p.actor} on {p.mesh} {p.label} is being debugged from {p.attached_by}")
                continue
            try:
                p.cont()
            except MeshError as e:  # it ran on or its proc died since the list was taken
                print(f"not continued: {e}")
                continue
            print(f"continued {p.actor} on {p.mesh} {p.label}")
    elif args.action == "post-mortem":
        if args.rest not in (["on"], ["off"]):
            raise UsageError("usage: %mesh debug post-mortem on|off")
        n = debug.post_mortem(args.rest == ["on"])
        print(f"post-mortem debugging {args.rest[0]} on {n} procs (procs started later: run it again)")
    elif args.action == "attach":
        if len(args.rest) > 2:
            raise UsageError("usage: %mesh debug attach [ACTOR [RANK]]")
        actor = args.rest[0] if args.rest else None
        try:
            rank = args.rank_type(args.rest[1]) if len(args.rest) > 1 else None
        except argparse.ArgumentTypeError as e:
            raise UsageError(str(e)) from None
        found = [p for p in now if (actor is None or p.actor == actor) and _is_rank(p, rank)]
        if not found:
            raise UsageError(f"no paused actor matches {' '.join(args.rest) or '(any)'}; `%mesh debug` lists them")
        debug.attach(found[0])
    else:
        if len(args.rest) < 3:
            raise UsageError("usage: %mesh debug cast ACTOR SLICE LINE   (e.g. cast trainer gpus=0:4 p loss)")
        from ..ui.debug_terminal import parse_ranks  # Monarch's ranks(1,4) / ranks(dp=1:3), and ours

        actor, line = args.rest[0], " ".join(args.rest[2:])
        try:
            pick = parse_ranks(args.rest[1])
        except ValueError as e:
            raise UsageError(f"{e}; SLICE is gpus=0:4, hosts=0,gpus=1, ranks(1,4), ranks(0:8:2) or all") from None
        found = [p for p in now if p.actor == actor and pick(p.rank, p.coords)]
        if not found:
            raise UsageError(f"no actor '{actor}' is paused in {args.rest[1]}; `%mesh debug` lists them")
        for p in sorted(found, key=lambda p: (p.mesh, p.rank)):
            holder = p.claim(debug.this_front())  # one front at a time: never type into another's session
            if holder:
                print(f"--- {p.actor} on {p.mesh} {p.label} ---\nnot sent: it is being debugged from {holder}")
                continue
            try:
                out = p.send(line)
            except MeshError as e:
                out = f"{e}\n"
            finally:
                p.release()
            print(f"--- {p.actor} on {p.mesh} {p.label} ---\n{out.removesuffix('(Pdb) ').rstrip()}")


def _list(now: list[Any]) -> None:
    if not now:
        print("no actor is paused in the debugger")
        return
    t = time.time()
    rows = [("actor", "mesh", "rank", "paused at", "for")]
    rows += [(p.actor, p.mesh, p.label, p.where, f"{t - p.since:.0f} s") for p in now]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print("(`%mesh debug attach ACTOR RANK` for its pdb prompt, `%mesh debug continue all` to let them run on)")


def _is_rank(p: Any, rank: int | dict[str, int] | None) -> bool:
    if rank is None:
        return True
    if isinstance(rank, int):
        return bool(p.rank == rank)
    return all(p.coords.get(k) == v for k, v in rank.items())
