"""Elastic resume with real ranks (issue 25): gloo processes on 127.0.0.1 train part of an epoch,
rank 0's state is saved (what a Lightning checkpoint holds), and another number of processes
resumes it. Over the whole epoch every sample is delivered exactly once, and the ranks of each
run take equal steps (a barrier after every step: unequal steps would time out, not pass)."""
from __future__ import annotations

import json
import os

import pytest
from datagen import write_dataset
from gloo_ranks import run_ranks

pytestmark = pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: every test here runs a job of ranks

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers a subprocess imports

_RANK_SCRIPT = """
import datetime, json, sys
import torch.distributed as dist
sys.path[:0] = {paths!r}
from datagen import ids_of
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
ld = EncodedLoader({url!r}, batch_size={batch}, num_workers={workers}, drop_last=False, seed=5,
                   stream=StreamConfig(shuffle_buffer=8))
ld.set_epoch(1)
if {state_in!r}:
    with open({state_in!r}) as f:
        ld.load_state_dict(json.load(f))
ids, steps = [], 0
for batch in ld:
    ids += ids_of(batch)
    steps += 1
    dist.barrier()
    if steps == {stop}:
        break
if rank == 0 and {state_out!r}:
    with open({state_out!r}, "w") as f:
        json.dump(ld.state_dict(), f)
out = [None] * dist.get_world_size()
dist.all_gather_object(out, {{"ids": ids, "steps": steps, "len": len(ld)}})
if rank == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def _run(tmp_path, name: str, world: int, url: str, *, batch: int = 4, workers: int = 0, stop: int = -1,
         state_in: str = "", state_out: str = "") -> list[dict]:
    script = tmp_path / f"{name}.py"
    script.write_text(_RANK_SCRIPT.format(paths=[os.getcwd(), TESTS], url=url, batch=batch, workers=workers,
                                          stop=stop, state_in=state_in, state_out=state_out))
    return json.loads(run_ranks(script, world, timeout=180))


@pytest.mark.slow
def test_rank_0_state_resumes_at_other_world_sizes_with_every_sample_once(tmp_path):
    """4 ranks take 2 steps; 2 ranks (2 workers each, batch 3) resume rank 0's state and take 3
    steps; 3 ranks resume that and run the epoch out: 4 → 2 → 3, a batch-size change and a
    second resume of a resumed epoch, each run from rank 0's state alone."""
    counts = [13, 0, 21, 8, 1, 30, 27]  # 100 samples, uneven shards, one empty
    url = str(tmp_path / "ds")
    write_dataset(url, counts)
    phases = [(4, 4, 0, 2), (2, 3, 2, 3), (3, 4, 0, -1)]  # world, batch, workers, steps (-1: to the end)
    seen, done, state_in = [], 0, ""
    for n, (world, batch, workers, stop) in enumerate(phases):
        state_out = str(tmp_path / f"rank0_state_{n}.json") if stop > 0 else ""
        ranks = _run(tmp_path, f"phase{n}", world, url, batch=batch, workers=workers, stop=stop,
                     state_in=state_in, state_out=state_out)
        steps = {r["steps"] for r in ranks}
        assert len(steps) == 1  # equal steps on every rank
        if stop > 0:
            assert steps == {stop}
        else:  # len(): the batches of this epoch, those before the resumes counted
            assert {r["len"] for r in ranks} == {done + steps.pop()}
        done += ranks[0]["steps"]
        seen += [i for r in ranks for i in r["ids"]]
        state_in = state_out
    assert sorted(seen) == list(range(sum(counts)))  # every sample of the epoch exactly once
