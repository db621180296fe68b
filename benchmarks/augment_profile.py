"""Where one augment batch's CPU time goes (issue 16): torch.profiler over the docs' simple
(or complex) set on a decoded-sized batch, uint8 channels_last as DALI hands it.

    .venv/bin/python benchmarks/augment_profile.py --set simple --threads 1

Prints the process CPU ms per image (median of 15 batches, no profiler) and the
operators by self CPU time with their input shapes (3 profiled batches). Not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import gpupipe.transforms as T  # noqa: E402
from gpupipe.augment.base import AugKey  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="simple", choices=("simple", "complex"))
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--rows", type=int, default=14)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    B, S = args.batch_size, args.image_size
    images = torch.randint(0, 256, (B, S, S, 3), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0)).permute(0, 3, 1, 2)
    pipeline = T.simple_set() if args.set == "simple" else T.complex_set()
    ids = torch.arange(B)
    for epoch in range(3):
        pipeline(images, AugKey(0, epoch, ids))
    wall, cpu = [], []
    for epoch in range(15):
        t0, c0 = time.perf_counter(), time.process_time()
        pipeline(images, AugKey(0, epoch, ids))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(f"{args.set} set, {args.threads} torch thread(s): wall {1000 * statistics.median(wall) / B:.3f}, "
          f"CPU {1000 * statistics.median(cpu) / B:.3f} ms/img")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for epoch in range(3):
            pipeline(images, AugKey(0, epoch, ids))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                                             max_name_column_width=28, max_shapes_column_width=60))


if __name__ == "__main__":
    main()
