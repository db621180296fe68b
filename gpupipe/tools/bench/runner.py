"""Run gpupipe and the baselines on the same data, interleaved, and summarise.

For each transform set and each worker count, every loader first runs a short
warm-up; then ``repeat`` rounds follow, each timing every loader once, in an order
rotated by one per round (so no loader always follows the same one). A timed run
starts the loader afresh (worker processes, or DALI's pipeline) and takes
``skip + batches`` batches; images/s counts the last ``batches`` only, so start-up
is left out on every side alike. CPU % (process + children, of all cores), peak
RSS of the process tree and GPU figures cover the whole run, start-up included.
Reported: the median over rounds, with min and max.

Worker counts mean: gpupipe's stream workers (decode and augment run in the
training process), the baselines' DataLoader workers (decode + transforms per
sample), DALI's threads (at least 1). A count of ``None`` (``gpupipe bench`` without
``--workers``) runs each loader as its users would leave it: gpupipe at its own
choice (the config's ``loader.num_workers``, else ``default_num_workers``: 0 where it
decodes on a CPU of ≤ 4 cores), the baselines with one worker per core and DALI one
thread per core; each row then names the count it ran with.
"""
from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from gpupipe.core.errors import ConfigError
from gpupipe.tools.bench.measure import Sampler, children_cpu, cpu_seconds, gpu_note, thread_cpu
from gpupipe.tools.bench.steps import Step

__all__ = ["LOADERS", "BenchCase", "RunSpec", "run_benchmark", "validate", "check_loaders"]

log = logging.getLogger(__name__)
LOADERS = ("gpupipe", "baseline", "webdataset", "dali")


@dataclass(frozen=True)
class BenchCase:
    """One transform set on one dataset. ``make_gpupipe(num_workers, device)`` builds the
    gpupipe loader; the baselines read ``shards`` (local tar paths) or, for an image folder read
    in place (``kind`` ``folder``), its images directly (``items``: the folder's own listing, the
    files gpupipe reads, with its labels and sample keys)."""

    name: str
    shards: tuple[str, ...]
    image_size: tuple[int, int]
    batch_size: int
    steps: tuple[Step, ...]
    make_gpupipe: Callable[[int | None, Any], Any]  # (num_workers, None: the config's; device)
    images_dir: str | None = None
    num_samples: int | None = None
    seed: int = 0
    on_error: str = "raise"  # gpupipe's for this run; the baselines do the same with a bad image
    kind: str = "tar"  # the source's (ResolvedSource.kind): tar shards, an image folder or Parquet read in place
    items: tuple | None = None  # an image folder's images as the baseline reads them (baselines.Item)


@dataclass(frozen=True)
class RunSpec:
    loaders: tuple[str, ...] = ("gpupipe",)
    workers: tuple[int | None, ...] = (0,)  # None: each loader's own default (above)
    batches: int | None = None  # timed per run; None: one epoch's worth
    repeat: int = 3
    warmup: int = 4
    skip: int = 2
    device: str = "cpu"
    per_sample: str = "auto"


@dataclass
class _Runs:
    rates: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    us: list[dict] = field(default_factory=list)
    gpu: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)


class _Opened:
    """One loader at one worker count: ``stream()`` starts a fresh endless batch stream
    (a generator: closing it stops the loader's workers)."""

    def __init__(self, stream: Callable[[], Generator[int, None, None]], info: dict, stats: Callable[[], dict] | None = None,
                 reset: Callable[[], None] | None = None):
        self.stream, self.info, self.stats, self.reset = stream, info, stats, reset


def _per_core(workers: int | None) -> int:
    """A baseline's worker (or thread) count: as given, or one per core."""
    return _cores() if workers is None else workers


