"""The main job: a local mesh of 4 procs showing the API end to end, printed with rich.

python -m jupyter_mesh.demo      (or: make demo)
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from jupyter_mesh import Actor, ActorError, current_rank, endpoint, this_host
from jupyter_mesh.ui.terminal import print_status, spawn_progress


class Trainer(Actor):
    """A toy trainer: each rank keeps its own weight and reports where it runs."""

    def __init__(self, lr: float):
        self.lr = lr
        self.w = 1.0 + current_rank()["gpus"]

    @endpoint
    def step(self, grad: float) -> float:
        self.w -= self.lr * grad * self.w
        return round(self.w, 4)

    @endpoint
    async def where(self) -> dict:
        import os

        return {**dict(current_rank()), "pid": os.getpid()}

    @endpoint
    def fail_if(self, gpu: int) -> str:
        if current_rank()["gpus"] == gpu:
            raise ValueError(f"gpu {gpu} was told to fail")
        return "ok"

    @endpoint
    def echo(self, x):
        return x


def main() -> None:
    console = Console()
    console.print(Panel.fit("[b]jupyter_mesh[/b] demo: one controller, a local mesh of 4 procs", style="cyan"))
    try:
        import torch

        preload = ["torch"]  # imported once in the host's template: every proc starts with it
    except ImportError:
        preload = []
    host = this_host(preload=preload)
    t0 = time.perf_counter()
    with spawn_progress(console):
        procs = host.spawn_procs(per_host={"gpus": 4}, name="demo")
    with procs:
        trainers = procs.spawn("trainer", Trainer, lr=0.1)
        where = trainers.where.call().get(timeout=30)
        console.print(f"spawned {procs!r} and its actors in {time.perf_counter() - t0:.2f} s")

        table = Table(title="trainers.where.call()  ->  ValueMesh")
        for col in ("gpus", "pid"):  # this_host() has no dims (as in Monarch): the mesh's are per_host's
            table.add_column(col, justify="right")
        for _point, info in where.items():
            table.add_row(str(info["gpus"]), str(info["pid"]))
        console.print(table)

        losses = trainers.step.call(0.5).get()
        console.print(f"step.call(0.5)                 -> {list(losses.values())}")
        one = trainers.slice(gpus=2).step.call_one(0.5).get()
        console.print(f"slice(gpus=2).step.call_one()  -> {one}")
        trainers.step.broadcast(0.0)
        console.print(f"step.choose(0.0)               -> {trainers.step.choose(0.0).get()}")
        order = [f.get()["gpus"] for f in trainers.where.stream()]
        console.print(f"where.stream() arrival order   -> gpus {order}")

        n, t1 = 500, time.perf_counter()
        for _ in range(n):
            trainers.slice(gpus=0).step.call_one(0.0).get()
        rtt = (time.perf_counter() - t1) / n
        console.print(f"call_one round trip            -> {rtt * 1e6:.0f} us (mean of {n})")

        try:
            import torch

            t = torch.randn(2048, 2048)
            t1 = time.perf_counter()
            back = trainers.slice(gpus=1).echo.call_one(t).get(timeout=30)
            dt = time.perf_counter() - t1
            ok = torch.equal(back, t)
            console.print(f"16 MiB tensor echo            -> equal={ok} in {dt * 1e3:.1f} ms")
        except ImportError:
            console.print("[dim]torch not installed: skipping the tensor echo[/dim]")

        try:
            trainers.fail_if.call(3).get()
        except ActorError as e:
            console.print(Panel(Text(str(e)), title="a remote exception comes back as ActorError", style="red"))
        console.print(f"the mesh is still usable       -> {list(trainers.fail_if.call(-1).get().values())}")

        procs.kill(3)  # a proc dies: the rank turns failed, calls to it raise SupervisionError
        deadline = time.monotonic() + 5
        while procs.state().ranks[3].state != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        print_status(console=console)
        procs.respawn()
        console.print(f"respawned rank 3, actors re-created -> {trainers.slice(gpus=3).step.call_one(0.0).get()}")
        print_status(console=console)
    console.print(f"stopped: {procs!r}")
    console.print("[green]done[/green] - next: open notebooks/ in JupyterLab, or read the README")


if __name__ == "__main__":
    main()
