"""Run by tests/loader/test_ranks_processes.py, one copy per rank.

``ranks_script.py CONFIG`` under ``torchrun`` (2 simulated nodes x 2 processes, gloo on
127.0.0.1): joins the process group, builds an ``EncodedLoader`` with this rank's settings
(``CONFIG`` says which url and seed each node or rank takes), runs one epoch with a barrier per
step (a rank with fewer steps fails the barrier after the timeout instead of hanging) and
writes ``rank-<R>.json``: the sample ids it read, or the error it raised and the seconds from
the start of ``EncodedLoader(...)`` to the error.

``ranks_script.py CONFIG --no-group`` is a process started by another launcher (srun, mpirun)
whose variables the test sets: it reports ``World.detect()`` and reads its part of the data
without a process group.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

from datagen import ids_of


def main(config: dict, group: bool) -> None:
    import torch.distributed as dist

    from gpupipe.core.types import World
    from gpupipe.loader.encoded import EncodedLoader

    world = World.detect()  # before the group: what the launcher's variables say
    out: dict = {"detected": [world.rank, world.world_size, world.local_rank]}
    if group:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=config.get("timeout", 20)))
        rank = dist.get_rank()
    else:
        rank = int(os.environ["TEST_PROCESS"])  # names the output file; the loader reads its part by `world`
    node = os.environ.get("GROUP_RANK", "0")
    url = config["urls"].get(node, config["urls"]["default"])
    seed = config.get("seeds", {}).get(str(rank), 0)
    t0 = time.perf_counter()
    try:
        if config.get("device"):  # a GpuLoader on that device (its construction is what is tested)
            from gpupipe.loader.gpu import GpuLoader

            loader = GpuLoader(url, batch_size=4, num_workers=0, drop_last=False, seed=seed,
                               device=config["device"]).encoded
        else:
            loader = EncodedLoader(url, batch_size=4, num_workers=0, drop_last=False, seed=seed)
        steps, ids = 0, []
        for batch in loader:
            ids += ids_of(batch, with_manifest=loader.source.manifest is not None)
            steps += 1
            if group:
                dist.barrier()
        out.update(ok=True, steps=steps, ids=ids)
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised, whatever it is
        out.update(ok=False, type=type(exc).__name__, error=str(exc), seconds=time.perf_counter() - t0)
    Path(config["out"], f"rank-{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()), group="--no-group" not in sys.argv)
