"""How DALI's CPU decoder shares a small machine with the Python that feeds it (issue 34).

    python benchmarks/dali_sharing.py --root .bench/tiny-6000 [--busy-us 0,5] [--nice 0,19]
        [--rounds 3] [--seconds 4] [--threads 2] [--own]

DALI's decoder alone (``fn.external_source`` → ``fn.decoders.image``, CPU, ``--threads``
threads, batch 256, two batches fed ahead) is fed padded rows made before the clock starts;
between two feeds the feeding thread does ``--busy-us`` µs of CPU work per image (a Python loop of
a fixed length, timed before DALI starts: Python work standing for a stream's), after lowering its own priority to each ``--nice`` (DALI's threads, made before,
keep theirs). Each setting runs in a fresh process, alternated over ``--rounds``. Printed: images/s,
the cores the process used (CPU time / wall) and the CPU per image of each kind of thread
(DALI's ``[DALI][TPn]Exec`` decoder threads, its ``Executor`` threads, the feeding thread).
``--own`` adds DALI's own pipeline (``fn.readers.webdataset`` → ``fn.decoders.image``) per round.

What it showed on the 2-vCPU VM (docs/benchmarks.md, "How DALI shares two cores"): spinning
5 µs an image in the feeding thread costs ~4 µs of wall an image, where two free cores would
hide most of it, and the process uses fewer cores, not more; the same feeding thread at nice 19
gets near DALI's speed without it. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque

from feed_bench import padded_batches, shard_images  # (benchmarks/, this script's folder)

BATCH = 256


def _calibrated(us: float) -> int:
    """Loop turns that take ``us`` µs of this thread's CPU (best of a few tries, before DALI runs)."""
    if us <= 0:
        return 0
    n, best = 200_000, float("inf")
    for _ in range(5):
        t = time.thread_time()
        for _ in range(n):
            pass
        best = min(best, time.thread_time() - t)
    return max(1, round(n * us * 1e-6 / best))


def fed(shards: str, threads: int, busy_us: float, nice: int):
    """DALI's decoder fed prepared rows, ``busy_us`` of spinning an image in the feeding thread."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=threads, prefetch_queue_depth=1, device_id=None)  # type: ignore[call-overload]
    def pipe():
        enc = fn.external_source(name="enc", dtype=types.DALIDataType.UINT8, no_copy=True)
        return fn.decoders.image(enc, device="cpu", output_type=types.DALIImageType.RGB)

    work = _calibrated(busy_us * BATCH)  # the same work a batch whatever the thread gets of the CPU
    p = pipe()
    p.build()  # DALI's threads exist now, at this thread's priority
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    source, waiting = itertools.cycle(padded_batches(shard_images(shards), BATCH)), deque()

    def step() -> None:
        for _ in range(work):
            pass
        p.feed_input("enc", next(source))
        p.schedule_run()
        waiting.append(True)
        if len(waiting) > 2:
            p.outputs()
            waiting.popleft()

    return step


def own(shards: str, threads: int):
    """DALI's own pipeline: its webdataset reader and its decoder."""
    from nvidia.dali import fn, pipeline_def, types

    from gpupipe.tools.bench.dali import write_index

    files = sorted(glob.glob(os.path.join(shards, "*.tar")))
    index = write_index(files, tempfile.mkdtemp())

    @pipeline_def(batch_size=BATCH, num_threads=threads, seed=0, prefetch_queue_depth=2, device_id=None)  # type: ignore[call-overload]
    def pipe():
        jpegs, _ = fn.readers.webdataset(paths=files, index_paths=index, ext=["jpg", "cls"], random_shuffle=True,
                                         initial_fill=1024, missing_component_behavior="skip", name="reader")
        return fn.decoders.image(jpegs, device="cpu", output_type=types.DALIImageType.RGB)

    p = pipe()
    p.build()
    return lambda: p.run()


def child(args) -> None:
    from gpupipe.tools.bench.measure import threads_cpu

    step = own(args.root, args.threads) if args.child == "own" else \
        fed(args.root, args.threads, float(args.child.split(",")[0]), int(args.child.split(",")[1]))
    for _ in range(30):
        step()
    before, t0, n = threads_cpu(), time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        step()
        n += BATCH
    wall, after = time.perf_counter() - t0, threads_cpu()
    kinds: dict[str, float] = {}
    for key, cpu in after.items():
        name = key[1]
        kind = "decoder" if "TP" in name else "executor" if "Executor" in name else \
            "reader" if "Prefetch" in name else "python"
        kinds[kind] = kinds.get(kind, 0.0) + cpu - before.get(key, 0.0)
    cores = sum(kinds.values()) / wall
    per = "  ".join(f"{k} {v / n * 1e6:5.2f}" for k, v in sorted(kinds.items()))
    print(f"RESULT {n / wall:.0f} {cores:.2f} {per}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="a folder made by benchmarks/feed_bench.py (its shards/)")
    ap.add_argument("--busy-us", default="0,5")
    ap.add_argument("--nice", default="0,19")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--own", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.root = os.path.join(args.root, "shards") if os.path.isdir(os.path.join(args.root, "shards")) else args.root
    if args.child:
        child(args)
        return 0
    settings = [f"{b},{n}" for b in args.busy_us.split(",") for n in args.nice.split(",")] + (["own"] if args.own else [])
    got: dict[str, list[tuple[float, float, str]]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for s in settings if r % 2 == 0 else settings[::-1]:
            out = subprocess.run([sys.executable, __file__, "--root", args.root, "--threads", str(args.threads),
                                  "--seconds", str(args.seconds), "--child", s], capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
            if line is None:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            rate, cores, per = line.split(maxsplit=3)[1:]
            got[s].append((float(rate), float(cores), per))
            print(f"round {r}: {s:8s} {float(rate):8.0f} img/s  cores {cores}  CPU us/img: {per}", flush=True)
    print(f"batch {BATCH}, {args.threads} DALI threads, cpu, median of {args.rounds}, each turn a fresh process")
    for s, runs in got.items():
        label = "DALI's own pipeline" if s == "own" else f"busy {s.split(',')[0]} us/img, nice {s.split(',')[1]}"
        print(f"  {label:32s} {statistics.median(r[0] for r in runs):8.0f} img/s "
              f"({min(r[0] for r in runs):.0f}-{max(r[0] for r in runs):.0f})  "
              f"cores {statistics.median(r[1] for r in runs):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