def _open_gpupipe(target: BenchCase, workers: int | None, spec: RunSpec, ctx: dict) -> _Opened:
    from gpupipe.loader.gpu import StageStats

    loader = target.make_gpupipe(workers, spec.device)
    epochs = iter(range(1, 1 << 30))
    delivered: list[tuple[tuple[str, ...], Any]] = []  # (keys, valid) of the run's batches: read after it

    def stream() -> Generator[int, None, None]:
        while True:
            loader.set_epoch(next(epochs))
            passing = iter(loader)
            try:
                for batch in passing:
                    delivered.append((batch.keys, batch.valid))  # no device sync in the timed loop
                    yield len(batch)
            finally:  # stop the pass now (its threads, its workers), not when the collector finds it:
                passing.close()  # its stage times were read as 0.000 on a GPU run before it ended

    def reset() -> None:
        loader.stats = StageStats()
        delivered.clear()

    def stats() -> dict:
        bad = {k for keys, valid in delivered for k, ok in zip(keys, valid.tolist()) if not ok}
        return {**loader.stats.as_dict(), "skipped_keys": bad}  # (training drops the tail: no padding here)

    info = {"decode": loader.decoder.name, "device": str(loader.device), "num_workers": loader.encoded.num_workers}
    return _Opened(stream, info, stats, reset)


def _open_baseline(target: BenchCase, workers: int | None, spec: RunSpec, ctx: dict) -> _Opened:
    from gpupipe.tools.bench.baselines import folder_items, new_counts, shard_items, torch_batches

    workers = _per_core(workers)

    if "items" not in ctx:
        ctx["items"] = folder_items(target.images_dir) if target.images_dir else \
            list(target.items) if target.items is not None else shard_items(target.shards)
    pipeline, kind = ctx["per_sample"]
    reads = f"image folder {target.images_dir}" if target.images_dir else \
        "the image folder's files, as gpupipe lists them" if target.items is not None else \
        "tar members by offset (no image folder found)"
    info = {"per_sample": kind, "reads": reads, "num_workers": workers}
    counts = new_counts()
    return _Opened(lambda: torch_batches(ctx["items"], pipeline, batch_size=target.batch_size, workers=workers,
                                         seed=target.seed, on_error=target.on_error, counts=counts),
                   info, lambda: dict(counts), lambda: counts.update(new_counts()))


def _open_webdataset(target: BenchCase, workers: int | None, spec: RunSpec, ctx: dict) -> _Opened:
    from gpupipe.tools.bench.baselines import new_counts, webdataset_batches

    workers = _per_core(workers)

    pipeline, kind = ctx["per_sample"]
    counts = new_counts()
    return _Opened(lambda: webdataset_batches(target.shards, pipeline, batch_size=target.batch_size,
                                              workers=workers, seed=target.seed, on_error=target.on_error,
                                              counts=counts),
                   {"per_sample": kind, "num_workers": workers}, lambda: dict(counts),
                   lambda: counts.update(new_counts()))


def _open_dali(target: BenchCase, workers: int | None, spec: RunSpec, ctx: dict) -> _Opened:
    import torch

    from gpupipe.tools.bench.dali import dali_batches, write_index

    if "dali_index" not in ctx:
        ctx["dali_index"] = write_index(target.shards, ctx["tmp"])
    gpu = torch.device(spec.device).type == "cuda"
    threads = max(1, _per_core(workers))
    return _Opened(lambda: dali_batches(list(target.shards), ctx["dali_index"], target.steps,
                                        image_size=target.image_size, batch_size=target.batch_size, threads=threads,
                                        device=spec.device, seed=target.seed),
                   {"decode": "dali mixed (nvJPEG)" if gpu else "dali cpu", "num_threads": threads})


_OPENERS = {"gpupipe": _open_gpupipe, "baseline": _open_baseline, "webdataset": _open_webdataset, "dali": _open_dali}


