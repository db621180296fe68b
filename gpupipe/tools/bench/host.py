"""``gpupipe bench SOURCE --stage host``: the host path alone, beside DALI's reader.

On a GPU machine the CPU only moves bytes: shards → encoded batches (fetch, tar headers,
checksums, shuffle, pack). This times exactly that — :class:`~gpupipe.loader.encoded.EncodedLoader`,
nothing decoded — and DALI's ``fn.readers.webdataset`` on the same shards (the same members, a
1,024-sample shuffle buffer, ``--workers`` threads, default 1), interleaved over ``--repeat``
rounds (order rotated each round). Each run is a fresh pass of ``--batches`` batches (default:
one epoch) after a warm-up pass. Reported per loader: the median samples/s (min-max), CPU
time per sample (the process and its worker processes, all threads), and so
samples/s per core — what sizes the CPU cores one GPU needs: a GPU decoding R images/s needs
R × (CPU µs per sample) / 10⁶ cores for its host path.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from gpupipe.core.errors import ConfigError

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

__all__ = ["run_host", "host_loaders", "time_host"]

H100_DECODE = 25_000  # images/s an H100's decoders take of small JPEGs (the issue's 20-30k): the sizing example


def host_loaders(source: str, *, batch_size: int, workers: int, seed: int, storage_options: dict,
                 dali: bool, tmp: str) -> dict[str, Callable[[int | None], Iterator[int]]]:
    """``name -> run(batches)``: each call makes one timed pass, yielding batch sizes."""
    from gpupipe.loader.encoded import EncodedLoader

    loader = EncodedLoader(source, batch_size=batch_size, num_workers=workers, seed=seed,
                           storage_options=storage_options, rank=0, world_size=1)
    epochs = iter(range(1 << 30))

    def gpupipe(batches: int | None) -> Iterator[int]:
        done = 0
        while batches is None or done < batches:
            loader.set_epoch(next(epochs))
            passing = cast(Generator, iter(loader))  # EncodedLoader.__iter__ is a generator
            try:
                for batch in passing:
                    yield len(batch)
                    done += 1
                    if batches is not None and done == batches:
                        return
            finally:
                passing.close()
            if batches is None:
                return

    runs: dict[str, Callable[[int | None], Iterator[int]]] = {f"gpupipe w={workers}": gpupipe}
    if dali:
        runs[f"dali t={max(1, workers)}"] = _dali_reader(source, batch_size=batch_size, threads=max(1, workers),
                                                         seed=seed, per_epoch=len(loader), tmp=tmp)
    return runs


def _dali_reader(source: str, *, batch_size: int, threads: int, seed: int, per_epoch: int,
                 tmp: str) -> Callable[[int | None], Iterator[int]]:
    """DALI's reader alone over the local shards (its outputs: the jpg and cls members)."""
    from nvidia.dali import fn, pipeline_def

    from gpupipe.tools.bench.dali import write_index

    shards = sorted(glob.glob(os.path.join(source, "*.tar"))) if os.path.isdir(source) else sorted(glob.glob(source))
    if not shards:
        raise ConfigError(f"bench --stage host: DALI's reader needs local .tar shards; none at {source!r}")
    index = write_index(shards, tmp)

    # device_id None (CPU only) is what DALI's docs and code take; its overload's annotation says int
    @pipeline_def(batch_size=batch_size, num_threads=threads, seed=seed, prefetch_queue_depth=2,  # type: ignore[call-overload]
                  device_id=None)
    def pipe():
        jpegs, labels = cast("Sequence[DataNode]", fn.readers.webdataset(
            paths=shards, index_paths=index, ext=["jpg", "cls"], random_shuffle=True, initial_fill=1024,
            missing_component_behavior="skip", name="reader"))
        return jpegs, labels

    p = pipe()
    p.build()

    def run(batches: int | None) -> Iterator[int]:
        for _ in range(per_epoch if batches is None else batches):
            images, _ = p.run()
            yield len(images)

    return run


