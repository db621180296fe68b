"""Decode-only throughput of every epoch, the first included, against the in-memory ceiling (issue 28).

    .venv/bin/python benchmarks/epoch_bench.py SHARDS --runs 5 --epochs 3 \
        [--code before=../t28-before --code after=.] [--out result.json]

Each run is a fresh Python process (so its first epoch is the process's first, as in training):
it makes a ``GpuLoader`` (DALI on the CPU, 2 decode threads, ``num_workers=0`` unless
``--workers``, no augmentation), times ``--epochs`` passes one by one (each ``for`` from its
first line to its last batch), then, in the same process, the ceiling: the same decoder
configuration on the same batches already in memory (one warm-up pass, then the median of 3),
as ``benchmarks/decode_bench.py`` measures it. With several ``--code`` trees the runs alternate
between them (A B A B ...), each tree's process importing gpupipe from its own folder.
Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys, time
t_import = time.perf_counter()
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.loader.gpu import GpuLoader
shards, bs, side, epochs, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = DecodeConfig(backend="dali", image_size=(side, side), num_threads=2)
t0, c0 = time.perf_counter(), time.process_time()
loader = GpuLoader(shards, batch_size=bs, image_size=(side, side), device="cpu", decode=cfg, num_workers=workers,
                   rank=0, world_size=1)
out = {"make_s": time.perf_counter() - t0, "make_cpu_s": time.process_time() - c0, "epochs": []}
for _ in range(epochs):
    n, first = 0, None
    t0, c0 = time.perf_counter(), time.process_time()
    for b in loader:
        first = first if first is not None else time.perf_counter() - t0
        n += len(b)
    wall = time.perf_counter() - t0
    out["epochs"].append({"images": n, "images_per_s": n / wall, "seconds": wall,
                          "cpu_s": time.process_time() - c0, "first_batch_s": first})
batches = list(EncodedLoader(shards, batch_size=bs, num_workers=0, rank=0, world_size=1))
decoder = make_decoder(cfg, "cpu")
rates = []
for r in range(4):
    t0 = time.perf_counter()
    n = sum(len(decoder.decode(b)) for b in batches)
    if r:
        rates.append(n / (time.perf_counter() - t0))
out["ceiling"] = statistics.median(rates)
out["ceiling_runs"] = rates
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shards")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per code tree")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="a gpupipe tree to run (default: this one); several alternate")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = dict(c.split("=", 1) for c in args.code) or {"this": here}
    result: dict = {"args": vars(args), "load_before": os.getloadavg(), "runs": {name: [] for name in trees}}
    for r in range(args.runs):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            proc = subprocess.run([sys.executable, "-c", CHILD, args.shards, str(args.batch_size), str(args.image_size),
                                   str(args.epochs), str(args.workers)], env=env, capture_output=True, text=True,
                                  check=True, cwd=os.path.abspath(tree))
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            run["load"] = os.getloadavg()[0]
            result["runs"][name].append(run)
            ratios = " ".join(f"{e['images_per_s']:6.0f} ({e['images_per_s'] / run['ceiling']:.2f}, "
                              f"{1000 * e['cpu_s'] / e['images']:.2f} ms)" for e in run["epochs"])
            print(f"run {r} {name:<8} make {run['make_s']:.2f} s | epochs {ratios} | ceiling {run['ceiling']:.0f} | "
                  f"load {run['load']:.2f}", flush=True)
    for name, runs in result["runs"].items():
        per_epoch = [statistics.median(run["epochs"][e]["images_per_s"] / run["ceiling"] for run in runs)
                     for e in range(args.epochs)]
        rates = [statistics.median(run["epochs"][e]["images_per_s"] for run in runs) for e in range(args.epochs)]
        result.setdefault("summary", {})[name] = {"epoch_images_per_s": rates, "epoch_over_ceiling": per_epoch,
                                                   "ceiling": statistics.median(run["ceiling"] for run in runs),
                                                   "make_s": statistics.median(run["make_s"] for run in runs)}
        print(f"{name:<8} median over {len(runs)} runs: epochs " +
              " ".join(f"{r:.0f} ({x:.3f})" for r, x in zip(rates, per_epoch)) +
              f" | ceiling {result['summary'][name]['ceiling']:.0f} | make {result['summary'][name]['make_s']:.2f} s")
    result["load_after"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
