"""Two gloo ranks over sources read in place (issue 15): an image folder (a unit per
image) and Parquet files (a unit per row group) give every rank the same number of steps,
each sample to one rank, without an index (each rank lists for itself) and with one."""
from __future__ import annotations

import json
import os

import pytest
from gloo_ranks import run_ranks
from inplace_data import write_class_folder, write_parquet

from gpupipe.prepare.indexer import index_in_place

pytestmark = pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: every test here runs a job of ranks

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers a subprocess imports

_RANK_SCRIPT = """
import datetime, json, sys
import torch.distributed as dist
sys.path[:0] = {paths!r}
from inplace_data import image_ids
from gpupipe.loader.encoded import EncodedLoader
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
out = {{}}
for url in {urls!r}:
    ld = EncodedLoader(url, batch_size=4, num_workers=1, drop_last=False, seed=5)
    steps, ids = 0, []
    for batch in ld:
        ids += image_ids(batch)
        steps += 1
        dist.barrier()  # a rank with fewer steps would leave the other one waiting here: timeout, not hang
    out[url] = {{"steps": steps, "len": len(ld), "ids": ids}}
both = [None, None]
dist.all_gather_object(both, out)
if dist.get_rank() == 0:
    print(json.dumps(both))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_gloo_ranks_take_equal_steps_over_folder_and_parquet(tmp_path):
    folder, table = str(tmp_path / "imgs"), str(tmp_path / "table")
    write_class_folder(folder, 23)
    write_parquet(table, [9, 0, 13, 5], row_group_rows=4)
    write_parquet(str(tmp_path / "indexed"), [9, 0, 13, 5], row_group_rows=4)
    index_in_place(str(tmp_path / "indexed"), checksums=True, progress=False)
    urls = [folder, table, str(tmp_path / "indexed")]
    script = tmp_path / "ranks.py"
    script.write_text(_RANK_SCRIPT.format(paths=[os.getcwd(), TESTS], urls=urls))
    r0, r1 = json.loads(run_ranks(script, 2))
    for url, n in zip(urls, (23, 27, 27)):
        a, b = r0[url], r1[url]
        assert a["steps"] == b["steps"] == a["len"] == b["len"] == -(-n // 8)  # 2 ranks x batch 4, tail padded
        assert sorted(a["ids"] + b["ids"]) == list(range(n))  # each sample once, on one rank
