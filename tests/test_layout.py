"""The shape of the package: commands share argument helpers through gpupipe.cliargs and
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
    bad = [str(path) for path, node in _imports() if node.module == "gpupipe.cli"]
    assert not bad, f"import the shared helpers from gpupipe.cliargs instead: {bad}"


def test_every_public_name_resolves():
    """``from gpupipe import *`` works: each name of ``gpupipe.__all__`` (a lazy table) imports.
    ``gpupipe.index`` pointed at ``gpupipe.ingest:index`` after the function moved to
    ``gpupipe.indexer``, so the star import raised AttributeError."""
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
