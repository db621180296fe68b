"""Shuffle quality and what it costs to read (issue 35): blocks of shards against shards whole.

    .venv/bin/python benchmarks/shuffle_bench.py --root .bench/class-ordered [--blocks 0,1,2,8] [--latency-ms 20]

Writes (once) ``--samples`` samples of ``--classes`` classes in ``--shards`` tar shards **in class
order**, as a sorted ImageFolder packed without shuffling gives, with webdataset's ``TarWriter``
(pax headers), then ``gpupipe index``. The images are a pool of distinct dead-leaves JPEGs
(``--size``² px) cycled: the stream never looks inside them. Then, for each ``stream.shuffle_block``
in ``--blocks`` (0: shards whole, the layout before blocks), one epoch of ``EncodedLoader``
(batch 256, the default window, shuffled, ``--workers`` workers):

* shuffle quality from the batches' labels: the mean share of the most common class per batch
  and the mean number of classes per batch, beside a uniform shuffle's of the same labels;
* local disk: samples/s (median of ``--repeat`` epochs after a warm-up);
* a loopback S3 server (moto, in-process) through the test tree's proxy adding ``--latency-ms``
  per request: samples/s, requests per sample and bytes per request (the proxy's count).

A benchmark, not a test: numbers go to docs/benchmarks.md with the command and the machine.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gpupipe.loader.encoded import EncodedLoader, StreamConfig  # noqa: E402


def make(root: str, samples: int, classes: int, shards: int, size: int, pool: int) -> str:
    """Class-ordered shards written by webdataset's TarWriter, indexed by gpupipe."""
    import webdataset as wds

    from gpupipe.prepare.indexer import index
    from gpupipe.tools.synth import dead_leaves_jpeg

    folder = os.path.join(root, "shards")
    if os.path.exists(os.path.join(folder, "index.json")):
        return folder
    os.makedirs(folder, exist_ok=True)
    jpegs = [dead_leaves_jpeg(0, i, (size, size), quality=90) for i in range(pool)]
    per_shard = samples // shards
    for s in range(shards):
        with wds.TarWriter(os.path.join(folder, f"shard-{s:05d}.tar")) as sink:
            for i in range(s * per_shard, (s + 1) * per_shard):
                sink.write({"__key__": f"{i:08d}", "jpg": jpegs[i % pool], "cls": str(i * classes // samples).encode()})
    index(folder, progress=False)
    return folder


def quality(labels: list[np.ndarray], classes: int) -> tuple[float, float]:
    counts = np.stack([np.bincount(lab, minlength=classes) for lab in labels])
    return float((counts.max(1) / counts.sum(1)).mean()), float((counts > 0).sum(1).mean())


def uniform(samples: int, classes: int, batch: int) -> tuple[float, float]:
    labels = np.arange(samples) * classes // samples
    rng = np.random.default_rng(0)
    got = [quality(list(labels[rng.permutation(samples)][: samples // batch * batch].reshape(-1, batch)), classes)
           for _ in range(8)]
    return float(np.mean([g[0] for g in got])), float(np.mean([g[1] for g in got]))


def epoch(loader) -> tuple[int, float, list[np.ndarray]]:
    t0 = time.perf_counter()
    n, labels = 0, []
    for b in loader:
        n += len(b)
        labels.append(b.labels.numpy()[b.valid.numpy()])
    return n, time.perf_counter() - t0, labels


def timed(make_loader, repeat: int) -> dict:
    loader = make_loader()
    epoch(loader)  # warm-up: page cache, worker start, server caches
    runs = [epoch(loader) for _ in range(repeat)]
    secs = statistics.median(r[1] for r in runs)
    return {"samples": runs[0][0], "seconds": secs, "samples_per_s": runs[0][0] / secs,
            "runs_s": [round(r[1], 3) for r in runs], "labels": runs[0][2]}


def loader_for(url: str, block: int, args, cache_dir: str | None = None, **kw) -> EncodedLoader:
    from gpupipe.storage.fetch import FetchConfig

    return EncodedLoader(url, batch_size=args.batch_size, num_workers=args.workers, rank=0, world_size=1, seed=1,
                         stream=StreamConfig(shuffle_block=block, fetch=FetchConfig(cache_dir=cache_dir)), **kw)


def s3_runs(folder: str, args) -> dict:
    import tempfile

    from fault_proxy import FaultProxy
    from s3util import folder_on_s3

    out = {}
    with folder_on_s3(folder) as (bucket, endpoint), \
            FaultProxy(endpoint, latency_s=args.latency_ms / 1000, methods=()) as proxy:
        opts = {**bucket.storage_options, "endpoint_url": proxy.url}
        runs = [(b, None) for b in args.blocks] + [(b, "cache") for b in args.blocks if args.s3_cache]
        for block, cached in runs:
            before = dict(proxy.counts)
            cache = tempfile.mkdtemp(prefix="gpupipe-cache-") if cached else None  # warmed by timed's first epoch
            r = timed(lambda block=block, cache=cache: loader_for(bucket.url("ds/"), block, args, cache,
                                                                  storage_options=opts), args.repeat)
            gets = proxy.counts.get("method:GET", 0) - before.get("method:GET", 0)
            epochs = args.repeat + 1
            r.pop("labels")
            r["gets_per_sample"] = gets / (epochs * r["samples"])
            r["bytes_per_get"] = epochs * r["samples"] * args.mean_bytes / max(gets, 1)
            out[f"{block}{'+cache' if cached else ''}"] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".bench/class-ordered")
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--pool", type=int, default=200)
    ap.add_argument("--blocks", default="0,1,2,8")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--s3-cache", action="store_true", help="also with fetch.cache_dir (warmed by the first epoch)")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.blocks = [int(b) for b in args.blocks.split(",")]
    folder = make(args.root, args.samples, args.classes, args.shards, args.size, args.pool)
    sizes = [f.stat().st_size for f in Path(folder).glob("*.tar")]
    args.mean_bytes = sum(sizes) / args.samples
    u_share, u_present = uniform(args.samples, args.classes, args.batch_size)
    print(f"{args.samples} samples, {args.classes} classes in {args.shards} class-ordered shards (TarWriter), "
          f"{args.mean_bytes / 1e3:.1f} KB a sample, batch {args.batch_size}, {args.workers} workers; "
          f"uniform shuffle: most common class {u_share:.1%} of a batch, {u_present:.1f} classes")
    out = {"uniform": {"share": u_share, "classes": u_present}, "local": {}, "s3": {}}
    for block in args.blocks:
        r = timed(lambda block=block: loader_for(folder, block, args), args.repeat)
        share, present = quality(r.pop("labels"), args.classes)
        r.update(share=share, classes=present)
        out["local"][block] = r
        print(f"  block {block:>2}: most common class {share:.1%} ({share / u_share:.2f}x uniform), "
              f"{present:.1f} classes a batch; local {r['samples_per_s']:,.0f} samples/s", flush=True)
    if not args.no_s3:
        out["s3"] = s3_runs(folder, args)
        for block, r in out["s3"].items():
            print(f"  block {block:>8}: S3 +{args.latency_ms:g} ms {r['samples_per_s']:,.0f} samples/s, "
                  f"{r['gets_per_sample']:.3f} GETs a sample, {r['bytes_per_get'] / 1e3:,.0f} KB a GET", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
