"""What planning an epoch costs a process at the sizes a cluster's ingest produces (issue 39):
synthetic counts only, nothing read. Each case runs in a child process of its own, so its peak
memory is its own (``ru_maxrss``).

    python benchmarks/plan_scale.py [--sizes 1e6,1e7,1e8] [--kinds shards,objects] [--timeout 300]

For ``N`` samples: ``shards`` is tar shards of 1,000 samples (``N / 1000`` units, the loader's default
``shuffle_block`` for local tar), ``objects`` an image folder read in place (``N`` one-sample units,
placed per position: ``PlanSpec.placed``), the counts as the manifest gives them (``UnitCounts``). A case builds the ``PlanSpec`` and plans rank 0 of 8 ranks: its units of work and
the spans and delivery order of its first window — what a worker does before its first read —
then of its next 20 windows. Prints seconds, peak RSS and the cost of a later window per case. A benchmark, not a test: numbers go to docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

_CHILD = """
import json, resource, sys, time
import numpy as np
from gpupipe.core.counts import UnitCounts
from gpupipe.loader.encoded import default_block
from gpupipe.plan import PlanSpec, chunk_order, chunk_spans, rank_chunks
n, kind = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
if kind == "shards":  # as a manifest gives them: UnitCounts.of(each shard's count)
    counts = UnitCounts.of([1000] * (n // 1000))
    block = default_block(n)
else:  # an image folder's manifest: UnitCounts.uniform(1, objects)
    counts = UnitCounts.uniform(1, n)
    block = 0
spec = PlanSpec(counts=counts, batch_size=256, world_size=8, seed=0, chunk_batches=4, block=block)
t1 = time.perf_counter()
chunks = rank_chunks(spec, 0)
spans = chunk_spans(spec, 0, chunks[0])
order = chunk_order(spec, 0, chunks[0])
t2 = time.perf_counter()
for chunk in chunks[1:21]:  # the next windows: what each later one costs
    chunk_spans(spec, 0, chunk), chunk_order(spec, 0, chunk)
t3 = time.perf_counter()
print(json.dumps({"spec_s": t1 - t0, "plan_s": t2 - t1, "window_ms": (t3 - t2) / 20 * 1e3,
                  "chunks": len(chunks), "spans": len(spans),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--kinds", default="shards,objects")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    base = subprocess.run([sys.executable, "-c", "import gpupipe.plan, gpupipe.loader.encoded, resource; "
                           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"],
                          capture_output=True, text=True, check=True)
    print(f"a process with the planner imported: {float(base.stdout):.0f} MB peak RSS")
    for kind in args.kinds.split(","):
        for size in (int(float(s)) for s in args.sizes.split(",")):
            t0 = time.perf_counter()
            try:
                out = subprocess.run([sys.executable, "-c", _CHILD, str(size), kind], capture_output=True, text=True,
                                     timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{kind:8s} {size:>13,d} samples: over {args.timeout:.0f} s")
                continue
            if out.returncode:
                print(f"{kind:8s} {size:>13,d} samples: failed ({out.stderr.strip().splitlines()[-1:]})")
                continue
            r = json.loads(out.stdout)
            print(f"{kind:8s} {size:>13,d} samples: spec {r['spec_s']:.2f} s + plan {r['plan_s']:.2f} s, "
                  f"peak {r['peak_mb']:,.0f} MB; then {r['window_ms']:.1f} ms a window "
                  f"({time.perf_counter() - t0:.1f} s with the start)")


if __name__ == "__main__":
    main()
