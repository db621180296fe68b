"""Augmentation cost per batch: gpupipe fused vs gpupipe sequential (the reference
path) vs Kornia's AugmentationSequential, for the two transform sets of the docs
(issue 4's measure), and ColorJitter alone (gpupipe's vs Kornia's).

    .venv/bin/python benchmarks/augment_bench.py --out .bench/augment.json
    .venv/bin/python benchmarks/augment_bench.py --sets jitter:64:256 complex:256:256 --repeat 5

Input is a decoded uint8 batch (B, 3, S, S) — what the decoder hands over (resize
already done there); for ``jitter`` a float batch in [0, 1]. Median of --repeat timed
calls after one warm-up; the load average is recorded (the CPU may be shared). Not a test.
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

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import gpupipe.transforms as T  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def ours(kind: str, fuse: bool) -> T.Compose:
    geo = [T.RandomAffine(20), T.RandomHorizontalFlip(0.5)]
    if kind == "complex":
        geo += [T.RandomVerticalFlip(0.5), T.RandomPerspective(0.5, p=0.5)]
    colour = [T.ColorJitter(0.2, 0.2, 0.2, 0.2)] if kind == "complex" else []
    return T.Compose([*geo, T.ToDtype(torch.float32), *colour, T.Normalize(MEAN, STD)], fuse=fuse)


def kornia_seq(kind: str):
    import kornia.augmentation as K

    ops = [K.RandomAffine(20.0), K.RandomHorizontalFlip(p=0.5)]
    if kind == "complex":
        ops += [K.RandomVerticalFlip(p=0.5), K.RandomPerspective(0.5, p=0.5), K.ColorJitter(0.2, 0.2, 0.2, 0.2)]
    ops.append(K.Normalize(torch.tensor(MEAN), torch.tensor(STD)))
    return K.AugmentationSequential(*ops)


def jitter_row(b: int, s: int, dev: torch.device, repeat: int, sync, reference: bool) -> dict[str, float]:
    """ColorJitter(0.2 x4) alone on a float batch: gpupipe's (fused), its reference, Kornia's."""
    import kornia.augmentation as K

    x = torch.rand(b, 3, s, s, device=dev)
    key = T.AugKey(seed=0, epoch=0, sample_ids=torch.arange(b, device=dev))
    ours = T.ColorJitter(0.2, 0.2, 0.2, 0.2)
    params = ours.make_params(x, key)
    kj = K.ColorJitter(0.2, 0.2, 0.2, 0.2)
    row = {"gpupipe_fused_ms": timed(lambda: (ours(x, key), sync()), repeat),
           "kornia_ms": timed(lambda: (kj(x), sync()), repeat)}
    if reference:
        row["gpupipe_reference_ms"] = timed(lambda: (ours.apply_reference(x, params), sync()), min(repeat, 3))
    return row


def timed(fn, repeat: int) -> float:
    """Median wall-clock ms of ``repeat`` calls after a warm-up (the process CPU time of
    the same calls goes to ``CPU_MS``, keyed like the result: a busier machine shows in
    the wall clock first)."""
    fn()
    runs, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU_MS.append(statistics.median(cpu) * 1000)
    return statistics.median(runs) * 1000


CPU_MS: list[float] = []


def _with_cpu(row: dict[str, float]) -> dict[str, float]:
    """``row`` plus ``<name>_cpu_ms`` for its timings, in the order they were taken."""
    cpu = CPU_MS[-len(row):]
    return {**row, **{name.replace("_ms", "_cpu_ms"): c for name, c in zip(row, cpu)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="*", default=["simple:64:128", "jitter:64:256", "complex:256:256"],
                    help="kind:batch:size, kind in simple, complex, jitter")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-sequential", action="store_true",
                    help="skip gpupipe's sequential reference (its ColorJitter runs every op at every slot: slow)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=".bench/augment.json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    result = {"device": str(dev), "threads": torch.get_num_threads(), "loadavg_before": os.getloadavg(), "sets": {}}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for spec in args.sets:
        kind, b, s = spec.split(":")
        b, s = int(b), int(s)
        if kind == "jitter":
            result["sets"][spec] = row = _with_cpu(jitter_row(b, s, dev, args.repeat, sync, not args.no_sequential))
            print(spec, {n: round(v, 1) for n, v in row.items()}, flush=True)
            continue
        x = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, device=dev).contiguous(memory_format=torch.channels_last)
        key = T.AugKey(seed=0, epoch=0, sample_ids=torch.arange(b, device=dev))
        row = {}
        for name, pipe in (("gpupipe_fused", ours(kind, True)), ("gpupipe_sequential", ours(kind, False))):
            if name == "gpupipe_sequential" and args.no_sequential:
                continue
            pipe = pipe.to(dev)
            row[name + "_ms"] = timed(lambda: (pipe(x, key), sync()), args.repeat)
        k = kornia_seq(kind).to(dev)
        row["kornia_sequential_ms"] = timed(lambda: (k(x.float() / 255), sync()), args.repeat)
        result["sets"][spec] = row = _with_cpu(row)
        print(spec, {n: round(v, 1) for n, v in row.items()}, flush=True)
    result["loadavg_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
