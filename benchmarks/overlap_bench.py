"""Overlapping stages (issue 16): GpuLoader with decode and augment in two threads vs one
thread doing both, interleaved in one run, for a few decode thread counts and augment-stage
thread counts.

    .venv/bin/python benchmarks/overlap_bench.py /tmp/bench/paper/shards --sets simple,complex \
        --threads 1,2 --repeat 5 --out docs/results/overlap-2core.json
    .venv/bin/python benchmarks/overlap_bench.py SHARDS --modes two --threads 1,2 --augment-threads 1,torch

``--augment-threads``: torch intra-op threads in the augment stage's thread
(``GpuLoader.augment_threads``; ``torch``: torch's default, one per core); CPU ms/img is the
process's CPU time per image.

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

from gpupipe.decode import DecodeConfig  # noqa: E402
from gpupipe.loader.gpu import GpuLoader  # noqa: E402
from gpupipe.tools.bench.steps import SETS, gpupipe_pipeline  # noqa: E402


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
    p.add_argument("--augment-threads", default="", help="augment stage threads to try, 'torch' for torch's "
                   "default (the default)")
    p.add_argument("--modes", default="one,two", help="one (a thread decodes, then augments), two (stages)")
    p.add_argument("--out")
    args = p.parse_args()
    choices = [None if n == "torch" else int(n) for n in args.augment_threads.split(",") if n] or [None]
    modes = [m == "two" for m in args.modes.split(",")]
    configs = [(s, int(t), o, n) for s in args.sets.split(",") for t in args.threads.split(",") for o in modes
               for n in choices]
    loaders = {c: loader_for(args.shards, *c[:3], args) for c in configs}
    rates: dict = {c: [] for c in configs}
    stages: dict = {c: [] for c in configs}
    cpu: dict = {c: [] for c in configs}
    for _ in range(args.repeat):
        for c, loader in loaders.items():
            loader.augment_threads = c[3]
            loader.stats.__init__()
            t0, c0 = time.perf_counter(), time.process_time()
            n = sum(len(b) for b in loader)
            rates[c].append(n / (time.perf_counter() - t0))
            cpu[c].append(1000 * (time.process_time() - c0) / n)
            stages[c].append(loader.stats.as_dict())
    rows = []
    for (s, t, o, n), r in rates.items():
        row = {"set": s, "decode_threads": t, "overlap": o, "augment_threads": n, "images_per_s": statistics.median(r),
               "min": min(r), "max": max(r), "cpu_ms_per_img": statistics.median(cpu[(s, t, o, n)]),
               "decode_busy_ms_per_img": statistics.median(1000 * x["decode_s"] / x["images"] for x in stages[(s, t, o, n)]),
               "augment_busy_ms_per_img": statistics.median(1000 * x["augment_s"] / x["images"]
                                                            for x in stages[(s, t, o, n)])}
        rows.append(row)
        print(f"{s:8s} decode threads {t} augment {n or 'torch'}  {'two stages' if o else 'one thread':10s}  "
              f"{row['images_per_s']:7,.0f} images/s ({row['min']:,.0f}-{row['max']:,.0f})  CPU ms/img "
              f"{row['cpu_ms_per_img']:.3f}  busy ms/img: decode {row['decode_busy_ms_per_img']:.3f}"
              f" augment {row['augment_busy_ms_per_img']:.3f}")
    env = {"cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
           "load_after": os.getloadavg(), "batch_size": args.batch_size, "image_size": args.image_size,
           "decode": args.decode, "repeat": args.repeat}
    print(json.dumps(env))
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
