"""Does ``Compose(compile=True)`` pay back its compile time within an epoch (issue 16)?

    .venv/bin/python benchmarks/compile_bench.py --sets simple,complex --batches 40 --out compile.json

For each set: the first call with ``compile=True`` (the colour pass through
``torch.compile``; its compile time), then eager and compiled batches alternating
(decoded-sized uint8 batches, channels_last as DALI hands them), process CPU ms per
image, medians. Break-even images = compile seconds / (eager - compiled) seconds per
image. Not a test.
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

import gpupipe.transforms as T  # noqa: E402
from gpupipe.augment.base import AugKey  # noqa: E402


def _batch(batch_size: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (batch_size, size, size, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)


def _cpu_ms(pipeline, images: torch.Tensor, epoch: int) -> float:
    key = AugKey(0, epoch, torch.arange(images.shape[0]))
    t0 = time.process_time()
    pipeline(images, key)
    return 1000 * (time.process_time() - t0) / images.shape[0]


def measure(name: str, args) -> dict:
    make = {"simple": T.simple_set, "complex": T.complex_set}[name]
    eager, compiled = make(), make()
    compiled.compile_colour = True
    images = _batch(args.batch_size, args.image_size)
    t0 = time.perf_counter()
    _cpu_ms(compiled, images, 0)
    compile_s = time.perf_counter() - t0
    _cpu_ms(eager, images, 0)
    rates: dict[str, list[float]] = {"eager": [], "compiled": []}
    for i in range(args.batches):
        for label, pipeline in (("eager", eager), ("compiled", compiled))[:: 1 if i % 2 else -1]:
            rates[label].append(_cpu_ms(pipeline, images, i + 1))
    e, c = statistics.median(rates["eager"]), statistics.median(rates["compiled"])
    gain_s = (e - c) / 1000
    row = {"set": name, "compile_s": compile_s, "eager_cpu_ms_per_img": e, "compiled_cpu_ms_per_img": c,
           "break_even_images": compile_s / gain_s if gain_s > 0 else None}
    even = row["break_even_images"]
    print(f"{name:8s} compile {compile_s:6.1f} s  eager {e:.3f}  compiled {c:.3f} CPU ms/img  break-even "
          + (f"{even:,.0f} images" if even else "never"))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="simple,complex")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--out")
    args = p.parse_args()
    rows = [measure(name, args) for name in args.sets.split(",")]
    env = {"cores": len(os.sched_getaffinity(0)), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "load_after": os.getloadavg(), "batch_size": args.batch_size, "image_size": args.image_size}
    print(json.dumps(env))
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
