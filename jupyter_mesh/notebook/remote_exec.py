"""``%%mesh`` on the worker side: an actor that runs cell code in a namespace of its own on every proc.

Each proc keeps its namespace across cells (like an IPython engine). Errors in the user's code are
returned as values, not raised, so one failing rank does not hide the other ranks' results; the
controller folds identical tracebacks. So are a ``KeyboardInterrupt`` the cell raises itself and a
last value that cannot be sent back (it does not pickle: the code ran). Interrupts (the runtime
cancelling the call) are raised, not returned. After each cell every proc prints a sync line on
stdout and stderr, so the controller knows when all of the cell's output has arrived.
"""

from __future__ import annotations

import ast
import builtins
import io
import linecache
import pickle
import sys
import tokenize
import traceback
from dataclasses import dataclass
from typing import Any

from .._core.actor import Actor, current_rank, endpoint
from .._core.context import context, own_rank
from .._wire.serialize import dumps, is_plain, loads
from ..errors import SerializationError
from .output import SYNC_PREFIX

__all__ = ["CellError", "RemoteExec", "run_code"]


@dataclass(frozen=True)
class CellError:
    """What a rank's ``%%mesh`` code raised, as text (the exception class may not exist here)."""

    exc_type: str
    message: str
    traceback: str
    ran: bool = False  # the code ran; its last value could not be sent back (it does not pickle)

    def __repr__(self) -> str:
        return f"<CellError {self.exc_type}: {self.message}>"


def _register_source(code: str, filename: str) -> None:
    lines = code.splitlines(keepends=True)
    linecache.cache[filename] = (len(code), None, lines, filename)


def _quiet(code: str) -> bool:
    """IPython's rule: a cell that ends with ``;`` shows (here: sends back) no value."""
    last = ""
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.DEDENT):
            last = tok.string
    return last == ";"


def run_code(code: str, filename: str, ns: dict[str, Any]) -> Any:
    """Run ``code`` in ``ns``; the value of a final expression statement is returned (else None, and
    None too when the cell ends with ``;``)."""
    _register_source(code, filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not _quiet(code):
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


def _cancelled() -> bool:
    """Is the runtime cancelling the cell running now? (Then a KeyboardInterrupt in it is that cancel.)"""
    host = context().actor.host
    return host is None or host.cancelling()


class _Pickled:
    """A cell's value pickled on its proc already (so that a value that does not pickle is told as such:
    the code ran); it unpickles as that value. Its buffers stay out of band, as the value's would."""

    __slots__ = ("bufs", "payload")

    def __init__(self, payload: bytes, bufs: list[memoryview]):
        self.payload, self.bufs = payload, bufs

    def __reduce__(self) -> tuple[Any, ...]:
        return loads, (self.payload, [pickle.PickleBuffer(b) for b in self.bufs])


def _sendable(value: Any) -> tuple[bool, Any]:
    """``run``'s answer for a cell's last value: it, or a CellError if it does not pickle."""
    if is_plain(value):
        return True, value
    try:
        return True, _Pickled(*dumps(value))
    except SerializationError as e:
        kind = type(value).__qualname__
        why = f"{e.__cause__ or e}"
        return False, CellError(
            "SerializationError",
            f"the cell ran, but its last value ({kind}) does not pickle: {why}",
            f"its last value, a {kind}, does not pickle ({why}).\n"
            "End the cell with `;` to send nothing back, or with a value that pickles (plain data, tensors, "
            "arrays). Its variables stay on the procs.\n",
            ran=True,
        )


class RemoteExec(Actor):
    """One per proc of a mesh brought up with ``%mesh up``; holds that proc's ``%%mesh`` namespace."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"__name__": "__mesh__", "__builtins__": builtins, "current_rank": current_rank}

    @endpoint
    def run(self, code: str, filename: str, sync: str) -> tuple[bool, Any]:
        """(True, value of the last expression) or (False, CellError). The cell runs as its proc:
        ``current_rank()`` there is the proc's point in the mesh, also under ``--on`` (as the output's
        ``[gpus=3]`` prefixes), not its point in the slice the cell was sent to."""
        try:
            try:
                with own_rank():
                    value = run_code(code, filename, self.ns)
            except KeyboardInterrupt as e:
                if _cancelled():  # an interrupt of the cell (■, --timeout) or the proc stopping: raised
                    raise
                return False, CellError(type(e).__qualname__, str(e), _user_traceback(e))  # the cell raised it
            except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's error is this rank's result
                return False, CellError(type(e).__qualname__, str(e), _user_traceback(e))
            return _sendable(value)
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
