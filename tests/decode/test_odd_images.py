"""Odd real-world files at batch 64: no crash, no abort, every (pixels, label) pair genuine.

Each backend runs in a subprocess (tests/odd_batch_script.py): a segfault inside a
decoder library then fails the test with its exit code instead of killing the suite.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpupipe.decode import available_backends

SCRIPT = Path(__file__).resolve().parents[1] / "odd_batch_script.py"  # tests/


@pytest.mark.parametrize("backend", ["pil", "dali"])
def test_odd_files_decode_at_batch_64_with_genuine_pairs(backend):
    if backend not in available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} is not installed")
    run = subprocess.run([sys.executable, str(SCRIPT), backend], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert run.stdout.split()[0] == "OK"
    assert int(run.stdout.split()[1]) > 0  # the corpus has undecodable files; they were counted
