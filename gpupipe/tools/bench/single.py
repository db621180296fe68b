"""``gpupipe bench SOURCE`` without a comparison: gpupipe alone, one warm-up epoch and
``--epochs`` timed epochs, stage times printed (or ``--json``: printed as JSON)."""
from __future__ import annotations

import argparse
import json

__all__ = ["run_single", "write_trace"]


def write_trace(timeline: list[tuple[str, float, float]], path: str) -> None:
    """``(stage, start, end)`` spans (``perf_counter`` seconds) as Chrome trace events: one
    row per stage, time in µs from the first span."""
    t0 = min((a for _, a, _ in timeline), default=0.0)
    rows = {name: i for i, name in enumerate(dict.fromkeys(name for name, _, _ in timeline))}
    events = [{"name": name, "ph": "X", "pid": 0, "tid": rows[name], "ts": round((a - t0) * 1e6, 1),
               "dur": round((b - a) * 1e6, 1)} for name, a, b in timeline]
    events += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": name}}
               for name, i in rows.items()]
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def _time_epochs(loader, epochs: int) -> tuple[float, set[str]]:
    """:func:`~gpupipe.tools.bench.measure.time_epochs`, and the keys of the distinct samples its timed epochs replaced
    (``stats.skipped`` counts a bad sample once per epoch that meets it). The keys are read after
    the timed loop: no device sync in it."""
    from gpupipe.tools.bench.measure import time_epochs

    delivered: list = []
    seconds = time_epochs(loader, epochs, lambda batch: delivered.append((batch.keys, batch.valid)))
    return seconds, {k for keys, valid in delivered for k, ok in zip(keys, valid.tolist()) if not ok}


def run_single(args: argparse.Namespace) -> int:
    from gpupipe.loader.gpu import GpuLoader
    from gpupipe.tools.bench.cases import set_names
    from gpupipe.tools.bench.steps import SETS, gpupipe_pipeline

    (name,) = set_names(args.augment)[:1] or ("none",)
    image_size = args.image_size or 224
    batch_size = args.batch_size or 256
    loader = GpuLoader(args.targets[0], batch_size=batch_size, image_size=image_size, decode=args.decode,
                       device=args.device, num_workers=(args.workers or (None,))[0],
                       storage_options=dict(args.storage_options), rank=0, world_size=1, on_error="skip",
                       augment=gpupipe_pipeline(SETS[name]), seed=args.seed)
    if getattr(args, "timeline", None):
        loader.timeline = []
    seconds, skipped = _time_epochs(loader, args.epochs)
    stages = {**loader.stats.as_dict(), "skipped": len(skipped)}
    if loader.timeline is not None:
        write_trace(loader.timeline, args.timeline)
        print(f"wrote the stage timeline of {len(loader.timeline)} spans to {args.timeline}")
    if args.json:
        text = json.dumps({"images_per_s": stages["images"] / seconds, "seconds": seconds, "stages": stages,
                           "backend": loader.decoder.name, "device": str(loader.device), "augment": name,
                           "num_workers": loader.encoded.num_workers}, indent=2)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(f"gpupipe bench: decode {loader.decoder.name} on {loader.device}, {loader.encoded.num_workers} worker(s), "
          f"batch {batch_size}, {image_size}x{image_size}, augment {name}, {args.epochs} epoch(s)")
    print(f"throughput: {stages['images'] / seconds:,.0f} images/s ({stages['images']} images in {seconds:.2f} s)")
    print(f"stages (s): waiting for bytes {stages['wait_bytes_s']:.2f} | decode {stages['decode_s']:.2f} | "
          f"augment {stages['augment_s']:.2f} | training loop waiting {stages['handoff_wait_s']:.2f} | "
          f"skipped images {stages['skipped']} (distinct samples replaced)")
    return 0
