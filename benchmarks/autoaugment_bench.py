"""Auto-augment policies per batch: gpupipe's TrivialAugmentWide and RandAugment(2, 9)
(each sample its own ops) against Kornia's ``kornia.augmentation.auto`` TrivialAugment
and RandAugment(n=2, m=9) (one op choice per call, for the whole batch), issue 14's measure.

    .venv/bin/python benchmarks/autoaugment_bench.py --batch 256 --size 224 --repeat 7 --out .bench/autoaugment.json
    .venv/bin/python benchmarks/autoaugment_bench.py --device cuda --repeat 20

gpupipe gets the decoder's uint8 batch (B, 3, S, S) channels_last and, as a second row,
the same batch as float in [0, 1]; Kornia gets the float batch (its policies take float
only). The contenders are timed in turn, one call each per round (interleaved, so load
changes hit all of them), after one warm-up round; medians (and minima) of --repeat rounds,
wall clock and process CPU time, and the median over rounds of Kornia's time / gpupipe's in
the same round; the load average is recorded. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import gpupipe.transforms as T  # noqa: E402


def contenders(x8: torch.Tensor, xf: torch.Tensor) -> dict[str, Callable[[int], object]]:
    """name → fn(round): one call on the batch; gpupipe's key changes with the round (epoch)."""
    from kornia.augmentation.auto import RandAugment, TrivialAugment

    ids = torch.arange(x8.shape[0], device=x8.device)
    ta, ra = T.TrivialAugmentWide(), T.RandAugment(num_ops=2, magnitude=9)
    kta, kra = TrivialAugment().to(x8.device), RandAugment(n=2, m=9).to(x8.device)

    def ours(policy, x):
        return lambda r: policy(x, T.AugKey(seed=0, epoch=r, sample_ids=ids))

    return {"gpupipe_trivialaugment_uint8": ours(ta, x8), "gpupipe_trivialaugment_float": ours(ta, xf),
            "kornia_trivialaugment": lambda r: kta(xf),
            "gpupipe_randaugment_uint8": ours(ra, x8), "gpupipe_randaugment_float": ours(ra, xf),
            "kornia_randaugment": lambda r: kra(xf)}


def interleaved(fns: dict[str, Callable[[int], object]], repeat: int, sync) -> dict[str, float]:
    """Median wall and CPU ms per contender over ``repeat`` rounds after a warm-up round."""
    wall: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(repeat + 1):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn(r)
            sync()
            if r:
                wall[name].append((time.perf_counter() - t0) * 1000)
                cpu[name].append((time.process_time() - c0) * 1000)
    out = {f"{n}_ms": statistics.median(v) for n, v in wall.items()}
    out.update({f"{n}_min_ms": min(v) for n, v in wall.items()})
    out.update({f"{n}_cpu_ms": statistics.median(v) for n, v in cpu.items()})
    out.update({f"{n}_all_ms": [round(t, 1) for t in v] for n, v in wall.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=".bench/autoaugment.json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, generator=g)
    x8 = x8.to(dev).contiguous(memory_format=torch.channels_last)
    xf = x8.float() / 255
    result = {"device": str(dev), "batch": args.batch, "size": args.size, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "loadavg_before": os.getloadavg()}
    result.update(interleaved(contenders(x8, xf), args.repeat, sync))
    result["loadavg_after"] = os.getloadavg()
    for name in ("trivialaugment", "randaugment"):
        k = result[f"kornia_{name}_ms"]
        for kind in ("uint8", "float"):
            ours = f"gpupipe_{name}_{kind}"
            # the ratio within each round (same load for both), then its median over the rounds
            rounds = [b / a for a, b in zip(result[f"{ours}_all_ms"], result[f"kornia_{name}_all_ms"])]
            result[f"{ours}_speedup_per_round"] = ratio = statistics.median(rounds)
            print(f"{name:15s} gpupipe {kind:5s} {result[ours + '_ms']:8.1f} ms (min {result[ours + '_min_ms']:7.1f})"
                  f"   kornia {k:8.1f} ms (min {result[f'kornia_{name}_min_ms']:7.1f})"
                  f"   kornia/gpupipe per round {ratio:5.2f}x")
    print("load average", result["loadavg_before"], "->", result["loadavg_after"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
