"""Samples/s and the first batch of each pass of ``EncodedLoader`` with stream workers: what
crossing from the workers to the training process costs (docs/benchmarks.md, "Reused shared
batches"). Usage: python benchmarks/worker_batches.py SHARDS [WORKERS] [EPOCHS]"""
from __future__ import annotations

import sys
import time

from gpupipe.loader.encoded import EncodedLoader


def main(source: str, workers: int = 1, epochs: int = 4) -> None:
    loader = EncodedLoader(source, batch_size=256, num_workers=workers, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        t0, first, n, in_slots = time.perf_counter(), None, 0, 0
        for batch in loader:
            first = time.perf_counter() - t0 if first is None else first
            n += len(batch)
            in_slots += getattr(batch, "slot", -1) >= 0
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}: first batch {1e3 * (first or 0):.0f} ms, {n / dt:,.0f} samples/s, "
              f"{in_slots} batches in slots (reusable shared buffers)")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
