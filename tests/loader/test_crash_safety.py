"""An exception while iterating a GpuLoader surfaces as that Python exception, exit code 1,
and everything the loader started (decode thread, DALI, workers) shuts down cleanly.

Before the fix the interpreter aborted at exit ("terminate called without an active
exception", exit 134): the loop's exception left the iteration suspended, and its decode
thread was still inside a DALI/torch call while the interpreter tore down.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from datagen import write_dataset

from gpupipe.decode import available_backends
from gpupipe.tools.synth import synthetic_jpeg

SCRIPT = textwrap.dedent("""
    import sys
    from gpupipe.loader.gpu import GpuLoader
    root, backend, workers, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    loader = GpuLoader(root, batch_size=4, image_size=16, decode=backend, num_workers=workers, device="cpu")

    def body(batch):
        if where == "loop":
            raise ValueError("an error in the training step")
        return len(batch[1])

    print(sum(body(b) for b in loader))
""")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("crash")
    good = str(root / "good")
    write_dataset(good, [12, 12], image=lambda i: synthetic_jpeg(np.random.default_rng(i), (24, 24)))
    bad = str(root / "bad")  # every image's scan cut off: the pipeline raises DecodeError under on_error=raise
    write_dataset(bad, [12], image=lambda i: synthetic_jpeg(np.random.default_rng(i), (24, 24))[:200])
    return str(root)


def _run(root: str, backend: str, workers: int, where: str) -> subprocess.CompletedProcess:
    if backend not in available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} is not installed")
    return subprocess.run([sys.executable, "-c", SCRIPT, root, backend, str(workers), where],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend,workers", [("dali", 0), ("dali", 2)])
def test_error_in_the_loop_body_is_a_python_exception(dataset, backend, workers):
    run = _run(f"{dataset}/good", backend, workers, "loop")
    assert run.returncode == 1, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert "ValueError: an error in the training step" in run.stderr
    assert "Traceback (most recent call last)" in run.stderr
    assert "terminate called" not in run.stderr and "Exception ignored" not in run.stderr


@pytest.mark.parametrize("backend", ["dali", "pil"])
def test_error_inside_the_pipeline_is_a_python_exception(dataset, backend):
    run = _run(f"{dataset}/bad", backend, 0, "none")
    assert run.returncode == 1, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert "gpupipe.core.errors.DecodeError: cannot decode sample 'k0000" in run.stderr
    assert "terminate called" not in run.stderr and "Exception ignored" not in run.stderr
