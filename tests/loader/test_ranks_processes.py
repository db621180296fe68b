"""Ranks with real processes (issue 25): ``torchrun`` starts 2 simulated nodes x 2 processes
on 127.0.0.1 (gloo). Ranks that disagree on the seed or on the data, and tar shards without an
index, are refused at start by every rank, in seconds, naming what differs and where; processes
started by srun (its variables only, no ``RANK``/``LOCAL_RANK``) find their rank, world size and
local rank. Each rank's outcome comes back as a file (``tests/ranks_script.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from datagen import write_dataset
from gloo_ranks import free_port

TESTS = Path(__file__).resolve().parents[1]  # tests/: the helpers a subprocess imports
SCRIPT = TESTS / "ranks_script.py"
COUNTS = [13, 0, 21, 8, 1]  # 43 samples, one shard empty; batch 4 on 4 ranks: 3 steps, 5 padded positions
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and not k.startswith(("SLURM_", "OMPI_", "PMI_", "MPI_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return env


def _outcomes(out: Path, names: list[str], n: int, procs: list[subprocess.Popen]) -> dict[str, list[dict]]:
    try:
        logs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    found = {name: [json.loads(f.read_text()) for r in range(n) if (f := out / f"{name}-rank-{r}.json").exists()]
             for name in names}
    short = [name for name in names if len(found[name]) < n]
    assert not short, f"cases {short}: some rank wrote nothing: {[(p.returncode, log[1][-2000:]) for p, log in zip(procs, logs)]}"
    return found


@pytest.fixture(scope="module")
def torchrun_cases(tmp_path_factory, job_turn) -> dict[str, list[dict]]:
    """The cases below, in one ``torchrun`` job: two agents (node ranks 0 and 1), two processes each,
    every case's loader built in turn in one process group (a refusal by every rank leaves it
    usable). Each case: every rank's outcome, by rank."""
    tmp = tmp_path_factory.mktemp("ranks")
    full, partial = str(tmp / "node0"), str(tmp / "node1")
    write_dataset(full, COUNTS)
    write_dataset(partial, COUNTS[:-1])  # node 1's copy lacks the last shard, and its index says so
    write_dataset(str(tmp / "plain"), COUNTS, manifest=False)
    cases = [
        {"name": "seeds", "urls": {"default": full}, "seeds": {"3": 2}},
        {"name": "copies", "urls": {"0": full, "1": partial, "default": full}},
        {"name": "missing", "urls": {"1": str(tmp / "nowhere") + "/", "default": full}},
        {"name": "unindexed", "urls": {"default": str(tmp / "plain") + "/part-{0000..0004}.tar"}},
        {"name": "agreed", "urls": {"default": full}},
    ]
    out = tmp / "out"
    out.mkdir()
    config = tmp / "config.json"
    config.write_text(json.dumps({"cases": cases, "out": str(out), "timeout": 20}))
    with job_turn():  # conftest.py: one job of several processes at a time
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                                   "--nproc-per-node=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
                                   f"--master-port={port}", str(SCRIPT), str(config)],
                                  env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for node in range(2)]
        return _outcomes(out, [c["name"] for c in cases], 4, procs)


def _what_was_read(ranks: list[dict]) -> str:
    """What ranks that did not refuse read: samples twice and never (for the failure message)."""
    seen = Counter(i for r in ranks if r["ok"] for i in r["ids"])
    errors = [f"rank {n}: {r['type']}: {r['error'][:200]}" for n, r in enumerate(ranks) if not r["ok"]]
    return (f"{sum(1 for c in seen.values() if c > 1)} samples read twice, "
            f"{sum(1 for i in range(sum(COUNTS)) if i not in seen)} never; errors: {errors}")


def _all_refused(ranks: list[dict], *needles: str) -> list[str]:
    """Every rank raised ConfigError, in seconds, with all of ``needles`` in its message."""
    assert all(not r["ok"] and r["type"] == "ConfigError" for r in ranks), _what_was_read(ranks)
    for r in ranks:
        for needle in needles:
            assert needle in r["error"], r["error"]
        assert r["seconds"] < 10, f"refused after {r['seconds']:.1f} s: {r['error']}"
    return [r["error"] for r in ranks]


