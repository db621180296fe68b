"""The ranks' check at start (issue 25), without processes: what each rank sends, and the pure
functions that name what differs and where. tests/loader/test_ranks_processes.py runs it for real."""
from __future__ import annotations

import json
import logging

import pytest
from datagen import write_dataset

from gpupipe.core.errors import ConfigError
from gpupipe.core.types import World
from gpupipe.formats.manifest import Manifest
from gpupipe.loader import agree
from gpupipe.loader.agree import (
    check_agreement,
    device_clashes,
    facts_of,
    manifest_digest,
    rank_coverage,
    unindexed_under_ranks,
)
from gpupipe.loader.encoded import EncodedLoader


def _facts(tmp_path, n=4, **changes) -> list[dict]:
    """What ``n`` ranks would send for one dataset, each changed by ``changes[rank]`` (a dict)."""
    url = str(tmp_path / "ds")
    write_dataset(url, [13, 0, 21, 8, 1])
    out = []
    for rank in range(n):
        loader = EncodedLoader(url, batch_size=4, num_workers=0, world=World(rank=rank, world_size=n))
        out.append({**facts_of(loader), **changes.get(str(rank), {})})
    return out


def test_ranks_that_agree_pass(tmp_path):
    facts = _facts(tmp_path)
    assert check_agreement(facts) is None
    assert json.loads(json.dumps(facts)) == facts  # plain data: travels in all_gather_object
    assert {f["rank"] for f in facts} == {0, 1, 2, 3}


def test_a_different_seed_is_named_with_the_ranks_on_each_side(tmp_path):
    facts = _facts(tmp_path, **{"1": {"seed": 1}})
    assert check_agreement(facts[:2]).startswith("ranks disagree on seed: rank 0 has 0, rank 1 has 1. ")
    assert "seed: ranks 0, 2, 3 have 0, rank 1 has 1" in check_agreement(facts)


def test_every_difference_is_named_once(tmp_path):
    facts = _facts(tmp_path, **{"3": {"batch_size": 8, "drop_last": False, "num_samples": 42, "counts_crc32": 7,
                                      "data": "ffff"}})
    msg = check_agreement(facts)
    assert "batch_size: ranks 0-2 have 4, rank 3 has 8" in msg
    assert "drop_last: ranks 0-2 have True, rank 3 has False" in msg
    assert "the number of samples: ranks 0-2 have 43, rank 3 has 42" in msg
    assert "CRC-32" not in msg and "digest" not in msg  # implied by the number of samples


def test_other_data_with_the_same_counts_shows_as_its_digest(tmp_path):
    facts = _facts(tmp_path, n=2, **{"1": {"data": "0123456789abcdef"}})
    msg = check_agreement(facts)
    assert f"the data (digest of the index: names, sizes, checksums, labels): rank 0 has {facts[0]['data']}, " \
           "rank 1 has 0123456789abcdef" in msg


def test_a_rank_that_failed_to_start_makes_every_rank_stop():
    facts = [{"error": "StorageNotFoundError: s3://b/x: not found"}, {"seed": 0}, {"error": "ConfigError: y"}]
    assert check_agreement(facts) == ("ranks 0, 2 could not build the loader, so no rank starts; "
                                      "rank 0: StorageNotFoundError: s3://b/x: not found")


def test_every_rank_of_the_plan_needs_a_process():
    same = {"world_size": 2, "split": "train"}
    assert rank_coverage([{**same, "rank": 0}, {**same, "rank": 1}]) is None
    assert rank_coverage([{**same, "rank": 1}, {**same, "rank": 0}]) is None  # any order
    msg = check_agreement([{**same, "rank": 0}, {**same, "rank": 0}])
    assert msg.startswith("no process builds the loader as rank 1 of world_size 2") and \
        "processes 0, 1 all build it as rank 0" in msg
    # tensor-parallel peers share a data rank: allowed while every rank has a process
    assert rank_coverage([{"world_size": 2, "rank": r} for r in (0, 0, 1, 1)]) is None


