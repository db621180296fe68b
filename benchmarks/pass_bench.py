"""Seconds per pass (``for batch in loader``) with 0, 1, 2 ... workers: the fixed cost of a pass.

    .venv/bin/python benchmarks/pass_bench.py --images 1000 --workers 0 1 2 --passes 3

Writes --images small real JPEGs (32x32, shards of 100) once under --root, then for each worker
count builds one ``GpuLoader`` on the CPU (batch 64, 16x16 output) and times: the first pass
(worker start, decoder build), then --passes full passes, then --passes "peeks" (3 batches, then
``break``: Lightning's sanity check and ``limit_val_batches`` do this). What a pass costs beyond
its batches — the worker start and shutdown — shows as the gap between worker counts.
Not a test: the numbers go to the docs with the command and the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gpupipe.formats.writer import ShardSink  # noqa: E402
from gpupipe.loader.gpu import GpuLoader  # noqa: E402
from gpupipe.tools.synth import synthetic_jpeg  # noqa: E402


def build(dst: str, images: int) -> None:
    if Path(dst, "index.json").exists():
        return
    rng = np.random.default_rng(0)
    with ShardSink(dst, shard_size=100) as sink:
        for i in range(images):
            sink.write(f"s{i:06d}", {"jpg": synthetic_jpeg(rng, (32, 32)), "cls": str(i % 10).encode()})


def timed(loader, stop: int | None = None) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for i, batch in enumerate(loader):
        n += len(batch)
        if stop is not None and i + 1 == stop:
            break
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--shuffle-buffer", type=int, default=1024,
                    help="stream.shuffle_buffer: 1024 makes the 15 batches one chunk (one worker reads it); "
                         "128 makes 8 chunks, for that many workers")
    ap.add_argument("--root", default=".bench/passes")
    a = ap.parse_args()
    url = f"{a.root}/{a.images}"
    build(url, a.images)
    print(f"cores usable: {len(os.sched_getaffinity(0))}, images: {a.images}, load average: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for w in a.workers:
        loader = GpuLoader(url, batch_size=64, image_size=16, num_workers=w, device="cpu", decode="pil",
                           shuffle_buffer=a.shuffle_buffer)
        first, n = timed(loader)
        full = [timed(loader) for _ in range(a.passes)]
        peeks = [timed(loader, stop=3)[0] for _ in range(a.passes)]
        after = timed(loader)  # a full pass after the peeks: the whole epoch again?
        print(f"workers={w}: first pass {first:.2f}s ({n} images); full pass median "
              f"{statistics.median(t for t, _ in full):.2f}s {[round(t, 2) for t, _ in full]}; "
              f"3-batch peek median {statistics.median(peeks):.2f}s; pass after peeks "
              f"{after[0]:.2f}s, {after[1]} images", flush=True)


if __name__ == "__main__":
    main()
