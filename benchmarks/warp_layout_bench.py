"""The CPU warp's input layout (issue 16): grid_sample on a channels_last float32 batch (DALI's
layout, kept by a plain ``.to(float32)``) against a contiguous one, conversion included,
alternating, process CPU and wall ms per 64 × 128² batch (medians of --rounds).

    .venv/bin/python benchmarks/warp_layout_bench.py --threads 1

The batch: random uint8 pixels, each sample rotated by up to ±20° about its centre (the simple
set's RandomAffine), bilinear, zeros outside. Not a test.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gpupipe.augment.warp import sampling_grid  # noqa: E402


def rotations(batch: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    angle = (torch.rand(batch, generator=g) * 40 - 20) * math.pi / 180
    c, s, centre = torch.cos(angle), torch.sin(angle), (size - 1) / 2
    m = torch.zeros(batch, 3, 3)
    m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1], m[:, 2, 2] = c, -s, s, c, 1.0
    m[:, 0, 2] = centre - c * centre + s * centre
    m[:, 1, 2] = centre - s * centre - c * centre
    return m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    B, S = 64, 128
    images = torch.randint(0, 256, (B, S, S, 3), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(1)).permute(0, 3, 1, 2)
    grid = sampling_grid(rotations(B, S), (S, S), (S, S), affine=True)
    layouts = {"channels_last": torch.preserve_format, "contiguous": torch.contiguous_format}
    cpu: dict[str, list[float]] = {k: [] for k in layouts}
    wall: dict[str, list[float]] = {k: [] for k in layouts}
    for _ in range(args.rounds):
        for name, layout in layouts.items():
            c0, w0 = time.process_time(), time.perf_counter()
            F.grid_sample(images.to(torch.float32, memory_format=layout), grid, align_corners=True)
            cpu[name].append(1000 * (time.process_time() - c0))
            wall[name].append(1000 * (time.perf_counter() - w0))
    for name in layouts:
        print(f"{args.threads} thread(s) {name:13s} CPU {statistics.median(cpu[name]):6.2f}  wall "
              f"{statistics.median(wall[name]):6.2f} ms/batch")


if __name__ == "__main__":
    main()
