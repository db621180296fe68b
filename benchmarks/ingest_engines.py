"""``gpupipe ingest`` on each engine, the same job: throughput, and whether the bytes are the same.

    python benchmarks/ingest_engines.py ROOT [--images 20000] [--size 128] [--shard-size 1000]
        [--engines local,local:2,ray:2]

Makes (once) ``--images`` dead-leaves JPEGs of ``--size``² px in 10 class folders under ``ROOT/images``,
then ingests them into ``ROOT/out-<engine>`` with each engine: ``local`` (tasks one after another in
this process), ``local:N`` (N processes), ``ray:N`` (a local Ray instance of N CPUs on loopback,
started before the clock starts). Prints images/s per engine and whether every file each wrote
equals the first engine's, byte for byte. A benchmark, not a test (issue 39; docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import time
from pathlib import Path


def make_images(root: Path, images: int, size: int) -> Path:
    folder = root / "images"
    if not folder.exists():
        from gpupipe.tools.synth import write_leaves_folder

        write_leaves_folder(str(folder), [(size, size)] * images, seed=0, quality=90, workers=os.cpu_count() or 1,
                            progress=False)
    return folder


def same_files(a: Path, b: Path) -> bool:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    if names != sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--engines", default="local,local:2,ray:2")
    args = ap.parse_args()
    root = Path(args.root)
    src = make_images(root, args.images, args.size)
    from gpupipe.prepare.ingest import ingest

    first: Path | None = None
    for spec in args.engines.split(","):
        engine, _, n = spec.partition(":")
        count = int(n or 1)
        out = root / f"out-{spec.replace(':', '-')}"
        shutil.rmtree(out, ignore_errors=True)
        if engine == "ray":
            import ray

            ray.init(num_cpus=count, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        try:
            t0 = time.perf_counter()
            report = ingest(str(src), str(out), shard_size=args.shard_size, engine=engine,
                            processes=count if engine == "local" else 1, progress=False)
            dt = time.perf_counter() - t0
        finally:
            if engine == "ray":
                ray.shutdown()
        same = "first" if first is None else ("same bytes" if same_files(first, out) else "DIFFERENT BYTES")
        first = first or out
        print(f"{spec:10s} {report.num_samples} images in {report.num_shards} shards, {dt:6.1f} s = "
              f"{report.num_samples / dt:7.0f} images/s  ({same}); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
