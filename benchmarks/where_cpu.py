"""Where a batch's CPU goes, by the thread CPU time of each step (issue 34).

    python benchmarks/where_cpu.py --root .bench/tiny-6000 [--workers 0|1] [--seconds 10]

Runs ``GpuLoader(shards, batch_size=256, decode="dali", device="cpu", num_threads=2)`` over whole
passes for ``--seconds`` with the steps below wrapped: each call adds the CPU time of the thread
that made it (``time.thread_time``) to its step. Printed: µs of CPU per batch for each step, in
the training process and (``--workers 1``) in the stream worker (whose steps are written to a
file every 20 batches and read at the end). Steps nest: a step's time holds its callees'.

Why thread CPU and not a profiler: on 2 vCPUs shared with DALI's threads a Python thread spends
much of its wall time waiting for the GIL or a core, and cProfile and py-spy's ``--gil`` charge that
wait to whatever line the thread was on (cProfile put 100-190 µs on a torch ``record_function``
that costs 6 alone). Thread CPU counts only what the thread ran. Each wrapped call adds ~1 µs.
A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import collections
import glob
import importlib
import json
import os
import sys
import tempfile
import time

# (module, attribute path, label, generator?): the decode side, then the stream (in the worker at
# 1 worker, in the decode thread at 0)
STEPS = [
    ("gpupipe.loader.encoded", "EncodedLoader.batches", "next encoded batch (1 worker: received)", True),
    ("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__", "  DataLoader __next__ (a unit's batches)", False),
    ("multiprocessing.queues", "Queue.get", "    queue get", False),
    ("gpupipe.stream.slots", "SlotBoard.receive", "  slot: batch rebuilt", False),
    ("gpupipe.stream.slots", "SlotBoard.release", "  slot: released", False),
    ("gpupipe.decode.dali", "DaliDecoder._start", "decode: start (checks, feed, run)", False),
    ("gpupipe.decode.dali", "prepare", "  prepare (verdicts, crop boxes)", False),
    ("gpupipe.decode.dali", "route_probed", "  route", False),
    ("gpupipe.decode.dali", "DaliDecoder._rows", "  rows for DALI", False),
    ("nvidia.dali.pipeline", "Pipeline.feed_input", "  DALI feed_input", False),
    ("nvidia.dali.pipeline", "Pipeline.schedule_run", "  DALI schedule_run", False),
    ("gpupipe.decode.dali", "DaliDecoder._finish", "decode: finish (outputs, batch)", False),
    ("nvidia.dali.pipeline", "Pipeline.outputs", "  DALI outputs", False),
    ("gpupipe.decode.dali", "DaliDecoder._output", "  outputs to torch", False),
    ("gpupipe.decode.dali", "finish", "  finish (stand-ins, labels)", False),
    ("gpupipe.loader.stages", "Stages._put", "hand-over to the training loop", False),
    ("gpupipe.loader.epoch", "EpochLedger.yielded", "ledger", False),
    ("gpupipe.loader.encoded", "EncodedDataset._planned", "stream: a batch", True),
    ("gpupipe.loader.encoded", "iter_units", "  a unit (read, memo, table)", True),
    ("gpupipe.stream.chunks", "unit_runs", "    plan: the unit's runs", False),
    ("gpupipe.stream.memo", "ScanMemo.known", "    memo lookup", False),
    ("gpupipe.storage.fetch", "Fetcher.gather", "    read (gather)", False),
    ("gpupipe.loader.encoded", "pack_table", "  pack into shared memory", False),
    ("gpupipe.loader.encoded", "EncodedDataset._finish", "  columns (annotate)", False),
    ("gpupipe.stream.slots", "SlotTaker.crossing", "  slot: crossing", False),
    ("multiprocessing.reduction", "ForkingPickler.dumps", "  pickle (feeder thread)", False),
]
_ACC: collections.Counter = collections.Counter()
_DUMP_EVERY = 20  # the worker writes its steps every this many batches


def _in_worker() -> bool:
    import torch.utils.data

    return torch.utils.data.get_worker_info() is not None


def _owner(module: str, path: str):
    obj = importlib.import_module(module)
    *parents, name = path.split(".")
    for p in parents:
        obj = getattr(obj, p)
    return obj, name


def _wrap(module: str, path: str, label: str, generator: bool) -> None:
    obj, name = _owner(module, path)
    f = getattr(obj, name)
    clock = time.thread_time
    dump = label.startswith("stream: a batch")

    if generator:
        def wrapped(*a, **k):
            it = f(*a, **k)
            while True:
                t = clock()
                try:
                    x = next(it)
                except StopIteration:
                    _ACC[label] += clock() - t
                    return
                _ACC[label] += clock() - t
                if dump and _in_worker():
                    _ACC["_batches"] += 1
                    if _ACC["_batches"] % _DUMP_EVERY == 0 and os.environ.get("WHERE_CPU_DIR"):
                        with open(os.path.join(os.environ["WHERE_CPU_DIR"], f"{os.getpid()}.json"), "w") as out:
                            json.dump(_ACC, out)
                yield x
    else:
        def wrapped(*a, **k):
            t = clock()
            try:
                return f(*a, **k)
            finally:
                _ACC[label] += clock() - t
    setattr(obj, name, wrapped)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="a folder made by benchmarks/feed_bench.py (its shards/)")
    ap.add_argument("--workers", type=int, default=1, choices=[0, 1])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    shards = os.path.join(args.root, "shards") if os.path.isdir(os.path.join(args.root, "shards")) else args.root
    os.environ["WHERE_CPU_DIR"] = tempfile.mkdtemp(prefix="where-cpu-")
    for step in STEPS:
        _wrap(*step)
    from gpupipe import GpuLoader

    loader = GpuLoader(shards, batch_size=args.batch, decode="dali", device="cpu", num_threads=2,
                       shuffle=True, drop_last=True, num_workers=args.workers)
    for _ in range(2):  # the scan and the probe: later passes are steady
        for _ in loader:
            pass
    for f in glob.glob(os.path.join(os.environ["WHERE_CPU_DIR"], "*.json")):
        os.remove(f)
    _ACC.clear()
    t0, main0, n = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - t0 < args.seconds:
        for images, _ in loader:
            n += len(images)
    wall, main_cpu = time.perf_counter() - t0, time.thread_time() - main0
    time.sleep(0.5)
    batches = n / args.batch
    print(f"{n / wall:.0f} images/s, {batches:.0f} batches of {args.batch}, {args.workers} worker(s); "
          f"CPU µs per batch (thread CPU; steps nest)")
    print(f"  {'training loop (the for over GpuLoader)':48s} {main_cpu / batches * 1e6:8.1f}")
    worker: collections.Counter = collections.Counter()
    for f in glob.glob(os.path.join(os.environ["WHERE_CPU_DIR"], "*.json")):
        with open(f) as fh:
            worker.update(json.load(fh))
    for _, _, label, _ in STEPS:
        if label in _ACC:
            print(f"  {label:48s} {_ACC[label] / batches * 1e6:8.1f}")
    if worker:
        wb = worker.pop("_batches")
        print(f"in the worker (the {wb:.0f} batches it had made at its last write):")
        for _, _, label, _ in STEPS:
            if label in worker:
                print(f"  {label:48s} {worker[label] / wb * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
