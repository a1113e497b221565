"""What a process pays to import the runtime, with and without our bytecode compiled. Prints one JSON object.

    python benchmarks/bench_import.py [--runs 7]

Every agent, kernel and script starts by importing ``jupyter_mesh``'s runtime. Where
``PYTHONDONTWRITEBYTECODE`` is set (CI machines, many containers) Python never writes ``.pyc`` files, so
each of those processes compiles our modules again; ``make test`` and ``make demo`` run ``compileall``
first for that reason. This measures both cases on copies of the package in a temp dir, alternating
(no bytecode, bytecode, ...) so drift in the machine's speed hits both alike: CPU seconds (user + sys)
of a fresh interpreter importing the controller, agent and proc modules, medians over ``--runs``.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTS = (
    "import jupyter_mesh._runtime.controller, jupyter_mesh._runtime.agent, jupyter_mesh._runtime.proc, "
    "jupyter_mesh._api.mesh"
)


def _cpu_of(cwd: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=cwd)
    subprocess.run([sys.executable, "-c", IMPORTS], cwd=cwd, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain, compiled = os.path.join(tmp, "plain"), os.path.join(tmp, "compiled")
        for d in (plain, compiled):
            shutil.copytree(
                os.path.join(ROOT, "jupyter_mesh"),
                os.path.join(d, "jupyter_mesh"),
                ignore=shutil.ignore_patterns("__pycache__", "labextension"),
            )
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(compiled, "jupyter_mesh")], check=True)
        no_pyc, pyc = [], []
        for _ in range(args.runs):
            no_pyc.append(_cpu_of(plain))
            pyc.append(_cpu_of(compiled))
    print(
        json.dumps(
            {
                "runs": args.runs,
                "import_cpu_s": {
                    "no_bytecode_p50": round(statistics.median(no_pyc), 3),
                    "bytecode_p50": round(statistics.median(pyc), 3),
                },
                "saved_per_process_s": round(statistics.median(no_pyc) - statistics.median(pyc), 3),
                "load": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
