"""Every script in examples/ runs with its fast flag and prints what it promises
(each in a subprocess, as a user would run it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tvshim import child_pythonpath

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXPECTED = {
    "train_lightning_local.py": "from local shards: val loss",
    "train_lightning_s3.py": "from s3://gpupipe-example/: val loss",
    "plain_pytorch_loop.py": "none repeated, none missing",
    "migrate_torchvision.py": "same key, same output: True",
    "train_segmentation.py": "with boxes and masks: val loss",
    "train_mixed_sources.py": "exactly as weighted",
}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_fast(script: str, tmp_path: Path):
    if script == "train_lightning_s3.py":
        pytest.importorskip("moto.server")
        pytest.importorskip("s3fs")
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--fast"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert EXPECTED[script] in run.stdout, run.stdout[-2000:]
    assert "testing" not in run.stdout  # the S3 credentials are never printed


def test_every_example_is_tested_and_documented():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
    assert scripts == sorted(EXPECTED)
    for name in scripts:
        text = (EXAMPLES / name).read_text()
        assert text.startswith('"""') and "Run::" in text and "--fast" in text, name
