"""NVTX ranges (issue 38): on CUDA the stages run inside named ranges; on the CPU nothing is called
(torch without NVTX must not fail, and the CPU path pays nothing)."""
from __future__ import annotations

import numpy as np
import torch

from gpupipe import GpuLoader
from gpupipe.formats.writer import ShardSink
from gpupipe.loader import ranges
from gpupipe.tools.synth import synthetic_jpeg


def test_on_the_cpu_no_range_is_opened(tmp_path, monkeypatch):
    def refuse(name):
        raise AssertionError(f"an NVTX range was opened on the CPU: {name}")

    monkeypatch.setattr(torch.cuda.nvtx, "range", refuse)
    rng = np.random.default_rng(0)
    with ShardSink(str(tmp_path / "s"), shard_size=8) as sink:
        for i in range(16):
            sink.write(f"k{i:03d}", {"jpg": synthetic_jpeg(rng, (20, 20)), "cls": b"0"})
    loader = GpuLoader(str(tmp_path / "s"), batch_size=8, image_size=(16, 16), decode="pil", device="cpu",
                       num_workers=0, augment=lambda x: x.float())
    assert sum(len(b) for b in loader) == 16


def test_on_cuda_each_item_is_fetched_inside_its_range(monkeypatch):
    """The range wrapper itself (the GPU run that shows the ranges in nsys is owed on a GPU)."""
    opened = []

    class Range:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            opened.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda.nvtx, "range", Range)
    assert list(ranges.ranged(lambda: iter([1, 2]), "gpupipe: wait for encoded batch", True)()) == [1, 2]
    assert opened == ["gpupipe: wait for encoded batch"] * 3  # two items and the end
    with ranges.nvtx_range("gpupipe: decode", True):
        pass
    assert opened[-1] == "gpupipe: decode"
