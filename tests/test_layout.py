"""The shape of the package: rooms by stage whose imports follow one layer table (tools on top, core
at the bottom, no circles); commands share argument helpers through gpupipe.tools.cliargs and never
import one another's private names; the CLI entry module is imported by nobody."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpupipe"


def _imports():
    """(path, node, the module it names) of every ``from ... import`` of a gpupipe module, relative
    imports resolved (``from .warp import x`` in gpupipe/augment is ``gpupipe.augment.warp``)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                module = _resolved(rel, node)
                if module.startswith("gpupipe"):
                    yield rel, node, module


def _resolved(rel: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` imports from, in the file ``rel``."""
    if not node.level:
        return node.module or ""
    package = _module_of(rel) if rel.name == "__init__.py" else _module_of(rel).rpartition(".")[0]
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_imports(imports) -> list[str]:
    """``from m import _name`` of another module (``m`` the resolved module name)."""
    return [f"{path}: from {module} import {alias.name}" for path, node, module in imports
            for alias in node.names if alias.name.startswith("_")]


def test_no_module_imports_a_private_name_of_another_module():
    bad = private_imports(_imports())
    assert not bad, bad


def test_the_private_import_check_sees_relative_imports():
    tree = ast.parse("from .warp import _affine, warp\nfrom gpupipe.core.errors import _hidden\n")
    path = Path("gpupipe/augment/policyops.py")
    imports = [(path, node, _resolved(path, node)) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert private_imports(imports) == ["gpupipe/augment/policyops.py: from gpupipe.augment.warp import _affine",
                                        "gpupipe/augment/policyops.py: from gpupipe.core.errors import _hidden"]


def test_nothing_imports_the_cli_entry_module():
    bad = [str(path) for path, _, module in _imports() if module == "gpupipe.tools.cli"]
    assert not bad, f"import the shared helpers from gpupipe.tools.cliargs instead: {bad}"


def test_every_public_name_resolves():
    """``from gpupipe import *`` works: each name of ``gpupipe.__all__`` (a lazy table) imports.
    ``gpupipe.index`` pointed at ``gpupipe.prepare.ingest:index`` after the function moved to
    ``gpupipe.prepare.indexer``, so the star import raised AttributeError."""
    import gpupipe

    missing = []
    for name in gpupipe.__all__:
        try:
            getattr(gpupipe, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, missing
    namespace: dict = {}
    exec("from gpupipe import *", namespace)  # noqa: S102 — the star import itself, as a user writes it
    assert set(gpupipe.__all__) <= set(namespace)


# Rooms from the bottom up: a module imports its own room and the rooms of the layers below, nothing
# else. The order is the data flow (docs/concepts.md, "Where the code is"); a total order, so no circle.
LAYERS = (
    ("core",),                          # errors, value types, the machine
    ("storage",),                       # fsspec reads, retries, faults, the block cache
    ("formats",),                       # bytes at rest: tar, Parquet, image folder, Delta, manifest, headers
    ("plan", "sources"),                # the pure planner; a URL resolved into units + manifest
    ("plan_units",),                    # the planner's units of work: a few batches of a chunk (pure)
    ("stream", "decode", "augment"),    # worker-side samples and batches; decoding; GPU augmentation
    ("prepare",),                       # data at rest made: ingest, index, re-encoding (library API)
    ("transforms",),                    # torchvision's names over augment
    ("config",),                        # YAML, typed per-stage settings, presets, the keyword form
    ("loader",),                        # GpuLoader, EncodedLoader, stages, the epoch ledger
    ("lightning",),                     # the DataModule, and a small model to try a pipeline with
    ("tools",),                         # the CLI and what only it uses
)
LAYER = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def _module_of(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_imports():
    """(importing module's path, imported module name) for every import in the package, at module
    level, inside functions and under ``TYPE_CHECKING`` alike; relative imports resolved."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                yield from ((rel, name) for name in _imported(_resolved(rel, node), node))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield rel, alias.name


def _imported(module: str, node: ast.ImportFrom) -> list[str]:
    """``from a.b import c``: ``a.b.c`` where ``c`` is a module of ``a.b``, else ``a.b``."""
    folder = PACKAGE.parent.joinpath(*module.split("."))
    subs = [f"{module}.{a.name}" for a in node.names
            if (folder / f"{a.name}.py").exists() or (folder / a.name / "__init__.py").exists()]
    return subs if subs and len(subs) == len(node.names) else [module, *subs]


def _room(module: str) -> str | None:
    """``gpupipe.loader.gpu`` → ``loader``; None outside gpupipe and for the package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gpupipe" and len(parts) > 1 else None


def layer_violations(imports) -> list[str]:
    """Imports that point up the layer table or sideways into another room of the same layer, and
    rooms missing from the table (a new room must be placed in it)."""
    bad = []
    for path, module in imports:
        if not module.split(".")[0] == "gpupipe" or path.parts[1] == "__init__.py":
            continue  # the package's own lazy name table points at every room by design
        here, there = path.with_suffix("").parts[1], _room(module)
        if there is None:
            bad.append(f"{path}: imports the package root ({module}); import the room that defines the name")
        elif here not in LAYER or there not in LAYER:
            bad.append(f"{path}: imports {module}; room {here if here not in LAYER else there!r} is not in LAYERS")
        elif there == here and module == f"gpupipe.{here}" and path.name != "__init__.py":
            bad.append(f"{path}: imports its own room's front door ({module}); import the module that defines it")
        elif there != here and LAYER[there] >= LAYER[here]:
            way = "sideways" if LAYER[there] == LAYER[here] else "up"
            bad.append(f"{path}: imports {module} ({here} -> {there} points {way})")
    return bad


def test_every_import_follows_the_layer_table():
    bad = layer_violations(_all_imports())
    assert not bad, "imports against the layer table (move the shared code down instead):\n" + "\n".join(bad)


def test_the_layer_check_fails_on_an_upward_import_even_inside_a_function():
    """The check can fail: an import of the loader hidden in a function of the stream room counts, as
    does one under TYPE_CHECKING, and a tool imported from the library."""
    tree = ast.parse("def f():\n    from gpupipe.loader.gpu import GpuLoader\n"
                     "if TYPE_CHECKING:\n    from gpupipe.config.split import SplitConfig\n")
    imports = [(Path("gpupipe/stream/chunks.py"), node.module) for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom)] + [(Path("gpupipe/loader/gpu.py"), "gpupipe.tools.validate"),
                                                       (Path("gpupipe/decode/dali.py"), "gpupipe.stream.batch"),
                                                       (Path("gpupipe/decode/pil.py"), "gpupipe.decode")]
    assert layer_violations(imports) == [
        "gpupipe/stream/chunks.py: imports gpupipe.loader.gpu (stream -> loader points up)",
        "gpupipe/stream/chunks.py: imports gpupipe.config.split (stream -> config points up)",
        "gpupipe/loader/gpu.py: imports gpupipe.tools.validate (loader -> tools points up)",
        "gpupipe/decode/dali.py: imports gpupipe.stream.batch (decode -> stream points sideways)",
        "gpupipe/decode/pil.py: imports its own room's front door (gpupipe.decode); import the module that defines it"]


def test_every_room_of_the_package_is_in_the_layer_table():
    rooms = {p.with_suffix("").name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert rooms == set(LAYER), rooms ^ set(LAYER)


def test_the_root_holds_few_modules():
    """The package root shows the rooms; modules live inside them (issue 24: at most ~12)."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, modules


def test_no_room_exports_a_name_that_hides_one_of_its_modules():
    """``gpupipe.sources.resolve`` was both a module and the function the room exports: the attribute
    gave the function, so ``monkeypatch.setattr("gpupipe.sources.resolve.x", ...)`` failed."""
    import importlib
    import inspect

    clashes = []
    for init in PACKAGE.rglob("__init__.py"):
        room = importlib.import_module(_module_of(init.relative_to(PACKAGE.parent)))
        modules = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir() if p.is_dir()}
        clashes += [f"{room.__name__}.{name}" for name in getattr(room, "__all__", ())
                    if name in modules and not inspect.ismodule(getattr(room, name))]  # gpupipe.transforms is one
    assert not clashes, clashes


# Circles between two files of one room that another branch is taking apart; each entry must still be a circle
# (test_every_known_circle_is_still_there), so it leaves this list as soon as it is gone.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def room_circles(imports) -> list[list[str]]:
    """Groups of modules of one room that import one another, each group sorted (a strongly connected
    component of the graph of imports between files of one room, imports inside functions and under
    ``TYPE_CHECKING`` included). A room's ``__init__`` is its front door, which imports the room's modules by
    design and is imported by none of them (see :func:`layer_violations`): left out."""
    graph: dict[str, set[str]] = {}
    for path, module in imports:
        here = _module_of(path)
        if path.name == "__init__.py" or _room(here) is None or _room(module) != _room(here) or module == here:
            continue
        graph.setdefault(here, set()).add(module)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's: the rooms are small, recursion is shallow
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(groups)


def test_no_two_files_of_one_room_import_each_other():
    """Inside a room, imports point one way too: a circle (``augment/base.py`` ↔ ``augment/targets.py``, even
    through an import inside a function) means a shared piece that belongs in the lower module (issue 36)."""
    circles = [c for c in room_circles(_all_imports()) if frozenset(c) not in KNOWN_CIRCLES]
    assert not circles, ("files of one room that import one another (move the shared piece to the lower "
                         "module):\n" + "\n".join(" <-> ".join(c) for c in circles))


def test_every_known_circle_is_still_there():
    circles = {frozenset(c) for c in room_circles(_all_imports())}
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in circles]
    assert not gone, f"no longer circles: take them out of KNOWN_CIRCLES: {gone}"


def test_the_circle_check_fails_on_a_circle_even_through_a_function():
    """The check can fail: a lazy import inside a function closes a circle of two files, or of three; a
    one-way import, the front door and an import of another room do not."""
    imports = [(Path("gpupipe/augment/base.py"), "gpupipe.augment.targets"),  # inside forward(), say
               (Path("gpupipe/augment/targets.py"), "gpupipe.augment.base"),
               (Path("gpupipe/decode/a.py"), "gpupipe.decode.b"), (Path("gpupipe/decode/b.py"), "gpupipe.decode.c"),
               (Path("gpupipe/decode/c.py"), "gpupipe.decode.a"),
               (Path("gpupipe/stream/x.py"), "gpupipe.stream.y"), (Path("gpupipe/stream/__init__.py"), "gpupipe.stream.x"),
               (Path("gpupipe/stream/y.py"), "gpupipe.stream"), (Path("gpupipe/stream/y.py"), "gpupipe.decode.a")]
    assert room_circles(imports) == [["gpupipe.augment.base", "gpupipe.augment.targets"],
                                     ["gpupipe.decode.a", "gpupipe.decode.b", "gpupipe.decode.c"]]
