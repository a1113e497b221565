"""What front ends build on (the widget, the JupyterLab sidebar, ``jupyter-mesh status``, a kernel's
fault display): every mesh's state, a stream of its changes, a mesh by id, and where unhandled
failures go. Programs that only drive meshes need none of it: they use ``jupyter_mesh``.

    from jupyter_mesh import lowlevel
    unsubscribe = lowlevel.subscribe(print)     # every MeshEvent of this program
    lowlevel.set_fault_hook(my_display)         # failures no call was told about (default: fail fast)
    lowlevel.set_actor_errors("survive")        # errors no caller receives leave the actor alive
"""

from ._api.session import (
    mesh_states,
    on_send,
    proc_mesh,
    set_actor_errors,
    set_fault_hook,
    subscribe,
    sync_output,
)

__all__ = ["mesh_states", "on_send", "proc_mesh", "set_actor_errors", "set_fault_hook", "subscribe", "sync_output"]
