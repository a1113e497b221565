"""What the layers above fill in for the ones below, which may not import them.

The facade (``jupyter_mesh/__init__``) fills every slot as it is imported, which happens before any
other module of the package loads, and it does so without importing the API (that loads name by name,
on first use). A front end or a test may put its own in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

default_client: Callable[[], Any] | None = None
"""Makes this program's client when nothing installed one: the controller's (a proc installs its own).
Returns a ``_core.context.Requester``."""

proc_mesh_view: Callable[[Any], dict[str, Any]] | None = None
"""A ``ProcMesh`` → its mimebundle in a notebook (the live grid); None: the plain ``repr``."""

value_mesh_view: Callable[[Any], str] | None = None
"""A ``ValueMesh`` → HTML (a grid along its dims); None: the plain ``repr``."""

proc_mesh_from_ref: Callable[[Any], Any] | None = None
"""A ``ProcMeshRef`` → the ``ProcMesh`` it names, bound to this process's controller (an actor's
``context().actor_instance.proc_mesh``)."""

this_proc: Callable[[], Any] | None = None
"""Monarch's ``this_proc()`` in the program (the instance's ``proc`` outside actors)."""