def test_two_processes_on_one_gpu_of_one_host_are_refused():
    def at(host, gpu, local, device="cuda:0"):
        return {"host": host, "gpu": gpu, "local_rank": local, "device": device}

    assert device_clashes([at("a", "GPU-1", 0), at("a", "GPU-2", 1), at("b", "GPU-1", 0)]) is None  # other host
    assert device_clashes([at("a", None, 0, "cpu"), at("a", None, 0, "cpu")]) is None  # no CUDA: nothing to clash
    assert device_clashes([at("a", "GPU-7", 0, "cuda:0"), at("a", "GPU-7", 0, "cuda:0")]) == (
        "ranks 0, 1 on host a would all decode on GPU-7 (cuda:0; local rank 0). Each process needs its own GPU: "
        f"the local rank picks it ({agree.LOCAL_RANK_NAMES}, whichever the launcher sets), or give each process "
        "its device (device='cuda:N')")
    # CUDA_VISIBLE_DEVICES per rank: cuda:0 everywhere, other GPUs: fine; one GPU by two indexes: not
    assert device_clashes([at("a", "GPU-1", 0), at("a", "GPU-2", 1, "cuda:0")]) is None
    assert "ranks 1, 3 on host a" in device_clashes(
        [at("a", "GPU-1", 0), at("a", "GPU-2", 1, "cuda:1"), at("b", "GPU-2", 1), at("a", "GPU-2", 0, "cuda:0")])


def test_rank_lists_read_as_ranges():
    assert agree._ranks([3]) == "rank 3"
    assert agree._ranks([0, 1]) == "ranks 0, 1"
    assert agree._ranks([5, 0, 1, 2, 7, 8, 9, 10]) == "ranks 0-2, 5, 7-10"
    assert agree._ranks(list(range(0, 100, 2))).endswith("... (50 in all)")


def test_the_index_digest_sees_every_byte_but_not_where_the_copy_lives(tmp_path):
    write_dataset(str(tmp_path / "a"), [5, 3])
    write_dataset(str(tmp_path / "b"), [5, 3])
    write_dataset(str(tmp_path / "c"), [5, 2])
    a, b, c = (Manifest.from_json((tmp_path / x / "index.json").read_text()) for x in "abc")
    assert manifest_digest(a) == manifest_digest(b) != manifest_digest(c)
    doc = json.loads((tmp_path / "a" / "index.json").read_text())
    doc["shards"][1]["sha256"] = "0" * 64  # one checksum
    assert manifest_digest(Manifest.from_json(json.dumps(doc))) != manifest_digest(a)
    doc = json.loads((tmp_path / "a" / "index.json").read_text())
    doc["classes"] = ["cat", "dog"]
    assert manifest_digest(Manifest.from_json(json.dumps(doc))) != manifest_digest(a)
    assert manifest_digest(None) == "none"


def test_tar_shards_without_an_index_are_refused_on_several_ranks(tmp_path, caplog):
    url = str(tmp_path / "ds")
    write_dataset(url, [6, 9, 5], manifest=False)
    shards = url + "/part-{0000..0002}.tar"
    assert unindexed_under_ranks(1, False, shards) is None and unindexed_under_ranks(4, True, shards) is None
    with pytest.raises(ConfigError, match=r"across 2 ranks .*`gpupipe index .*part-\{0000..0002\}.tar.`"):
        EncodedLoader(shards, batch_size=4, num_workers=0, rank=1, world_size=2)
    EncodedLoader(shards, batch_size=4, num_workers=0, rank=0, world_size=1)  # one process: streamed whole


def test_several_ranks_without_a_process_group_warn_once(tmp_path, caplog, monkeypatch):
    url = str(tmp_path / "ds")
    write_dataset(url, [6, 9, 5])
    monkeypatch.setattr(agree, "_warned_unchecked", False)
    with caplog.at_level(logging.WARNING, logger="gpupipe.loader.agree"):
        EncodedLoader(url, batch_size=4, num_workers=0, rank=1, world_size=2)
        EncodedLoader(url, batch_size=4, num_workers=0, rank=1, world_size=2)
        EncodedLoader(url, batch_size=4, num_workers=0, rank=0, world_size=1)
    assert [r.getMessage() for r in caplog.records].count(
        "gpupipe: rank 1 of 2 built its loader before torch.distributed was initialised, so the ranks cannot check "
        "that they agree on the seed, the settings and the data; build loaders after init_process_group") == 1


def test_the_local_rank_picks_the_gpu_among_those_this_process_sees():
    from gpupipe.loader.gpu import _local_gpu

    assert [_local_gpu(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert _local_gpu(3, 1) == 0  # CUDA_VISIBLE_DEVICES set per rank: each process sees only its own
    with pytest.raises(ConfigError, match="local rank 4 has no GPU of its own: this process sees 4 CUDA devices"):
        _local_gpu(4, 4)


def test_gpu_loader_tells_the_check_its_device(tmp_path):
    from gpupipe.loader.gpu import GpuLoader

    url = str(tmp_path / "ds")
    write_dataset(url, [6, 9, 5])
    loader = GpuLoader(url, batch_size=4, num_workers=0, device="cpu", rank=0, world_size=1)
    facts = facts_of(loader.encoded)
    assert (facts["device"], facts["gpu"]) == ("cpu", None)
