"""Stream-only throughput: gpupipe's EncodedLoader vs a plain sequential read of the same bytes.

    .venv/bin/python benchmarks/stream_bench.py --images 20000 --out .bench/stream.json

Measures samples/s and MB/s of one epoch (encoded bytes, no decode) from local
disk and from a loopback S3 server (moto, through a latency-adding proxy, 0 ms
and 20 ms per request), next to a plain sequential read of the same shard files
in the same run; then peak RSS (main process + workers) streaming a dataset and
one 10x its size. Each timing is the median of --repeat epochs after a warm-up
epoch. Not a test: numbers go to docs/benchmarks.md with the command and hardware.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gpupipe.dataset import EncodedLoader, StreamConfig  # noqa: E402
from gpupipe.formats.writer import ShardSink  # noqa: E402
from gpupipe.synth import synthetic_jpeg  # noqa: E402
from gpupipe.storage import FetchConfig  # noqa: E402

MB = 1e6


def build(dst: str, images: int, size: int, shard_size: int, unique: int = 500) -> None:
    """Shards of real JPEGs (``unique`` distinct ones, cycled: the stream does not look inside)."""
    if Path(dst, "index.json").exists():
        return
    rng = np.random.default_rng(0)
    pool = [synthetic_jpeg(rng, (size, size)) for _ in range(min(unique, images))]
    with ShardSink(dst, shard_size=shard_size) as sink:
        for i in range(images):
            sink.write(f"img{i:08d}", {"jpg": pool[i % len(pool)], "cls": str(i % 1000).encode()})


def epoch(loader) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    n = nbytes = 0
    for b in loader:
        n += len(b)
        nbytes += b.nbytes
    return n, nbytes, time.perf_counter() - t0


def timed(make_loader, repeat: int) -> dict:
    loader = make_loader()
    epoch(loader)  # warm-up: page cache, worker start-up paths, server caches
    runs = [epoch(loader) for _ in range(repeat)]
    secs = statistics.median(r[2] for r in runs)
    n, nbytes = runs[0][0], runs[0][1]
    return {"samples": n, "bytes": nbytes, "seconds": secs, "samples_per_s": n / secs, "MB_per_s": nbytes / secs / MB,
            "runs_s": [round(r[2], 4) for r in runs]}


def plain_reads(read_all, repeat: int) -> dict:
    """MB/s of ``read_all()`` (which returns the bytes it read): median after a warm-up."""
    def once():
        t0 = time.perf_counter()
        total = read_all()
        return total, time.perf_counter() - t0
    once()
    runs = [once() for _ in range(repeat)]
    secs = statistics.median(r[1] for r in runs)
    return {"bytes": runs[0][0], "seconds": secs, "MB_per_s": runs[0][0] / secs / MB}


def sequential_read(folder: str, repeat: int) -> dict:
    files = sorted(Path(folder).glob("*.tar"))
    return plain_reads(lambda: sum(len(f.read_bytes()) for f in files), repeat)


def s3_runs(folder: str, args) -> dict:
    from fault_proxy import FaultProxy
    from s3util import create_bucket, start_moto_server

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server, endpoint = start_moto_server()
    out = {}
    try:
        bucket = create_bucket(endpoint)
        fs = bucket.fs()
        for f in sorted(Path(folder).iterdir()):
            fs.pipe_file(f"{bucket.name}/ds/{f.name}", f.read_bytes())
        for latency_ms in args.latency_ms:
            with FaultProxy(endpoint, latency_s=latency_ms / 1000, methods=()) as proxy:
                opts = {**bucket.storage_options, "endpoint_url": proxy.url}
                make = lambda opts=opts: EncodedLoader(bucket.url("ds/"), batch_size=args.batch_size, num_workers=args.workers,
                                             storage_options=opts, rank=0, world_size=1,
                                             stream=StreamConfig(fetch=FetchConfig(block_bytes=args.block_mb << 20)))
                out[f"s3_{latency_ms}ms"] = timed(make, args.repeat)
                out[f"s3_{latency_ms}ms_sequential_read"] = s3_sequential(fs, bucket, proxy, args.repeat)
    finally:
        server.stop()
    return out


def s3_sequential(fs, bucket, proxy, repeat: int) -> dict:
    """A plain loop of whole-object GETs through the same proxy: the server's ceiling for one reader."""
    import s3fs

    plain = s3fs.S3FileSystem(skip_instance_cache=True, **{**bucket.storage_options, "endpoint_url": proxy.url})
    names = sorted(p for p in fs.ls(f"{bucket.name}/ds") if p.endswith(".tar"))
    return plain_reads(lambda: sum(len(plain.cat_file(p)) for p in names), repeat)


def peak_rss(folder: str, args) -> float:
    """Peak RSS (MB) of this process tree while streaming one epoch, in a fresh interpreter."""
    code = (f"import sys; sys.path[:0]=[{str(ROOT)!r}, {str(ROOT / 'benchmarks')!r}]\n"
            "from stream_bench import _rss_child; _rss_child()\n")
    env = {**os.environ, "RSS_FOLDER": folder, "RSS_WORKERS": str(args.workers), "RSS_BATCH": str(args.batch_size)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _tree_rss_mb(pid: int) -> float:
    pids, total = {pid}, 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    pids.add(int(d))
            except (OSError, IndexError, ValueError):
                continue
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _rss_child() -> None:
    peak, stop = [0.0], threading.Event()
    def sample():
        while not stop.wait(0.02):
            peak[0] = max(peak[0], _tree_rss_mb(os.getpid()))
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    loader = EncodedLoader(os.environ["RSS_FOLDER"], batch_size=int(os.environ["RSS_BATCH"]),
                           num_workers=int(os.environ["RSS_WORKERS"]), rank=0, world_size=1)
    epoch(loader)
    stop.set()
    t.join()
    print(peak[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--size", type=int, default=250)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--block-mb", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=int, nargs="*", default=[0, 20])
    ap.add_argument("--rss-scale", type=int, default=10, help="the large RSS run has this many times the images")
    ap.add_argument("--data", default=".bench/data")
    ap.add_argument("--out", default=".bench/stream.json")
    args = ap.parse_args()

    folder = f"{args.data}/stream-{args.images}-{args.size}"
    build(folder, args.images, args.size, args.shard_size)
    make = lambda: EncodedLoader(folder, batch_size=args.batch_size, num_workers=args.workers, rank=0, world_size=1)
    result = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "args": vars(args),
              "sequential_read": sequential_read(folder, args.repeat),
              "local": timed(make, args.repeat),
              "local_in_process": timed(lambda: EncodedLoader(folder, batch_size=args.batch_size, num_workers=0,
                                                              rank=0, world_size=1), args.repeat)}
    result.update(s3_runs(folder, args))
    if args.rss_scale > 1:
        big = f"{args.data}/stream-{args.images * args.rss_scale}-{args.size}"
        build(big, args.images * args.rss_scale, args.size, args.shard_size)
        result["peak_rss_mb"] = {"small": peak_rss(folder, args), f"x{args.rss_scale}": peak_rss(big, args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