@pytest.mark.slow
def test_ranks_with_different_seeds_are_refused_by_every_rank(torchrun_cases):
    ranks = torchrun_cases["seeds"]
    _all_refused(ranks, "ranks disagree on seed", "ranks 0-2 have 0", "rank 3 has 2")
    print("seconds to refuse (different seeds):", [round(r["seconds"], 3) for r in ranks])


@pytest.mark.slow
def test_ranks_reading_different_copies_of_the_data_are_refused(torchrun_cases):
    """Node 1's copy lacks the last shard: its ranks would plan another epoch."""
    ranks = torchrun_cases["copies"]
    _all_refused(ranks, "ranks disagree on", "ranks 0, 1 have", "ranks 2, 3 have", "samples")
    print("seconds to refuse (different data):", [round(r["seconds"], 3) for r in ranks])


@pytest.mark.slow
def test_ranks_whose_data_is_missing_stop_the_others_too(torchrun_cases):
    """Node 1 finds no data: its ranks raise their own error, and ranks 0 and 1 — which found it —
    raise too instead of waiting for them in the first collective."""
    ranks = torchrun_cases["missing"]
    missing = "StorageNotFoundError"  # a folder that does not exist says so (issue 36)
    assert [r.get("type") for r in ranks] == ["ConfigError", "ConfigError", missing, missing], _what_was_read(ranks)
    assert all(r["error"].startswith("ranks 2, 3 could not build the loader, so no rank starts; rank 2: "
                                     f"{missing}: ") and "nowhere" in r["error"] for r in ranks[:2]), ranks[0]["error"]
    assert all(r["seconds"] < 10 for r in ranks)


@pytest.mark.slow
def test_tar_shards_without_an_index_are_refused_under_ddp(torchrun_cases):
    _all_refused(torchrun_cases["unindexed"], "gpupipe index", "index.json", "across 4 ranks")


@pytest.mark.slow
def test_after_refusals_ranks_that_agree_read_every_sample_once(torchrun_cases):
    ranks = torchrun_cases["agreed"]
    assert all(r["ok"] and r["steps"] == 3 for r in ranks), _what_was_read(ranks)
    assert sorted(i for r in ranks for i in r["ids"]) == list(range(sum(COUNTS)))


@pytest.mark.slow
@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py
def test_processes_started_by_srun_find_their_place(tmp_path):
    """4 processes on 2 simulated nodes with only srun's variables (SLURM_*; no RANK, LOCAL_RANK):
    each finds its rank, the world size and its local rank, and together they read every sample
    once. (Open MPI's and MPICH's variables take the same path: tests/core/test_launch.py.)"""
    url = str(tmp_path / "ds")
    write_dataset(url, COUNTS)
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cases": [{"name": "srun", "urls": {"default": url}}], "out": str(out)}))
    procs = []
    for rank in range(4):
        variables = {"SLURM_PROCID": rank, "SLURM_NTASKS": 4, "SLURM_LOCALID": rank % 2, "SLURM_NODEID": rank // 2,
                     "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": 0}
        env = {**_clean_env(), **{k: str(v) for k, v in variables.items()}, "TEST_PROCESS": str(rank)}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(config), "--no-group"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    ranks = _outcomes(out, ["srun"], 4, procs)["srun"]
    assert [r["detected"] for r in ranks] == [[0, 4, 0], [1, 4, 1], [2, 4, 0], [3, 4, 1]], _what_was_read(ranks)
    assert all(r["ok"] for r in ranks), _what_was_read(ranks)
    assert sorted(i for r in ranks for i in r["ids"]) == list(range(sum(COUNTS))), _what_was_read(ranks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py
def test_two_ranks_of_one_host_on_one_gpu_are_refused(tmp_path):
    """Two ranks whose launcher's local rank is not found (both local rank 0) on one host:
    both would decode on the same GPU; both refuse, naming it."""
    url = str(tmp_path / "ds")
    write_dataset(url, COUNTS)
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cases": [{"name": "gpu", "urls": {"default": url}, "device": "cuda"}],
                                  "out": str(out), "timeout": 20}))
    env = {**_clean_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(config)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    ranks = _outcomes(out, ["gpu"], 2, procs)["gpu"]
    assert all(not r["ok"] and r["type"] == "ConfigError" for r in ranks), ranks
    assert all("ranks 0, 1 on host" in r["error"] and "would all decode on GPU-" in r["error"] for r in ranks), ranks
