"""Stream-only throughput: gpupipe's EncodedLoader vs a plain sequential read of the same bytes.

    .venv/bin/python benchmarks/stream_bench.py --images 20000 --out .bench/stream.json

Measures samples/s and MB/s of one epoch (encoded bytes, no decode) from local
disk and from a loopback S3 server (moto, through a latency-adding proxy, 0 ms
and 20 ms per request), next to a plain sequential read of the same shard files
in the same run; then peak RSS (main process + workers) streaming a dataset and
one 10x its size. Each timing is the median of --repeat epochs after a warm-up
epoch. Not a test: numbers go to docs/benchmarks.md with the command and hardware.

``--in-place`` (issue 15) measures instead --in-place-images JPEGs as an image
folder, and --table-images (the same JPEGs, cycled) as Parquet files and as tar
shards (all with index.json) on a loopback S3 server (moto, in its own process),
through the proxy at each --latency-ms: images/s, MB/s and requests per image,
epochs of all of them taken in turn (so that the machine's load falls on each
alike); then one epoch of the folder with one request in flight per worker.

    .venv/bin/python benchmarks/stream_bench.py --in-place --in-place-images 3000 --out .bench/inplace.json
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

from gpupipe.formats.writer import ShardSink  # noqa: E402
from gpupipe.loader.encoded import EncodedLoader, StreamConfig  # noqa: E402
from gpupipe.storage.fetch import FetchConfig  # noqa: E402
from gpupipe.tools.synth import synthetic_jpeg  # noqa: E402

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
    from s3util import folder_on_s3

    out = {}
    with folder_on_s3(folder) as (bucket, endpoint):
        fs = bucket.fs()
        for latency_ms in args.latency_ms:
            with FaultProxy(endpoint, latency_s=latency_ms / 1000, methods=()) as proxy:
                opts = {**bucket.storage_options, "endpoint_url": proxy.url}
                make = lambda opts=opts: EncodedLoader(bucket.url("ds/"), batch_size=args.batch_size, num_workers=args.workers,
                                             storage_options=opts, rank=0, world_size=1,
                                             stream=StreamConfig(fetch=FetchConfig(block_bytes=args.block_mb << 20)))
                out[f"s3_{latency_ms}ms"] = timed(make, args.repeat)
                out[f"s3_{latency_ms}ms_sequential_read"] = s3_sequential(fs, bucket, proxy, args.repeat)
    return out


def s3_sequential(fs, bucket, proxy, repeat: int) -> dict:
    """A plain loop of whole-object GETs through the same proxy: the server's ceiling for one reader."""
    import s3fs

    plain = s3fs.S3FileSystem(skip_instance_cache=True, **{**bucket.storage_options, "endpoint_url": proxy.url})
    names = sorted(p for p in fs.ls(f"{bucket.name}/ds") if p.endswith(".tar"))
    return plain_reads(lambda: sum(len(plain.cat_file(p)) for p in names), repeat)