def time_host(run: Callable[[int | None], Iterator[int]], batches: int | None) -> dict[str, float]:
    """One pass: samples/s and CPU µs per sample (this process and its workers, running or ended)."""
    from gpupipe.tools.bench.measure import cpu_seconds

    c0, t0 = cpu_seconds(), time.perf_counter()
    n = sum(run(batches))
    t1, c1 = time.perf_counter(), cpu_seconds()
    return {"samples": n, "rate": n / (t1 - t0), "cpu_us": 1e6 * (c1 - c0) / max(n, 1)}


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    rates, cpu = [r["rate"] for r in runs], [r["cpu_us"] for r in runs]
    med_cpu = statistics.median(cpu)
    return {"samples_per_s": round(statistics.median(rates), 1), "samples_per_s_min": round(min(rates), 1),
            "samples_per_s_max": round(max(rates), 1), "cpu_us_per_sample": round(med_cpu, 2),
            "samples_per_s_per_core": round(1e6 / med_cpu, 1), "runs": [round(r, 1) for r in rates],
            "cpu_us_runs": [round(c, 2) for c in cpu]}


def run_host(args: argparse.Namespace) -> dict[str, Any]:
    """Time the host path (and DALI's reader, where installed) on ``args.targets[0]``."""
    import importlib.util

    if len(args.targets) != 1 or args.targets[0].endswith((".yaml", ".yml")):
        raise ConfigError("bench --stage host: give one SOURCE (a shard folder or pattern), not a config")
    workers = (args.workers or (0,))
    if len(workers) != 1:
        raise ConfigError("bench --stage host: one --workers count at a time")
    dali = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
    repeat = args.repeat or 5
    with tempfile.TemporaryDirectory(prefix="gpupipe-host-") as tmp:
        runs = host_loaders(args.targets[0], batch_size=args.batch_size or 256, workers=workers[0], seed=args.seed,
                            storage_options=dict(args.storage_options), dali=dali, tmp=tmp)
        for run in runs.values():  # warm-up: the page cache, imports, DALI's first batches
            time_host(run, args.batches)
        timed: dict[str, list] = {name: [] for name in runs}
        names = list(runs)
        for r in range(repeat):
            for name in names[r % len(names):] + names[:r % len(names)]:
                timed[name].append(time_host(runs[name], args.batches))
    results = {name: _summary(v) for name, v in timed.items()}
    out: dict[str, Any] = {"stage": "host", "source": args.targets[0], "batch_size": args.batch_size or 256,
                           "repeat": repeat, "results": results, "loadavg_at_end": [round(v, 2) for v in os.getloadavg()]}
    if len(results) == 2:
        g, d = results.values()
        out["per_core_vs_dali"] = round(d["cpu_us_per_sample"] / g["cpu_us_per_sample"], 3)
    else:
        out["note"] = "DALI is not installed: its reader was not run (pip install gpupipe[dali])"
    return out


def print_host(result: dict[str, Any]) -> None:
    print(f"host path: {result['source']}, batch {result['batch_size']}, {result['repeat']} rounds "
          f"(median, min-max); load average at end {result['loadavg_at_end']}")
    for name, r in result["results"].items():
        cores = H100_DECODE * r["cpu_us_per_sample"] / 1e6
        print(f"  {name:<12} {r['samples_per_s']:9,.0f} samples/s ({r['samples_per_s_min']:,.0f}-"
              f"{r['samples_per_s_max']:,.0f}) | CPU {r['cpu_us_per_sample']:6.1f} us/sample = "
              f"{r['samples_per_s_per_core']:8,.0f} samples/s per core | {cores:.2f} cores per {H100_DECODE:,} img/s")
    if "per_core_vs_dali" in result:
        print(f"  gpupipe / DALI's reader, per core: {result['per_core_vs_dali']:.2f}")
    if "note" in result:
        print(f"  note: {result['note']}")