def check_loaders(names: tuple[str, ...]) -> None:
    bad = [n for n in names if n not in LOADERS]
    if bad:
        raise ConfigError(f"--compare: unknown loader {bad[0]!r}; choose from {', '.join(LOADERS[1:])} "
                          "(gpupipe always runs)")


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(opened: _Opened, spec: RunSpec, batches: int) -> dict:
    """One run: a fresh stream, ``skip`` untimed batches, then ``batches`` timed ones."""
    import torch

    cuda = torch.device(spec.device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if opened.reset:
        opened.reset()
    with Sampler(gpu_util=cuda and gpu_note() is None) as sampler:
        c0, t0 = cpu_seconds(), time.perf_counter()
        stream = opened.stream()
        try:
            for _ in range(spec.skip):
                next(stream)
            _sync(spec.device)
            t1, own1, kids1 = time.perf_counter(), thread_cpu(), children_cpu()
            images = sum(next(stream) for _ in range(batches))
            _sync(spec.device)
            t2, own2, kids2 = time.perf_counter(), thread_cpu(), children_cpu()
        finally:
            stream.close()  # workers stop (and are waited for) before the CPU time is read
        c1, t3 = cpu_seconds(), time.perf_counter()
    cores = _cores()
    out: dict[str, Any] = {"rate": images / (t2 - t1), "seconds": t2 - t1, "cpu": 100.0 * (c1 - c0) / ((t3 - t0) * cores),
           "sampled": sampler.result(),
           # CPU per image of the timed batches: the training process outside the native decoder's
           # threads (what caps a GPU: shared/DESIGN.md section 2), those threads, the worker processes
           "us": {"outside": 1e6 * (own2["outside"] - own1["outside"]) / images,
                  "native": 1e6 * (own2["native"] - own1["native"]) / images,
                  "workers": 1e6 * (kids2 - kids1) / images}}
    if cuda:
        out["sampled"]["gpu_max_memory_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if opened.stats:
        out["stages"] = opened.stats()
    return out


def _cores() -> int:
    from gpupipe.core.machine import usable_cores

    return usable_cores()


def _warm(opened: _Opened, spec: RunSpec) -> None:
    stream = opened.stream()
    try:
        for _ in range(spec.skip + spec.warmup):
            next(stream)
    finally:
        stream.close()


def _record(runs: _Runs, r: dict) -> None:
    runs.rates.append(r["rate"])
    runs.seconds.append(r["seconds"])
    runs.cpu.append(r["cpu"])
    runs.rss.append(r["sampled"]["peak_rss_mb"])
    runs.us.append(r["us"])
    runs.gpu.append({k: v for k, v in r["sampled"].items() if k != "peak_rss_mb"})
    if "stages" in r:
        runs.stages.append(r["stages"])


def _row(target: BenchCase, loader: str, workers: int | None, opened: _Opened, runs: _Runs) -> dict:
    med = statistics.median
    ran_with = opened.info.get("num_workers", opened.info.get("num_threads"))
    row: dict[str, Any] = {
        "set": target.name, "loader": loader, "workers": ran_with if workers is None else workers,
        "workers_chosen_by": "loader default" if workers is None else "--workers", **opened.info,
        "images_per_s": round(med(runs.rates), 1), "images_per_s_min": round(min(runs.rates), 1),
        "images_per_s_max": round(max(runs.rates), 1), "images_per_s_runs": [round(r, 1) for r in runs.rates],
        "seconds_runs": [round(s, 3) for s in runs.seconds], "cpu_percent": round(med(runs.cpu), 1),
        "peak_rss_mb": round(max(runs.rss), 1),
        **{f"cpu_us_per_image_{k}": round(med(u[k] for u in runs.us), 2) for k in ("outside", "native", "workers")}}
    for key in ("gpu_util_percent", "gpu_max_memory_allocated_mb"):
        values = [g[key] for g in runs.gpu if key in g]
        if values:
            row[key] = round(med(values), 1) if key == "gpu_util_percent" else max(values)
    if runs.stages and "images" in runs.stages[0]:
        row["stages_per_image_ms"] = _stages_per_image(runs.stages)
    if runs.stages:  # bad samples replaced in the timed runs: each counted once, however many passes met it
        row["skipped"] = len(set().union(*(s.get("skipped_keys", ()) for s in runs.stages)))
    return row


def _stages_per_image(stages: list[dict]) -> dict:
    """Median over runs of each stage's seconds per image, in ms (gpupipe's StageStats)."""
    keys = [k for k in stages[0] if k.endswith("_s")]
    return {k[:-2] + "_ms": round(statistics.median(1000 * s[k] / max(s["images"], 1) for s in stages), 4)
            for k in keys}


def _sweep(target: BenchCase, spec: RunSpec, workers: int | None, ctx: dict, batches: int) -> list[dict]:
    opened = {name: _OPENERS[name](target, workers, spec, ctx) for name in spec.loaders}
    for name, o in opened.items():
        log.info("warm-up: %s, %s, %s worker(s)", target.name, name, "default" if workers is None else workers)
        _warm(o, spec)
    runs = {name: _Runs() for name in spec.loaders}
    order = list(spec.loaders)
    for r in range(spec.repeat):
        for name in order[r % len(order):] + order[:r % len(order)]:
            log.info("round %d: %s, %s, %s worker(s)", r + 1, target.name, name,
                     "default" if workers is None else workers)
            _record(runs[name], _timed(opened[name], spec, batches))
    return [_row(target, name, workers, opened[name], runs[name]) for name in spec.loaders]


def run_benchmark(targets: list[BenchCase], spec: RunSpec, progress: Callable[[dict], None] | None = None) -> dict:
    """Run every target × worker count × loader; returns ``{"meta": ..., "results": [...]}``."""
    from gpupipe.tools.bench.persample import build_per_sample

    check_loaders(spec.loaders)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpupipe-bench-") as tmp:
        for target in targets:
            ctx: dict = {"tmp": tmp}
            if {"baseline", "webdataset"} & set(spec.loaders):
                ctx["per_sample"] = build_per_sample(target.steps, target.image_size, spec.per_sample)
            batches = spec.batches or max(1, (target.num_samples or 0) // target.batch_size - spec.skip)
            for w in spec.workers:
                for row in _sweep(target, spec, w, ctx, batches):
                    row["batches"], row["batch_size"] = batches, target.batch_size
                    rows.append(row)
                    if progress:
                        progress(row)
            ctx.clear()
    return {"meta": {}, "results": rows}


def validate(targets: list[BenchCase], spec: RunSpec) -> None:
    """Fail before anything runs: unknown loaders, steps a chosen baseline cannot run."""
    from gpupipe.tools.bench.dali import check_dali
    from gpupipe.tools.bench.steps import check_supported

    check_loaders(spec.loaders)
    for t in targets:
        _check_kind(t, spec.loaders)
        if {"baseline", "webdataset"} & set(spec.loaders):
            check_supported(t.steps)
        if "dali" in spec.loaders:
            check_dali(t.steps)


def _check_kind(target: BenchCase, loaders: tuple[str, ...]) -> None:
    """Refuse a baseline that cannot read the target's source: webdataset and DALI read tar shards,
    the torch baseline tar shards or an image folder's files (not Parquet)."""
    if target.kind == "tar":
        return
    cannot = [n for n in loaders if n in ("webdataset", "dali") or (n == "baseline" and target.kind == "parquet")]
    if not cannot:
        return
    what = "an image folder" if target.kind == "folder" else "Parquet files"
    but = ", or compare baseline alone (it reads the folder's image files)" if target.kind == "folder" else ""
    raise ConfigError(f"--compare {','.join(cannot)}: this source is {what} read in place, and "
                      f"{' and '.join(cannot)} read tar shards; make shards with `gpupipe ingest SRC DST` and bench "
                      f"DST{but}")
