"""One rank of tests/loader/test_metrics.py's straggler test: every rank reads its share of a pass
through a GpuLoader (rank ``SLOW_RANK`` with an augment stage that sleeps), then all ranks gather
their wait for data in one collective and rank 0 prints the spread and the warning."""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch.distributed as dist

from gpupipe import GpuLoader
from gpupipe.loader.metrics import RankRow, gather_rows, rates, reading, spread


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = rank == int(os.environ["SLOW_RANK"])

    def augment(images):
        if slow:
            time.sleep(0.03)  # this rank's data path cannot keep up
        return images

    loader = GpuLoader(os.environ["SHARDS"], batch_size=4, image_size=(16, 16), decode="pil", device="cpu",
                       num_workers=0, rank=rank, world_size=world, augment=augment)
    start = reading(loader)
    for _ in loader:
        pass
    epoch = rates(start, reading(loader))
    rows = gather_rows(RankRow(rank, socket.gethostname(), epoch["wait_ms_per_step"], epoch["images_per_s"]))
    if rank == 0:
        numbers, warning = spread(rows)
        print(json.dumps({"numbers": numbers, "warning": warning}))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
