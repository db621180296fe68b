"""Decode throughput on the CPU path, three ways in one run (issue 3's measure).

    .venv/bin/python benchmarks/decode_bench.py --images 5000 --out .bench/decode.json

1. decode only: DALI CPU (2 threads) on batches already in memory → 128×128;
2. end to end: ``GpuLoader`` from local shards → decoded 128×128 batches
   (for each --workers value);
3. what a user would otherwise write: a torch ``DataLoader`` over the folder of
   JPEGs, 2 workers, Pillow decode + resize per sample, default collate.

Same images for all three (synthetic 250×250 JPEGs, quality 90). Each figure is
the median of --repeat epochs after a warm-up epoch. Not a test.

With ``--roi``, issue 16's "decode only what is used" instead: decode only (batches in
memory), the whole-image decode + ROI resize of before against the window decode
(``gpupipe.decode.roi``), for DALI CPU and Pillow, in interleaved rounds:

    .venv/bin/python benchmarks/decode_bench.py --roi --images 1500 --repeat 5 --out .bench/roi.json

Cases: dead-leaves ImageNet-sized JPEGs (``gpupipe bench --make-data imagenet``) with
random_resized_crop to 224² and shorter to 64²; dead-leaves 250×250 (``paper``) with shorter
and fixed to 128². "Whole" switches the shortcuts off inside this process (DALI decodes whole
images for every mode and resizes them itself, Pillow never scales in the DCT domain) — the
code path of before; for DALI, "window_dali_resize" is the window decode with DALI's own
resize (the CPU path before torch took over the resize, gpupipe.decode.resize).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gpupipe.decode import DecodeConfig, make_decoder  # noqa: E402
from gpupipe.loader.encoded import EncodedLoader  # noqa: E402
from gpupipe.loader.gpu import GpuLoader  # noqa: E402
from gpupipe.tools.demo import prepare  # noqa: E402


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


# -- --roi: decode only what is used (issue 16) ------------------------------------------------

ROI_CASES = (  # (name, bench data preset, resize, output side)
    ("imagenet_rrc224", "imagenet", "random_resized_crop", 224),
    ("imagenet_shorter64", "imagenet", "shorter", 64),
    ("paper_shorter128", "paper", "shorter", 128),
    ("paper_fixed128", "paper", "fixed", 128),
)


@contextlib.contextmanager
def whole_image_decode():
    """The path of before: DALI decodes whole images in every mode and resizes them itself,
    Pillow at full scale."""
    with mock.patch("gpupipe.decode.dali._ROI_MODES", ()), mock.patch("gpupipe.decode.pil.draft_scale", lambda *a: 1), \
            mock.patch("gpupipe.decode.dali.TORCH_RESIZES_ON_CPU", False):
        yield


@contextlib.contextmanager
def window_dali_resize():
    """The window decode with DALI's own resize: the step between before and now (DALI only)."""
    with mock.patch("gpupipe.decode.dali.TORCH_RESIZES_ON_CPU", False):
        yield


def roi_case(batches, backend: str, resize: str, side: int, threads: int, repeat: int) -> dict:
    """Images/s of one epoch over ``batches``, whole vs window decode, alternating each round;
    and the process's CPU time per image (user + system, all threads): the work done, which
    other processes' load on the machine moves less than the wall clock."""
    config = DecodeConfig(backend=backend, image_size=(side, side), resize=resize, num_threads=threads)
    variants = {"whole": whole_image_decode, "roi": contextlib.nullcontext}
    if backend == "dali":
        variants["window_dali_resize"] = window_dali_resize
    decoders = {}
    rates: dict = {name: [] for name in variants}
    cpu_ms: dict = {name: [] for name in variants}
    for rnd in range(repeat + 1):  # round 0 warms up (pipeline build, page cache)
        for name, switch in variants.items():
            with switch():
                if name not in decoders:
                    decoders[name] = make_decoder(config, "cpu")
                t0, c0 = time.perf_counter(), time.process_time()
                n = sum(len(decoders[name].decode(b)) for b in batches)
                if rnd:
                    rates[name].append(n / (time.perf_counter() - t0))
                    cpu_ms[name].append(1000 * (time.process_time() - c0) / n)
    for decoder in decoders.values():
        decoder.close()
    whole, roi = (statistics.median(rates[k]) for k in ("whole", "roi"))
    cpu_whole, cpu_roi = (statistics.median(cpu_ms[k]) for k in ("whole", "roi"))
    return {"whole": round(whole), "roi": round(roi), "ratio": round(roi / whole, 3),
            "cpu_ms_per_image": {k: round(statistics.median(v), 3) for k, v in cpu_ms.items()},
            "cpu_ratio": round(cpu_whole / cpu_roi, 3), "runs": {k: [round(r) for r in v] for k, v in rates.items()}}


def run_roi(args) -> dict:
    from gpupipe.tools.bench.data import make_dataset

    result = {"machine": f"{os.cpu_count()} cores", "load_before": os.getloadavg(), "args": vars(args)}
    batches = {}
    for name, preset, resize, side in ROI_CASES:
        if preset not in batches:
            shards = make_dataset(preset, args.images, f"{args.root}-{preset}-{args.images}")["shards"]
            batches[preset] = list(EncodedLoader(shards + "/", batch_size=args.batch_size, num_workers=0, rank=0,
                                                 world_size=1))
        for backend in ("dali", "pil"):
            result[f"{name}_{backend}"] = row = roi_case(batches[preset], backend, resize, side, args.threads,
                                                         args.repeat)
            print(f"{name:<20} {backend:<5} whole {row['whole']:>6} roi {row['roi']:>6} img/s  x{row['ratio']:.2f}  "
                  f"cpu x{row['cpu_ratio']:.2f} {row['cpu_ms_per_image']}  {row['runs']}", flush=True)
    result["load_after"] = os.getloadavg()
    return result


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
    ap.add_argument("--roi", action="store_true", help="issue 16: whole-image vs window decode (see above)")
    args = ap.parse_args()
    if args.roi:
        write(run_roi(args), args.out)
        return

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

    write(result, args.out)


def write(result: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