def in_place_sources(args) -> dict:
    """The same JPEGs as an image folder, Parquet files and tar shards on loopback S3, each
    with its index.json, streamed through the proxy at each latency."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fault_proxy import FaultProxy
    from s3util import create_bucket

    from gpupipe.prepare.indexer import index_in_place
    from gpupipe.tools.synth import synthetic_jpeg

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    rng = np.random.default_rng(0)
    n, size = args.in_place_images, args.size
    images = [synthetic_jpeg(rng, (size, size)) for _ in range(n)]  # all distinct: nothing is cached by content
    server, endpoint = _moto_process()
    out: dict = {"images": n, "image_bytes_mean": float(np.mean([len(b) for b in images]))}
    try:
        bucket = create_bucket(endpoint)
        fs, opts = bucket.fs(), bucket.storage_options
        for i, data in enumerate(images):
            fs.pipe_file(f"{bucket.name}/folder/c{i % 10}/img{i:06d}.jpg", data)
        per_file, rows = args.shard_size, [images[i % n] for i in range(args.table_images)]  # the folder's, cycled
        tables = [f"parquet-rg{r}" for r in args.row_group_rows]
        for k in range(0, len(rows), per_file):
            table = pa.table({"image": pa.array(rows[k:k + per_file], pa.binary()),
                              "label": pa.array([i % 10 for i in range(k, min(len(rows), k + per_file))], pa.int64())})
            for name, group_rows in zip(tables, args.row_group_rows):
                with fs.open(f"{bucket.name}/{name}/part-{k // per_file:05d}.parquet", "wb") as f:
                    pq.write_table(table, f, row_group_size=group_rows)
        with ShardSink(bucket.url("tar"), shard_size=per_file, storage_options=opts) as sink:
            for i, data in enumerate(rows):
                sink.write(f"img{i:08d}", {"jpg": data, "cls": str(i % 10).encode()})
        for kind in ("folder", *tables):
            index_in_place(bucket.url(kind + "/"), storage_options=opts, progress=False)
        proxies = [FaultProxy(endpoint, latency_s=ms / 1000, methods=()).start() for ms in args.latency_ms]
        try:
            runs = [(f"{kind}_{ms}ms", kind, proxy, {})
                    for ms, proxy in zip(args.latency_ms, proxies) for kind in ("folder", *tables, "tar")]
            out.update(_interleaved(bucket, opts, runs, args))
            one = {"concurrency": 1, "object_concurrency": 1}
            control = [(f"folder_{ms}ms_concurrency_1", "folder", proxy, one)  # latency not hidden: one epoch
                       for ms, proxy in zip(args.latency_ms, proxies) if ms]
            out.update(_interleaved(bucket, opts, control, argparse.Namespace(**{**vars(args), "repeat": 0})))
        finally:
            for proxy in proxies:
                proxy.stop()
    finally:
        server.terminate()
        server.wait()
    for kind in ("folder", *tables):
        for latency_ms in args.latency_ms:
            run = out[f"{kind}_{latency_ms}ms"]
            run["vs_tar_same_latency"] = run["samples_per_s"] / out[f"tar_{latency_ms}ms"]["samples_per_s"]
            run["vs_own_0ms"] = run["samples_per_s"] / out[f"{kind}_{args.latency_ms[0]}ms"]["samples_per_s"]
    return out


def _moto_process():
    """A moto S3 server in its own process (its own interpreter lock, apart from the proxy's
    threads in this one): ``(process, endpoint)``."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def _interleaved(bucket, opts: dict, runs: list, args) -> dict:
    """Each run's epochs taken in turn — run 1, run 2, ..., run 1 again — so that a change in
    the machine's load falls on all of them alike: a warm-up round, then --repeat rounds."""
    loaders, requests = {}, {}
    for name, kind, proxy, fetch_options in runs:
        fetch = FetchConfig(block_bytes=args.block_mb << 20, **{"concurrency": args.concurrency, **fetch_options})
        loaders[name] = EncodedLoader(bucket.url(kind + "/"), batch_size=args.batch_size, num_workers=args.workers,
                                      storage_options={**opts, "endpoint_url": proxy.url}, rank=0, world_size=1,
                                      stream=StreamConfig(fetch=fetch))
    times: dict[str, list] = {name: [] for name, *_ in runs}
    for round_ in range(args.repeat + 1):
        for name, _, proxy, _ in runs:
            before = proxy.counts["requests"]
            n, nbytes, secs = epoch(loaders[name])
            requests[name] = (proxy.counts["requests"] - before) / n
            if round_ or not args.repeat:  # without repeats, the one epoch is the measurement
                times[name].append((n, nbytes, secs))
    out = {}
    for name, got in times.items():
        secs = statistics.median(t[2] for t in got)
        n, nbytes = got[0][0], got[0][1]
        out[name] = {"samples": n, "bytes": nbytes, "seconds": secs, "samples_per_s": n / secs,
                     "MB_per_s": nbytes / secs / MB, "runs_s": [round(t[2], 3) for t in got],
                     "requests_per_image": requests[name]}
    return out


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
    ap.add_argument("--in-place", action="store_true", help="image folder / Parquet / tar on loopback S3 (issue 15)")
    ap.add_argument("--in-place-images", type=int, default=3000)
    ap.add_argument("--table-images", type=int, default=20000, help="rows of the Parquet and tar copies "
                    "(the folder's images, cycled): long enough epochs for sources this fast")
    ap.add_argument("--row-group-rows", type=int, nargs="*", default=[100, 250],
                    help="one Parquet copy per row-group size (100: what Hugging Face datasets writes for images)")
    ap.add_argument("--concurrency", type=int, default=8, help="stream.fetch.concurrency")
    ap.add_argument("--data", default=".bench/data")
    ap.add_argument("--out", default=".bench/stream.json")
    args = ap.parse_args()
    if args.in_place:
        load = os.getloadavg()
        result = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "args": vars(args), **in_place_sources(args), "load_avg_start": load, "load_avg_end": os.getloadavg()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return

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
