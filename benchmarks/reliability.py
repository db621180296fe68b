"""The fault matrix of issue 7, as figures: one epoch per (fault class, rate, seed) through
the fault proxy in front of a loopback moto S3 server, checked against a ledger of ids.

    .venv/bin/python benchmarks/reliability.py [--seeds 3] [--rates 0.01 0.05 0.2] [--json out.json]

Per class and rate: ``injected`` faults (the proxy's count), epochs ``survived`` (exactly the
full set, each sample's bytes its own), epochs ``surfaced`` (ended by an error naming the
URL; for 403/404 that is the expected outcome), ``wrong`` (epochs that delivered a lost,
repeated or wrong sample: must be 0), retry amplification (GET requests / the GETs of a
fault-free epoch) and throughput relative to the fault-free epochs of the same run.
Everything stays on 127.0.0.1. The test-only helpers (proxy, moto, dataset writer) come
from ``tests/``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]

COUNTS = [40, 0, 33, 57, 12]  # 142 samples, one shard empty
BLOCK = 2048  # about one sample per request: ~150 GETs an epoch


@dataclass
class Row:
    fault: str
    rate: float
    epochs: int = 0
    injected: int = 0
    survived: int = 0
    surfaced: int = 0
    wrong: int = 0
    requests: int = 0
    seconds: float = 0.0
    max_error_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _environment() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true")
    import s3fs

    s3fs.S3FileSystem.retries = 1  # every fault reaches gpupipe's own retries


def _dataset(bucket) -> tuple[str, dict[str, bytes]]:
    """Checked shards (``gpupipe index``) and, per shard path, a different object to serve
    when a read is to see the shard replaced."""
    from datagen import write_dataset

    from gpupipe.prepare.indexer import index

    opts = bucket.storage_options
    write_dataset(bucket.url("ds"), COUNTS, storage_options=opts, manifest=False)
    index(bucket.url("ds/"), storage_options=opts, progress=False)
    write_dataset(bucket.url("alt"), [1, *COUNTS], storage_options=opts, manifest=False)
    fs = bucket.fs()
    alternates = {f"/{bucket.name}/ds/part-{i:04d}.tar": fs.cat_file(f"{bucket.name}/alt/part-{i + 1:04d}.tar")
                  for i in range(len(COUNTS))}
    return bucket.url("ds/"), alternates


def _epoch(url: str, opts: dict, proxy) -> tuple[str, float, int, str]:
    """One epoch: (outcome, seconds, GET requests, error text); outcome is survived,
    surfaced or wrong. For a surfaced error, ``seconds`` counts from the first injected
    fault (the proxy's clock), not from the start of the epoch."""
    from datagen import ids_of

    from gpupipe.core.errors import GpupipeError
    from gpupipe.loader.encoded import EncodedLoader, StreamConfig
    from gpupipe.storage.fetch import FetchConfig

    fetch = FetchConfig(block_bytes=BLOCK, backoff_s=0.005, backoff_max_s=0.1, retries=12, request_timeout_s=5)
    gets0 = proxy.counts.get("method:GET", 0)
    t0 = time.perf_counter()
    try:
        loader = EncodedLoader(url, batch_size=8, num_workers=0, storage_options=opts, rank=0, world_size=1,
                               drop_last=False, stream=StreamConfig(shuffle_buffer=32, fetch=fetch))
        got = sorted(i for b in loader for i in ids_of(b))
        outcome, error = ("survived" if got == list(range(sum(COUNTS))) else "wrong"), ""
    except GpupipeError as exc:
        outcome, error = "surfaced", str(exc).splitlines()[0][:160]
    except AssertionError as exc:  # ids_of: a sample's bytes are not its own
        outcome, error = "wrong", str(exc)[:160]
    seconds = time.perf_counter() - t0
    injected_at = [t for name, t in proxy.first_at.items() if name in proxy.faults]
    if outcome == "surfaced" and injected_at:
        seconds = time.monotonic() - min(injected_at)
    return outcome, seconds, proxy.counts.get("method:GET", 0) - gets0, error


def run(rates: list[float], seeds: int, faults: list[str]) -> tuple[list[Row], Row]:
    import s3util
    from fault_proxy import FATAL

    _environment()
    server, endpoint = s3util.start_moto_server()
    bucket = s3util.create_bucket(endpoint)
    try:
        url, alternates = _dataset(bucket)
        _add(Row("warm-up", 0.0), url, bucket, alternates, "slowdown", 0.0, 0)  # imports, first connections
        clean = Row("none", 0.0)
        for seed in range(2 * seeds):
            _add(clean, url, bucket, alternates, "slowdown", 0.0, seed)
        rows = []
        for fault in faults:
            for rate in rates:
                row = Row(fault, rate)
                for seed in range(seeds):
                    _add(row, url, bucket, alternates, fault, rate, seed, fatal=fault in FATAL)
                rows.append(row)
                print(_line(row, clean), file=sys.stderr, flush=True)
        return rows, clean
    finally:
        s3util.delete_bucket(bucket)
        server.stop()


def _add(row: Row, url, bucket, alternates, fault: str, rate: float, seed: int, fatal: bool = False) -> None:
    import s3util
    from fault_proxy import FaultProxy

    proxy = FaultProxy(bucket.endpoint, fault_rate=rate, faults=(fault,), seed=1000 * seed + int(rate * 1000),
                       stall_seconds=3.0, alternates=alternates).start()
    try:
        opts = s3util.storage_options_via(proxy, bucket, timeout_s=0.5)
        outcome, seconds, gets, error = _epoch(url, opts, proxy)
    finally:
        proxy.stop()
    row.epochs += 1
    row.injected += proxy.counts.get(fault, 0)
    setattr(row, outcome, getattr(row, outcome) + 1)
    row.requests += gets
    row.seconds += seconds
    if outcome == "surfaced":
        row.max_error_s = max(row.max_error_s, seconds)
        if len(row.errors) < 2:
            row.errors.append(error)


def _line(row: Row, clean: Row) -> str:
    amp = (row.requests / row.epochs) / (clean.requests / clean.epochs) if row.epochs and clean.requests else 0.0
    done = row.epochs - row.surfaced  # throughput only means something for epochs that finished
    rel = (clean.seconds / clean.epochs) / (row.seconds / row.epochs) if done == row.epochs and row.seconds else None
    rel_text = f"{rel:.2f}" if rel is not None else "—"
    err = f"{row.max_error_s:.2f}" if row.surfaced else "—"
    return (f"| {row.fault} | {row.rate:.0%} | {row.epochs} | {row.injected} | {row.survived} | {row.surfaced} | "
            f"{row.wrong} | {amp:.2f} | {rel_text} | {err} |")


def table(rows: list[Row], clean: Row) -> str:
    head = ("| fault | rate | epochs | injected | survived | surfaced | wrong | retry amplification "
            "| throughput vs 0% | max s fault→error |\n|---|---|---|---|---|---|---|---|---|---|")
    base = (f"fault-free: {clean.epochs} epochs, {clean.requests / clean.epochs:.0f} GETs and "
            f"{sum(COUNTS) * clean.epochs / clean.seconds:.0f} samples/s an epoch")
    return "\n".join([base, "", head, *(_line(r, clean) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    from fault_proxy import FATAL, RETRYABLE

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--faults", nargs="+", default=list(RETRYABLE + FATAL))
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    rows, clean = run(args.rates, args.seeds, args.faults)
    print(table(rows, clean))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"clean": asdict(clean), "rows": [asdict(r) for r in rows], "counts": COUNTS,
                       "block_bytes": BLOCK}, f, indent=1)
    return 1 if any(r.wrong for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
