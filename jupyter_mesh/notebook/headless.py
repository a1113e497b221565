"""Run a notebook headless on the ``mesh`` kernel and print its outputs (what ``make demo`` shows).

    python -m jupyter_mesh.notebook.headless notebooks/quickstart.ipynb [--save OUT.ipynb]

Cells tagged ``raises-exception`` may fail (the quickstart shows failures on purpose); any other
error stops the run with a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["execute", "main", "render"]


def execute(path: str, timeout: float = 120.0, kernel_name: str = "mesh") -> Any:
    """Execute the notebook at ``path``; returns the executed ``nbformat`` notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name=kernel_name, timeout=timeout).execute()
    return nb


def render(nb: Any, color: bool = True) -> str:
    """The code cells with their outputs, as text (ANSI colours kept when ``color``)."""
    import re

    out = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        src = cell.source.rstrip()
        out.append(
            f"\n\x1b[1;34mIn [{i + 1}]:\x1b[0m " + src.replace("\n", "\n        ") + "\n"
            if color
            else f"\nIn [{i + 1}]: " + src.replace("\n", "\n        ") + "\n"
        )
        for o in cell.outputs:
            if o.output_type == "stream":
                out.append(o.text)
            elif o.output_type in ("execute_result", "display_data"):
                out.append(o.data.get("text/plain", "") + "\n")
            elif o.output_type == "error":
                out.append("\n".join(o.traceback) + "\n")
    text = "".join(out)
    return text if color else re.sub(r"\x1b\[[0-9;]*m", "", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_mesh.notebook.headless", description=__doc__.splitlines()[0]
    )
    parser.add_argument("notebook")
    parser.add_argument("--save", metavar="OUT", help="also write the executed notebook here")
    parser.add_argument("--timeout", type=float, default=120.0, help="per cell, seconds")
    args = parser.parse_args(argv)
    import nbformat
    from nbclient.exceptions import CellExecutionError

    t0 = time.perf_counter()
    try:
        nb = execute(args.notebook, args.timeout)
    except CellExecutionError as e:
        print(e, file=sys.stderr)
        return 1
    print(render(nb, color=sys.stdout.isatty()))
    print(f"executed {args.notebook} on the mesh kernel in {time.perf_counter() - t0:.1f} s")
    if args.save:
        nbformat.write(nb, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
