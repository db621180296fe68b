"""Overlapping stages (issue 16): GpuLoader with decode and augment in two threads vs one
thread doing both, interleaved in one run, for a few decode thread counts.

    .venv/bin/python benchmarks/overlap_bench.py /tmp/bench/paper/shards --sets simple,complex \
        --threads 1,2 --repeat 5 --out docs/results/overlap-2core.json

Each configuration times whole epochs after one warm-up epoch (worker start, DALI build);
rounds go over all configurations in turn so that a change of machine load hits them
alike; the figure is the median images/s over rounds, with min and max. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gpupipe.bench.steps import SETS, gpupipe_pipeline  # noqa: E402
from gpupipe.loader import GpuLoader  # noqa: E402
from gpupipe.decode import DecodeConfig  # noqa: E402


def loader_for(shards: str, augment: str, threads: int, overlap: bool, args) -> GpuLoader:
    decode = DecodeConfig(backend=args.decode, image_size=(args.image_size,) * 2, num_threads=threads)
    loader = GpuLoader(shards, batch_size=args.batch_size, decode=decode, augment=gpupipe_pipeline(SETS[augment]),
                       num_workers=0, device="cpu", rank=0, world_size=1, on_error="skip")
    loader.overlap = overlap
    for _ in loader:  # warm-up epoch
        pass
    return loader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shards")
    p.add_argument("--sets", default="simple,complex")
    p.add_argument("--threads", default="1,2", help="decode threads to try (DALI / Pillow)")
    p.add_argument("--decode", default="dali")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    configs = [(s, int(t), o) for s in args.sets.split(",") for t in args.threads.split(",") for o in (False, True)]
    loaders = {c: loader_for(args.shards, *c, args) for c in configs}
    rates: dict = {c: [] for c in configs}
    stages: dict = {c: [] for c in configs}
    for _ in range(args.repeat):
        for c, loader in loaders.items():
            loader.stats.__init__()
            t0 = time.perf_counter()
            n = sum(len(b) for b in loader)
            rates[c].append(n / (time.perf_counter() - t0))
            stages[c].append(loader.stats.as_dict())
    rows = []
    for (s, t, o), r in rates.items():
        row = {"set": s, "decode_threads": t, "overlap": o, "images_per_s": statistics.median(r),
               "min": min(r), "max": max(r),
               "decode_busy_ms_per_img": statistics.median(1000 * x["decode_s"] / x["images"] for x in stages[(s, t, o)]),
               "augment_busy_ms_per_img": statistics.median(1000 * x["augment_s"] / x["images"] for x in stages[(s, t, o)])}
        rows.append(row)
        print(f"{s:8s} decode threads {t}  {'two stages' if o else 'one thread':10s}  {row['images_per_s']:7,.0f} "
              f"images/s ({row['min']:,.0f}-{row['max']:,.0f})  busy ms/img: decode {row['decode_busy_ms_per_img']:.3f}"
              f" augment {row['augment_busy_ms_per_img']:.3f}")
    env = {"cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
           "load_after": os.getloadavg(), "batch_size": args.batch_size, "image_size": args.image_size,
           "decode": args.decode, "repeat": args.repeat}
    print(json.dumps(env))
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
