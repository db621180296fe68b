"""Import the real torchvision for the comparison tests, on a machine whose torch is a CPU build.

TESTS ONLY — never done in the library. `make test` installs torchvision with ``--no-deps`` at
the version that matches the torch in use into its own folder, ``.venv/torchvision-tests``
(.ci/install-torchvision.sh), which only this process puts on ``sys.path``: subprocesses of the
tests (`gpupipe fit`, bench, workers started by exec) see no torchvision, as a user without it
would. A torchvision installed in the environment itself (a GPU machine) is used first. Where the only wheel is a
CUDA build (this project's CI), its C operators (nms, roi_align, decode_jpeg...) cannot load
against the CPU torch, and ``import torchvision`` fails while registering meta kernels for them
(``RuntimeError: operator torchvision::nms does not exist``). The transforms compared here are
Python on top of torch and need none of those operators, so the failing registration module is
replaced by an empty one and the import retried. Anything that would call those operators fails
loudly when called; nothing here does.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

TESTS_ONLY = Path(sys.prefix) / "torchvision-tests"  # where .ci/install-torchvision.sh puts it


def import_torchvision():
    """The ``torchvision`` module, or None where it is not installed."""
    try:
        try:
            import torchvision
        except ImportError:
            if not TESTS_ONLY.is_dir():
                return None
            sys.path.append(str(TESTS_ONLY))
            import torchvision
    except ImportError:
        return None
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision


def child_pythonpath() -> str:
    """``PYTHONPATH`` for a child process that should see this process's modules but, as a user
    would, not the tests-only torchvision."""
    import os

    return os.pathsep.join(p for p in sys.path if p != str(TESTS_ONLY))
