"""Time to the first batch of a pass, beside one batch's own read time and the whole epoch.

    .venv/bin/python benchmarks/first_batch.py /tmp/units-data/shards --workers 0 2 --repeat 7
    .venv/bin/python benchmarks/first_batch.py /tmp/units-data/shards --code /path/to/main . '.@{"unit_batches": 4}'

Each run is a fresh process (each ``--code`` checkout first on its ``sys.path``, ``CHECKOUT@JSON``
with more keywords of the loader; the checkouts' runs interleaved so that they share the machine's
load alike): it builds an
``EncodedLoader(url, batch_size=..., num_workers=W)`` (encoded batches only, nothing decoded), then
times ``iter()`` → the first batch, and the rest of that pass (the epoch), and the CPU time of the
training process over the pass (the stream's own work at W=0, a busy machine's load aside). One batch's own read time is the epoch time over its batches at W=0: what a
first batch costs when it waits for nothing but its own samples. Make data with
``gpupipe bench --make-data paper --images 4000 --root /tmp/units-data``. The files are read from
the page cache after the first run (each configuration runs ``--repeat`` times; the median is
printed, and the fastest). Not a test: the numbers go to the docs with the command and the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(url: str, workers: int, batch_size: int, options: dict) -> None:
    from gpupipe.loader.encoded import EncodedLoader

    loader = EncodedLoader(url, batch_size=batch_size, num_workers=workers, **options)
    t0, c0 = time.perf_counter(), time.process_time()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    n = 1 + sum(1 for _ in it)
    epoch, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"first_s": first, "epoch_s": epoch, "cpu_s": cpu, "batches": n}))


def run(code: str, url: str, workers: int, batch_size: int, options: dict) -> dict:
    code, _, more = code.partition("@")
    options = {**options, **json.loads(more or "{}")}
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, __file__, url, "--child", str(workers), "--batch-size", str(batch_size),
                          "--options", json.dumps(options)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="a shard folder with index.json")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--code", nargs="+", default=[""],
                    help="checkouts whose gpupipe to time (default: the importable one); CHECKOUT@JSON: with "
                         "more keywords of the loader")
    ap.add_argument("--options", default="{}", help="more keywords of the loader, as JSON (e.g. '{\"unit_batches\": 4}')")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    options = json.loads(a.options)
    if a.child is not None:
        child(a.url, a.child, a.batch_size, options)
        return
    print(f"cores usable: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.1f}; options: {options}")
    run(a.code[0], a.url, 0, a.batch_size, options)  # the page cache
    for w in a.workers:
        runs: dict[str, list[dict]] = {code: [] for code in a.code}
        for _ in range(a.repeat):
            for code in a.code:
                runs[code].append(run(code, a.url, w, a.batch_size, options))
        for code, got in runs.items():
            first = [r["first_s"] * 1e3 for r in got]
            epoch = [r["epoch_s"] for r in got]
            cpu = statistics.median(r["cpu_s"] for r in got)
            batches = got[0]["batches"]
            print(f"{code or 'importable'} workers={w}: first batch median {statistics.median(first):.0f} ms, "
                  f"fastest {min(first):.0f} ms; epoch median {statistics.median(epoch):.3f} s, fastest "
                  f"{min(epoch):.3f} s = {min(epoch) / batches * 1e3:.1f} ms/batch over {batches} batches; "
                  f"CPU of the training process (median) {cpu:.3f} s "
                  f"(first {[round(t) for t in first]}, epoch {[round(t, 3) for t in epoch]})", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
