"""``%%mesh`` on the worker side: an actor that runs cell code in a namespace of its own on every proc.

Each proc keeps its namespace across cells (like an IPython engine). Errors in the user's code are
returned as values, not raised, so one failing rank does not hide the other ranks' results; the
controller folds identical tracebacks. Interrupts (the runtime cancelling the call) are raised, not
returned. After each cell every proc prints a sync line on stdout and stderr, so the controller knows
when all of the cell's output has arrived.
"""

from __future__ import annotations

import ast
import builtins
import linecache
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from .._core.actor import Actor, current_rank, endpoint
from .output import SYNC_PREFIX

__all__ = ["CellError", "RemoteExec", "run_code"]


@dataclass(frozen=True)
class CellError:
    """What a rank's ``%%mesh`` code raised, as text (the exception class may not exist here)."""

    exc_type: str
    message: str
    traceback: str

    def __repr__(self) -> str:
        return f"<CellError {self.exc_type}: {self.message}>"


def _register_source(code: str, filename: str) -> None:
    lines = code.splitlines(keepends=True)
    linecache.cache[filename] = (len(code), None, lines, filename)


def run_code(code: str, filename: str, ns: dict[str, Any]) -> Any:
    """Run ``code`` in ``ns``; the value of a final expression statement is returned (else None)."""
    _register_source(code, filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        tail = tree.body.pop()
        assert isinstance(tail, ast.Expr)
        last = ast.Expression(tail.value)
    exec(compile(tree, filename, "exec"), ns)
    if last is not None:
        return eval(compile(last, filename, "eval"), ns)
    return None


def _user_traceback(e: BaseException) -> str:
    tb = e.__traceback__
    # drop our frames (run_code and this actor) so the traceback starts at the user's cell
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


class RemoteExec(Actor):
    """One per proc of a mesh brought up with ``%mesh up``; holds that proc's ``%%mesh`` namespace."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"__name__": "__mesh__", "__builtins__": builtins, "current_rank": current_rank}

    @endpoint
    def run(self, code: str, filename: str, sync: str) -> tuple[bool, Any]:
        """(True, value of the last expression) or (False, CellError)."""
        try:
            return True, run_code(code, filename, self.ns)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's error is this rank's result
            return False, CellError(type(e).__qualname__, str(e), _user_traceback(e))
        finally:
            self._sync(sync)

    @endpoint
    def push(self, values: dict[str, Any]) -> None:
        self.ns.update(values)

    @endpoint
    def pull(self, name: str) -> Any:
        if name not in self.ns:
            raise NameError(f"name '{name}' is not defined on this proc (define it in %%mesh or %mesh push it)")
        return self.ns[name]

    @staticmethod
    def _sync(token: str) -> None:
        if not token:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.write(f"{SYNC_PREFIX}{token}\n")
                stream.flush()
            except (OSError, ValueError):
                pass
