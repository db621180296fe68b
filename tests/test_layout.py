"""The shape of the package: commands share argument helpers through gpupipe.tools.cliargs and
never import one another's private names; the CLI entry module is imported by nobody."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpupipe"


def _imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpupipe"):
                yield path.relative_to(PACKAGE.parent), node


def test_no_module_imports_a_private_name_of_another_module():
    bad = [f"{path}: from {node.module} import {alias.name}" for path, node in _imports()
           for alias in node.names if alias.name.startswith("_")]
    assert not bad, bad


def test_nothing_imports_the_cli_entry_module():
    bad = [str(path) for path, node in _imports() if node.module == "gpupipe.tools.cli"]
    assert not bad, f"import the shared helpers from gpupipe.tools.cliargs instead: {bad}"


def test_every_public_name_resolves():
    """``from gpupipe import *`` works: each name of ``gpupipe.__all__`` (a lazy table) imports.
    ``gpupipe.index`` pointed at ``gpupipe.tools.ingest:index`` after the function moved to
    ``gpupipe.tools.indexer``, so the star import raised AttributeError."""
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


def _all_imports():
    """(importing module's path, imported module name) for every import in the package,
    at module level and inside functions alike."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield path.relative_to(PACKAGE.parent), node.module
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path.relative_to(PACKAGE.parent), alias.name


def upward_tool_imports(imports) -> list[str]:
    """Library modules that import a tool: tools sit above the library, never the other way."""
    return [f"{path}: imports {module}" for path, module in imports
            if path.parts[1] != "tools" and (module == "gpupipe.tools" or module.startswith("gpupipe.tools."))]


def test_the_library_never_imports_a_tool():
    bad = upward_tool_imports(_all_imports())
    assert not bad, f"the library imports from gpupipe.tools (move the shared code down instead): {bad}"


def test_the_tool_check_sees_an_import_inside_a_function():
    """The check above can fail: an import of a tool hidden in a function of the library counts."""
    tree = ast.parse("def f():\n    from gpupipe.tools.validate import validate\n")
    imports = [(Path("gpupipe/loader.py"), node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert upward_tool_imports(imports) == ["gpupipe/loader.py: imports gpupipe.tools.validate"]


def test_moved_modules_still_import_with_a_warning_naming_the_new_place():
    import importlib
    import sys
    import warnings

    for old, new in (("gpupipe.validate", "gpupipe.tools.validate"), ("gpupipe.bench.data", "gpupipe.tools.bench.data"),
                     ("gpupipe.errors", "gpupipe.core.errors"), ("gpupipe.manifest", "gpupipe.formats.manifest")):
        for name in [n for n in sys.modules if n == old or old.startswith(n + ".")]:
            if name != "gpupipe":
                del sys.modules[name]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new)
        messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        assert f"{old} moved to {new}; import that instead" in messages, messages


def test_the_core_imports_nothing_else_of_gpupipe():
    """The ground floor (errors, value types, the machine) stands on nothing of the package."""
    bad = [f"{path}: imports {module}" for path, module in _all_imports()
           if path.parts[1] == "core" and module.startswith("gpupipe") and not module.startswith("gpupipe.core")]
    assert not bad, bad
