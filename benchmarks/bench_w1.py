"""W1 the way issue #14 states it, ours and Monarch's side by side, printed as one JSON object.

    python benchmarks/bench_w1.py [--runs 3] [--monarch PYTHON] [--no-kernel] [--no-cold]

**Cold script**: a fresh ``python -c SCRIPT`` writes Monarch-style code: ``this_host().spawn_procs(per_host=
{"gpus": 4})``, an actor whose endpoint imports torch, one ``call`` on all four. Two shapes of script:
``lazy`` (only the endpoint imports torch) and ``top`` (the script imports torch first, as a training
script does). Times: ``script_s`` from starting the interpreter until every actor answered (measured by
this process: wall clock from ``Popen`` to the script's own timestamp), ``spawn_s`` from the line before
``spawn_procs`` until every actor answered. Ours runs with the warm default (no preload named).

**Kernel**: a real kernel through jupyter_client (``mesh``; Monarch's in a plain ipykernel when that
Python has one), ``kernel_s`` until it answers ``kernel_info``; then one cell with the same spawn and
call, ``cell_s`` from sending it to its reply. The cell goes at once (``now``), or (``warm``) once our
kernel's host finished its background warm-up (its template sleeps with libtorch mapped), which is
``cell_sent_s`` after the kernel started: a user typing the cell. Monarch's ``warm`` cell goes as long
after its kernel answered as ours did.

Runs of ours and Monarch's alternate, so drift in the machine's speed hits both alike. Not a test:
nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

_ACTOR = """
class Net(Actor):
    @endpoint
    def forward(self) -> float:
        import torch
        return float(torch.ones(4).sum())
"""

_OURS = "from jupyter_mesh import Actor, endpoint, this_host\n"
_MONARCH = "from monarch.actor import Actor, endpoint, this_host\n"

_CALL = """
t_spawn = time.time()
procs = this_host().spawn_procs(per_host={"gpus": 4})
nets = procs.spawn("net", Net)
values = list(nets.forward.call().get().values())
assert values == [4.0] * 4, values
t_end = time.time()
"""

_SCRIPT_END = """
print(json.dumps({"t_spawn": t_spawn, "t_end": t_end}), flush=True)
procs.stop()
"""


def script(system: str, shape: str) -> str:
    head = "import json, time\n" + ("import torch\n" if shape == "top" else "")
    imports = _OURS if system == "ours" else _MONARCH
    end = _SCRIPT_END + ("" if system == "ours" else "import os; os._exit(0)\n")  # Monarch lingers at exit
    return head + imports + _ACTOR + _CALL + end


def cold(python: str, system: str, shape: str, env: dict[str, str]) -> dict[str, float]:
    t0 = time.time()
    p = subprocess.run([python, "-c", script(system, shape)], capture_output=True, text=True, timeout=300, env=env)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{system} {shape} script failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    return {"script_s": r["t_end"] - t0, "spawn_s": r["t_end"] - r["t_spawn"]}


def _kernelspec(data_dir: str, name: str, python: str) -> None:
    d = os.path.join(data_dir, "kernels", name)
    os.makedirs(d, exist_ok=True)
    argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    with open(os.path.join(d, "kernel.json"), "w") as f:
        json.dump({"argv": argv, "display_name": name, "language": "python"}, f)


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    out.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except OSError:
                pass
    return out


def _warm_template(root: int) -> bool:
    """A fork server below ``root`` that mapped libtorch and sleeps (in its select: its preload is done)."""
    kids, todo = _children(), [root]
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"jupyter_mesh._runtime.template" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/maps") as f:
                if state == "S" and "libtorch" in f.read():
                    return True
        except OSError:
            pass
    return False


def kernel(name: str, system: str, think: float | None) -> dict[str, float]:
    """Start kernel ``name``, time ``kernel_info``, then the spawn + call cell after ``think`` seconds
    (``None``: once its host's template is warm, ours only)."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=name)
    t0 = time.time()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        ready = time.time() - t0
        if think is None:  # three samples in a row: a template between two imports sleeps only briefly
            pid, deadline, seen = km.provisioner.process.pid, time.time() + 120, 0  # type: ignore[union-attr]
            while seen < 3 and time.time() < deadline:
                seen = seen + 1 if _warm_template(pid) else 0
                time.sleep(0.05)
        else:
            time.sleep(think)
        warm = time.time() - t0
        code = "import time\n" + (_OURS if system == "ours" else _MONARCH) + _ACTOR + _CALL
        t1 = time.time()
        reply = kc.execute_interactive(code, timeout=300, output_hook=lambda m: None)
        cell = time.time() - t1
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{system} kernel cell failed: {reply['content']}")
        return {"kernel_s": ready, "cell_sent_s": warm, "cell_s": cell}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def summary(xs: list[dict[str, float]]) -> dict[str, Any]:
    """Each time's median, and every run's (``KEY_all``)."""
    out: dict[str, Any] = {}
    for k in xs[0] if xs else ():
        out[k] = round(statistics.median(x[k] for x in xs), 3)
        out[f"{k}_all"] = [round(x[k], 3) for x in xs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--monarch", metavar="PYTHON", help="a Python with torchmonarch: Monarch side by side")
    ap.add_argument("--no-kernel", action="store_true")
    ap.add_argument("--no-cold", action="store_true")
    a = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    env.pop("JUPYTER_MESH_WARM", None)  # the default: warm
    # bytecode as an installed package has it (pip compiles at install; Monarch's has it): a source
    # tree run with PYTHONDONTWRITEBYTECODE=1 compiles every module in every process it starts
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # for the kernels, started from this process's environment
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(here, "jupyter_mesh")], check=True, env=env)
    systems = [("ours", sys.executable)] + ([("monarch", a.monarch)] if a.monarch else [])
    out: dict[str, Any] = {"load_before": os.getloadavg(), "runs": a.runs}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
    out["fresh_interpreter_import_torch_s"] = round(time.perf_counter() - t, 3)
    cold_runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(0 if a.no_cold else a.runs):
        for shape in ("lazy", "top"):
            for system, python in systems:
                cold_runs.setdefault(f"{system}_{shape}", []).append(cold(python, system, shape, env))
    if cold_runs:
        out["cold"] = {k: summary(v) for k, v in cold_runs.items()}
    if not a.no_kernel:
        saved = {k: os.environ.get(k) for k in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "PYTHONPATH")}
        base = tempfile.mkdtemp(prefix="jm-w1-")
        try:
            os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(base, "runtime")
            os.environ["PYTHONPATH"] = env["PYTHONPATH"]
            os.environ.pop("JUPYTER_MESH_WARM", None)
            kernels = [("ours", "mesh")]
            if a.monarch and subprocess.run([a.monarch, "-c", "import ipykernel"], capture_output=True).returncode == 0:
                os.environ["JUPYTER_DATA_DIR"] = os.path.join(base, "data")  # the mesh kernel stays visible
                _kernelspec(os.environ["JUPYTER_DATA_DIR"], "monarch-w1", a.monarch)
                kernels.append(("monarch", "monarch-w1"))
            k_runs: dict[str, list[dict[str, float]]] = {}
            for _ in range(a.runs):
                for label in ("now", "warm"):
                    think: float | None = 0.0 if label == "now" else None
                    for system, name in kernels:  # Monarch's cell goes as long after its start as ours did
                        r = kernel(name, system, think)
                        k_runs.setdefault(f"{system}_{label}", []).append(r)
                        think = max(0.0, r["cell_sent_s"] - r["kernel_s"]) if label == "warm" else think
            out["kernel"] = {k: summary(v) for k, v in k_runs.items()}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(base, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
