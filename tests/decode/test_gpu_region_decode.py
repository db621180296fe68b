"""GPU region decode: where gpupipe uses it, and the check that decides when it may come back.

nvImageCodec 0.9.0's GPU region decode crashes on H100 (NVIDIA/nvImageCodec#55), so the
CUDA path decodes whole images and crops in the resize unless the installed nvImageCodec is
older than 0.9 (gpupipe.decode.gate). The ``gpu`` + ``dali`` test runs the region decode
itself on JPEG photos in a subprocess and reports a signal death as a failure with its name:
when it passes on a GPU machine with a given nvImageCodec, region decode may come back there.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpupipe.decode import DecodeConfig, ResizeMode, available_backends, gate

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_region_script.py"  # tests/
needs_dali = pytest.mark.skipif("dali" not in available_backends(torch.device("cpu")), reason="needs nvidia-dali")
RRC = DecodeConfig(backend="dali", image_size=(32, 32), resize=ResizeMode.RANDOM_CROP)


@pytest.mark.parametrize("version, safe", [((0, 8, 0), True), ((0, 9, 0), False), ((0, 9, 1), False),
                                           ((0, 10, 0), False), (None, False)])
def test_gpu_region_decode_is_safe_only_before_the_regression(monkeypatch, version, safe):
    monkeypatch.setattr(gate, "nvimgcodec_version", lambda: version)
    assert gate.gpu_region_decode_safe() is safe


@needs_dali
@pytest.mark.parametrize("device, version, region", [("cpu", (0, 9, 0), True), ("cuda", (0, 9, 0), False),
                                                     ("cuda", (0, 8, 0), True)])
def test_the_cuda_path_decodes_whole_images_with_a_bad_nvimgcodec(monkeypatch, device, version, region):
    """The decoder's placement (built without touching CUDA: DALI pipelines are built on first
    decode): region windows (win_start/win_end) only where region decode is safe."""
    from gpupipe.decode.common import Checked
    from gpupipe.decode.dali import DaliDecoder
    from gpupipe.formats.imageheader import ImageHeader

    monkeypatch.setattr(gate, "nvimgcodec_version", lambda: version)
    decoder = DaliDecoder(RRC, torch.device(device))
    assert decoder.region_decode is region
    checked = Checked([ImageHeader("jpeg", 400, 300, 3, sof=0xC0)], [None], [False])
    placement = decoder._placement(np.array([[10, 20, 100, 120]]), checked)
    assert ("win_start" in placement) is region
    assert "roi_start" in placement  # the box is cropped in the resize either way
    decoder.close()


def photos(folder: Path, count: int = 48) -> None:
    """JPEG photos: matplotlib's sample photograph where matplotlib is installed (the GPU machine
    has it), and ImageNet-sized natural-statistics JPEGs (gpupipe's dead-leaves images, 4:2:0)."""
    from gpupipe.tools.bench.data import preset_sizes
    from gpupipe.tools.synth import LeavesConfig, dead_leaves_jpeg

    folder.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        sample = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        if sample.exists():
            (folder / "grace_hopper.jpg").write_bytes(sample.read_bytes())
    except ImportError:
        pass
    config = LeavesConfig(blur=0.5, noise=3.5, grain=8.0, jitter=20.0)
    for i, size in enumerate(preset_sizes("imagenet", count, seed=5)):
        (folder / f"leaves{i:03d}.jpg").write_bytes(dead_leaves_jpeg(5, i, size, quality=90, config=config))


@pytest.mark.gpu
@pytest.mark.dali
def test_gpu_region_decode_on_photos_does_not_kill_the_process(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("nvidia.dali")
    photos(tmp_path / "photos")
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "photos")], capture_output=True, text=True,
                         timeout=300)
    versions = run.stdout.splitlines()[0] if run.stdout else "versions unknown"
    if run.returncode < 0:
        pytest.fail(f"GPU region decode killed the process with {signal.Signals(-run.returncode).name} ({versions}); "
                    f"stdout: {run.stdout[-800:]} stderr: {run.stderr[-1500:]}")
    assert run.returncode == 0, f"GPU region decode failed ({versions}): {run.stdout[-1500:]} {run.stderr[-1500:]}"
    assert run.stdout.split()[-2] == "OK"
