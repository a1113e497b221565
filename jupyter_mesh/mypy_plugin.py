"""A mypy plugin that types the endpoints of an actor mesh: ``mesh.step`` as ``MeshEndpoint[P, R]``.

Enable it in your mypy configuration::

    [tool.mypy]
    plugins = ["jupyter_mesh.mypy_plugin"]

An ``ActorMesh[A]`` finds its endpoints at run time (``__getattr__``), so annotations alone can only say
``MeshEndpoint[..., Any]``: any arguments, any result. With the plugin, ``mesh.step`` on an
``ActorMesh[Trainer]`` gets the parameters and result of ``Trainer.step`` (an ``Endpoint[P, R]``), so
``mesh.step.call_one(x)`` checks ``x`` and gives a ``Future[R]``, and naming something that is not an
endpoint of ``Trainer`` is an error, as it would be at run time. The mesh's own attributes (``slice``,
``initialized``, ``size``...) are typed by their annotations, with or without the plugin.

Only mypy loads this module (and imports mypy); the runtime never does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from mypy.errorcodes import ATTR_DEFINED
from mypy.maptype import map_instance_to_supertype
from mypy.nodes import Decorator, TypeInfo, Var
from mypy.plugin import AttributeContext, Plugin
from mypy.types import AnyType, Instance, Type, TypeOfAny, get_proper_type

ACTOR_MESH = "jupyter_mesh._api.mesh.ActorMesh"
MESH_ENDPOINT = "jupyter_mesh._api.mesh.MeshEndpoint"
ENDPOINT = "jupyter_mesh._core.actor.Endpoint"


class MeshPlugin(Plugin):
    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        # mypy asks for ``ActorMesh.<name>`` both for names that ``__getattr__`` answers and for the
        # mesh's own variables and properties: ``_mesh_endpoint`` leaves the latter alone
        owner, _, name = fullname.rpartition(".")
        if owner == ACTOR_MESH:
            return partial(_mesh_endpoint, name)
        return None


def _endpoint_type(actor: TypeInfo, name: str) -> Instance | str | None:
    """``A.name`` as an ``Endpoint[P, R]``; or why not: "missing", "not an endpoint"; None if its type is
    not known (not inferred yet, an untyped decorator...): then nothing is said."""
    node = actor.get(name)
    if node is None:
        return "missing"
    if isinstance(node.node, Decorator):
        typ = node.node.var.type
    elif isinstance(node.node, Var):
        typ = node.node.type
    else:
        return "not an endpoint"  # a plain method, a nested class...
    if typ is None:
        return None
    proper = get_proper_type(typ)
    if isinstance(proper, AnyType):
        return None
    if isinstance(proper, Instance):
        base = next((info for info in proper.type.mro if info.fullname == ENDPOINT), None)
        if base is not None:
            return map_instance_to_supertype(proper, base)
    return "not an endpoint"


def _mesh_endpoint(name: str, ctx: AttributeContext) -> Type:
    mesh = get_proper_type(ctx.type)
    if ctx.is_lvalue or not isinstance(mesh, Instance) or not mesh.args or mesh.type.get(name) is not None:
        return ctx.default_attr_type  # the mesh's own attributes keep their declared types
    if name.startswith("_"):  # never an endpoint: ``__getattr__`` raises AttributeError
        ctx.api.fail(f'"ActorMesh" has no attribute "{name}"', ctx.context, code=ATTR_DEFINED)
        return AnyType(TypeOfAny.from_error)
    default = get_proper_type(ctx.default_attr_type)  # MeshEndpoint[..., Any], from ``__getattr__``
    actor = get_proper_type(mesh.args[0])
    if not isinstance(default, Instance) or default.type.fullname != MESH_ENDPOINT or not isinstance(actor, Instance):
        return ctx.default_attr_type  # ActorMesh[Any], of a type variable...: nothing more to say
    info = actor.type
    if info.fallback_to_any or info.get("__getattr__") is not None:
        return ctx.default_attr_type
    found = _endpoint_type(info, name)
    if found is None:
        return ctx.default_attr_type
    if isinstance(found, str):
        ctx.api.fail(
            f'Actor class "{info.name}" has no endpoint "{name}"'
            if found == "missing"
            else f'"{info.name}.{name}" is not an endpoint, so a mesh of {info.name} has no "{name}"'
            " (did you forget @endpoint?)",
            ctx.context,
            code=ATTR_DEFINED,
        )
        return ctx.default_attr_type
    return default.copy_modified(args=list(found.args))


def plugin(version: str) -> type[Plugin]:
    return MeshPlugin
