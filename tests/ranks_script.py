"""Run by tests/loader/test_ranks_processes.py, one copy per rank.

``ranks_script.py CONFIG`` under ``torchrun`` (2 simulated nodes x 2 processes, gloo on
127.0.0.1): joins the process group and, for each case of ``CONFIG`` in turn, builds an
``EncodedLoader`` with this rank's settings (the case says which url and seed each node or rank
takes), runs one epoch with a barrier per step (a rank with fewer steps fails the barrier after
the timeout instead of hanging) and writes ``<case>-rank-<R>.json``: the sample ids it read, or
the error it raised and the seconds from the start of ``EncodedLoader(...)`` to the error.

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

    world = World.detect()  # before the group: what the launcher's variables say
    if group:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=config.get("timeout", 20)))
        rank = dist.get_rank()
    else:
        rank = int(os.environ["TEST_PROCESS"])  # names the output file; the loader reads its part by `world`
    for case in config["cases"]:  # one after the other, in one process group: a refusal leaves it usable
        out = {"detected": [world.rank, world.world_size, world.local_rank], **run_case(case, rank, group)}
        Path(config["out"], f"{case['name']}-rank-{rank}.json").write_text(json.dumps(out))


def run_case(case: dict, rank: int, group: bool) -> dict:
    """One loader built and read for one epoch: its sample ids, or what it raised and when."""
    import torch.distributed as dist

    from gpupipe.loader.encoded import EncodedLoader

    node = os.environ.get("GROUP_RANK", "0")
    url = case["urls"].get(node, case["urls"]["default"])
    seed = case.get("seeds", {}).get(str(rank), 0)
    t0 = time.perf_counter()
    try:
        if case.get("device"):  # a GpuLoader on that device (its construction is what is tested)
            from gpupipe.loader.gpu import GpuLoader

            loader = GpuLoader(url, batch_size=4, num_workers=0, drop_last=False, seed=seed,
                               device=case["device"]).encoded
        else:
            loader = EncodedLoader(url, batch_size=4, num_workers=0, drop_last=False, seed=seed)
        steps, ids = 0, []
        for batch in loader:
            ids += ids_of(batch, with_manifest=loader.source.manifest is not None)
            steps += 1
            if group:
                dist.barrier()
        return {"ok": True, "steps": steps, "ids": ids}
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised, whatever it is
        return {"ok": False, "type": type(exc).__name__, "error": str(exc), "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()), group="--no-group" not in sys.argv)
