"""Decode throughput on the CPU path, three ways in one run (issue 3's measure).

    .venv/bin/python benchmarks/decode_bench.py --images 5000 --out .bench/decode.json

1. decode only: DALI CPU (2 threads) on batches already in memory → 128×128;
2. end to end: ``GpuLoader`` from local shards → decoded 128×128 batches
   (for each --workers value);
3. what a user would otherwise write: a torch ``DataLoader`` over the folder of
   JPEGs, 2 workers, Pillow decode + resize per sample, default collate.

Same images for all three (synthetic 250×250 JPEGs, quality 90). Each figure is
the median of --repeat epochs after a warm-up epoch. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gpupipe.dataset import EncodedLoader  # noqa: E402
from gpupipe.decode import DecodeConfig, make_decoder  # noqa: E402
from gpupipe.demo import prepare  # noqa: E402
from gpupipe.loader import GpuLoader  # noqa: E402


class FolderDataset(torch.utils.data.Dataset):
    """The per-sample CPU path users write: open, decode, convert, resize, to tensor."""

    def __init__(self, root: str, size: int):
        self.files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
        self.classes = sorted({Path(f).parent.name for f in self.files})
        self.size = size

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.files[i]) as img:
            img = img.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        return x, self.classes.index(Path(self.files[i]).parent.name)


def median_rate(run, repeat: int) -> dict:
    run()  # warm-up
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = run()
        rates.append(n / (time.perf_counter() - t0))
    return {"images_per_s": statistics.median(rates), "runs": [round(r) for r in rates]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--size", type=int, default=250)
    ap.add_argument("--out-size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 1])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default=".bench/decode-data")
    ap.add_argument("--out", default=".bench/decode.json")
    args = ap.parse_args()

    root = f"{args.root}-{args.images}-{args.size}"
    shards = prepare(root, images=args.images, size=args.size, shard_size=500)
    size = (args.out_size, args.out_size)
    result = {"machine": f"{os.cpu_count()} cores", "args": vars(args)}

    batches = list(EncodedLoader(shards + "/", batch_size=args.batch_size, num_workers=0, rank=0, world_size=1))
    decoder = make_decoder(DecodeConfig(backend="dali", image_size=size, num_threads=args.threads), "cpu")
    result["decode_only_dali_cpu"] = median_rate(lambda: sum(len(decoder.decode(b)) for b in batches), args.repeat)

    for w in args.workers:
        loader = GpuLoader(shards + "/", batch_size=args.batch_size, image_size=size, device="cpu",
                           decode=DecodeConfig(backend="dali", image_size=size, num_threads=args.threads),
                           num_workers=w, rank=0, world_size=1)
        result[f"gpuloader_workers{w}"] = median_rate(lambda loader=loader: sum(len(b) for b in loader), args.repeat)
        result[f"gpuloader_workers{w}"]["stages"] = loader.stats.as_dict()

    baseline = torch.utils.data.DataLoader(FolderDataset(os.path.join(root, "images"), args.out_size),
                                           batch_size=args.batch_size, shuffle=True, num_workers=2, drop_last=True)
    result["torch_dataloader_pil_2workers"] = median_rate(lambda: sum(len(x) for x, _ in baseline), args.repeat)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
