"""A CLI that answers at once (issue 38): ``gpupipe --help`` and every ``gpupipe COMMAND --help``
import neither torch nor a decoder (torch alone is ~1.5 s of imports here): the settings'
declarations are torch-free modules (decode.settings, stream.settings, core.targetkinds) and
each command's parser is built only when that command is named."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpupipe.tools.cli import COMMANDS

_PROBE = """
import sys
from gpupipe.tools.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_torch(command):
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", _PROBE, *([command] if command else []), "--help"],
                         capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - t0
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage: gpupipe" in run.stdout and run.stdout.strip().endswith("NO-TORCH"), run.stdout[-500:]
    print(f"gpupipe {command} --help: {seconds:.2f} s")
