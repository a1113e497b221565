"""torchrun-style SPMD programs on a mesh: Monarch's ``monarch.spmd``, plus running a script.

    from jupyter_mesh import this_host
    from jupyter_mesh.spmd import run_script, setup_torch_elastic_env

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    run_script(procs, ["train.py", "--epochs", "2"]).get()   # torchrun --nproc-per-node=4 train.py ...
    setup_torch_elastic_env(procs)     # or: only the variables, for actors and %%mesh cells

Each proc gets torchrun's variables by Monarch's rules (:mod:`.env`), the first proc hosts the
rendezvous, and a script runs unmodified inside the proc (``runpy``, ``sys.argv`` set), so
``init_process_group("gloo")``, DDP and Lightning's ``Trainer(strategy="ddp")`` work as under torchrun.
In a notebook: ``%mesh torchrun train.py --epochs 2``. Importing this module imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import lazy as _lazy

if TYPE_CHECKING:  # what type checkers read; at run time each name loads on first use (_core.lazy says why)
    from .actor import SPMDActor
    from .env import AddrType, torch_elastic_env
    from .launch import root_causes_first, run_script, setup_torch_elastic_env, setup_torch_elastic_env_async
    from .script import ScriptExit

_HOME = {
    "SPMDActor": ".actor",
    **dict.fromkeys(["AddrType", "torch_elastic_env"], ".env"),
    **dict.fromkeys(
        ["root_causes_first", "run_script", "setup_torch_elastic_env", "setup_torch_elastic_env_async"], ".launch"
    ),
    "ScriptExit": ".script",
}

if not TYPE_CHECKING:
    __getattr__ = _lazy.loader(__name__, _HOME, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AddrType",
    "SPMDActor",
    "ScriptExit",
    "root_causes_first",
    "run_script",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
    "torch_elastic_env",
]
