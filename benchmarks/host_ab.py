"""The host path of two gpupipe checkouts and DALI's reader, interleaved, in fresh processes.

    python benchmarks/host_ab.py SHARDS --before DIR --after DIR [--rounds 5] [--epochs 2] [--workers 0]

Each round runs, in an order rotated by one each round: ``EncodedLoader`` (no decode) from the
checkout ``--before``, the same from ``--after`` (each on ``PYTHONPATH``), and DALI's
``fn.readers.webdataset`` (1 thread, ``jpg`` + ``cls``, 1,024-sample shuffle buffer, index files),
each in a new process: a warm-up epoch, then ``--epochs`` timed epochs. Printed per loader: the
median samples/s over rounds (min, max) and the median CPU µs per sample (user + system of the
process and of its workers, apart). Make a worktree of the commit to compare with
``git worktree add --detach DIR COMMIT``. docs/benchmarks.md, "Host path (issue 28)".
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its workers (joined, or alive: persistent workers are
    joined only when the loader goes, so ``RUSAGE_CHILDREN`` alone leaves them out)."""
    import resource

    from gpupipe.tools.bench.measure import children_cpu

    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime, children_cpu()


def _one(what: str, root: str, epochs: int, workers: int, batch: int = 256) -> dict:
    if what == "gpupipe":
        from gpupipe.loader.encoded import EncodedLoader

        loader = EncodedLoader(root, batch_size=batch, num_workers=workers)
        for _ in loader:  # warm-up: page cache, imports
            pass
        n, t0, c0 = 0, time.perf_counter(), _cpu()
        for _ in range(epochs):
            for b in loader:
                n += len(b)
    else:
        from nvidia.dali import fn, pipeline_def

        from gpupipe.tools.bench.dali import write_index

        shards = sorted(glob.glob(os.path.join(root, "*.tar")))
        index = write_index(shards, tempfile.mkdtemp())
        per_epoch = json.load(open(os.path.join(root, "index.json")))["num_samples"] // batch

        @pipeline_def(batch_size=batch, num_threads=1, seed=0, prefetch_queue_depth=2,  # type: ignore[call-overload]
                      device_id=None)
        def pipe():
            jpg, cls = fn.readers.webdataset(paths=shards, index_paths=index, ext=["jpg", "cls"], random_shuffle=True,
                                             initial_fill=1024, name="reader")
            return jpg, cls

        p = pipe()
        p.build()
        for _ in range(per_epoch):
            p.run()
        n, t0, c0 = 0, time.perf_counter(), _cpu()
        for _ in range(epochs * per_epoch):
            n += len(p.run()[0])
    dt, c1 = time.perf_counter() - t0, _cpu()
    own, workers = c1[0] - c0[0], c1[1] - c0[1]
    return {"rate": n / dt, "cpu_us": 1e6 * (own + workers) / n, "own_us": 1e6 * own / n, "workers_us": 1e6 * workers / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shards")
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: run one loader, print JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.shards, args.epochs, args.workers)))
        return
    runs = {"before": ("gpupipe", args.before), "after": ("gpupipe", args.after), "dali": ("dali", args.after)}
    got: dict[str, list[dict]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % 3:] + names[:r % 3]:
            what, tree = runs[name]
            cmd = [sys.executable, __file__, args.shards, "--before", args.before, "--after", args.after, "--epochs",
                   str(args.epochs), "--workers", str(args.workers), "--one", what]
            out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True, check=True)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("load average:", [round(v, 2) for v in os.getloadavg()])
    for name, v in got.items():
        rates = [x["rate"] for x in v]
        print(f"{name:6s} median {statistics.median(rates):9,.0f} samples/s (min {min(rates):,.0f} max {max(rates):,.0f}); "
              f"CPU {statistics.median(x['cpu_us'] for x in v):6.1f} us/sample (this process "
              f"{statistics.median(x['own_us'] for x in v):5.1f}, workers {statistics.median(x['workers_us'] for x in v):5.1f})")


if __name__ == "__main__":
    main()
