"""Is augmentation cheaper than the decode it follows? Both timed alone on the same real images.

    .venv/bin/python benchmarks/augment_vs_decode.py --shards .bench/decode-data-5000-250/shards/

Decode: DALI CPU (2 threads) from encoded batches in memory to 128×128. Augment: the
docs' simple set (``gpupipe.transforms.simple_set()``) on those decoded batches.
Median of 3 passes over all batches after a warm-up pass. Not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import gpupipe.transforms as T  # noqa: E402
from gpupipe.decode import DecodeConfig, make_decoder  # noqa: E402
from gpupipe.loader.encoded import EncodedLoader  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", required=True, help="a shard folder (e.g. made by benchmarks/decode_bench.py)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--set", choices=["simple", "complex"], default="simple")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    batches = list(EncodedLoader(args.shards, batch_size=args.batch_size, num_workers=0, rank=0, world_size=1))
    decoder = make_decoder(DecodeConfig(backend="dali", image_size=(args.size, args.size), num_threads=2), "cpu")
    decoded = [decoder.decode(b) for b in batches]
    pipeline = T.simple_set() if args.set == "simple" else T.complex_set()
    stages = {"decode": lambda: [decoder.decode(b) for b in batches],
              f"augment_{args.set}": lambda: [pipeline(d.images, T.AugKey.for_batch(d)) for d in decoded]}
    n = sum(len(b) for b in batches)
    result = {"images": n, "torch_threads": torch.get_num_threads()}
    for name, run in stages.items():
        run()
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            run()
            runs.append(time.perf_counter() - t0)
        result[name] = {"ms_per_image": statistics.median(runs) / n * 1e3, "runs_s": [round(r, 3) for r in runs]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
