"""The house in layers: every import in the package points down (or sideways within a layer), and
the import graph has no circle. Parsed from the source, so a lazy import inside a function or under
``TYPE_CHECKING`` counts too: a layer that needs something above it needs a hook, not an import."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import jupyter_mesh

PKG = pathlib.Path(jupyter_mesh.__file__).parent

# lowest first; a module may import its own layer and any layer before it
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_version", "config"),
    ("_core",),
    ("_wire",),
    ("_data",),
    ("_runtime",),
    ("_api",),
    ("jobs",),
    ("spmd",),  # torchrun-style environments and scripts over meshes (the public API below it only)
    ("lowlevel", "debug"),
    ("ui", "notebook"),  # views and the kernel side: they use lowlevel and the layers below, never the facade
    ("__init__",),  # the facade: what users import
    ("cli", "demo", "mypy_plugin"),
]


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS in {__file__}")


def _imports() -> dict[str, set[str]]:
    """module -> the package modules it imports (``from x import y`` counts ``x.y`` when that is a module)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                names = [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:  # a name inside a module: the module
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    out.add(name)
        graph[mod] = out
    return graph


def test_every_import_points_down():
    upward = [
        f"{mod} (layer {LAYERS[_layer(mod)][0]}) imports {dep} (layer {LAYERS[_layer(dep)][0]})"
        for mod, deps in sorted(_imports().items())
        for dep in sorted(deps)
        if _layer(dep) > _layer(mod) and not mod.startswith(dep + ".")  # a package's own parents always load
    ]
    assert not upward, "imports that point up a layer:\n  " + "\n  ".join(upward)


def test_the_import_graph_has_no_circle():
    graph = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # a package importing its own submodules (``jupyter_mesh.ui`` re-exporting ``ui.mesh_widget``) while
    # they import a sibling through it is Python's normal package loading, not a circle of concepts
    assert not circles, "import circles:\n  " + "\n  ".join(" <-> ".join(c) for c in circles)


def test_the_facade_names_itself_and_keeps_plumbing_in_lowlevel():
    """Every public name comes from the facade and is defined inside the package; front-end plumbing
    lives in ``lowlevel``. (Names keep the module they are defined in: rewriting ``__module__`` to
    ``jupyter_mesh`` broke ``inspect.getsource``, IPython's ``X??`` and ``typing.get_type_hints``.)"""
    import importlib
    import inspect
    import typing

    import jupyter_mesh.lowlevel

    for name in jupyter_mesh.__all__:
        obj = getattr(jupyter_mesh, name)
        module = getattr(obj, "__module__", "")
        assert module.startswith("jupyter_mesh."), (name, module)
        assert getattr(importlib.import_module(module), name) is obj, name
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getsource(obj)
    typing.get_type_hints(jupyter_mesh.Failure)
    assert set(jupyter_mesh.lowlevel.__all__) == {
        "mesh_states",
        "on_send",
        "proc_mesh",
        "set_actor_errors",
        "set_fault_hook",
        "subscribe",
        "sync_output",
    }
    for name in jupyter_mesh.lowlevel.__all__:
        assert name not in jupyter_mesh.__all__ and not hasattr(jupyter_mesh, name), name
    # and the error tree's names pickle through the facade (what a proc sends back)
    import pickle

    err = jupyter_mesh.SupervisionError([jupyter_mesh.Failure("m", {"gpus": 1}, "exit", "boom")])
    assert type(pickle.loads(pickle.dumps(err))) is jupyter_mesh.SupervisionError


@pytest.mark.parametrize("package", ["jupyter_mesh", "jupyter_mesh.jobs", "jupyter_mesh.spmd", "jupyter_mesh.ui"])
def test_a_lazy_packages_table_matches_what_type_checkers_read(package):
    """These packages load each public name on first use from the module ``_HOME`` names; type checkers
    and editors read the imports under ``TYPE_CHECKING`` instead. The two, and ``__all__``, must say the
    same, or a name works in one and not the other. No name is also a submodule's: importing that
    submodule would make the name the module (``ui.widget`` was both)."""
    module = importlib.import_module(package)
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    typed: dict[str, str] = {}
    submodules = set()
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level in (1, 2), ast.dump(node)
        for alias in node.names:
            if node.module is None:  # ``from . import config``: a submodule, found as one
                submodules.add(alias.asname or alias.name)
            else:
                typed[alias.asname or alias.name] = "." * node.level + node.module
    assert typed == module._HOME
    here = pathlib.Path(module.__file__).parent
    assert not [n for n in typed if (here / f"{n}.py").exists() or (here / n / "__init__.py").exists()]
    defined_here = {"unhandled_fault_hook"} if package == "jupyter_mesh" else set()
    defined_here |= {"load_ipython_extension"} if package == "jupyter_mesh.ui" else set()
    assert set(module.__all__) == set(typed) | defined_here
    for name in [*module.__all__, *submodules]:
        assert getattr(module, name) is not None
