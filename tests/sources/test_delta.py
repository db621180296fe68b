"""Delta Lake tables read in place (issue 15's optional item): the files of one snapshot.

Tiny tables written with ``deltalake.write_deltalake`` from inplace_data's payloads, read by
the same loader as Parquet files, locally and on the loopback S3 server.
"""
from __future__ import annotations

import json
import logging
import sys

import pytest
from inplace_data import image_ids, parquet_table, write_parquet
from s3util import storage_options_via

from gpupipe.core.errors import ConfigError, MissingDependencyError
from gpupipe.formats import delta
from gpupipe.formats.manifest import MANIFEST_NAME
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index_in_place
from gpupipe.sources.source import Source, resolve

pytest.importorskip("pyarrow")
deltalake = pytest.importorskip("deltalake")


def write(url, ids, mode="append", storage_options=None, **kw):
    deltalake.write_deltalake(url, parquet_table(list(ids)), mode=mode,
                              storage_options=delta.delta_storage_options(storage_options or {}), **kw)


def epoch_ids(url, storage_options=None, workers=0) -> list[int]:
    ld = EncodedLoader(url, batch_size=4, num_workers=workers, rank=0, world_size=1, drop_last=False,
                       stream=StreamConfig(shuffle_buffer=8), storage_options=storage_options or {})
    return sorted(i for b in ld for i in image_ids(b))  # image_ids checks each label too


def test_table_reads_the_same_samples_as_its_parquet_files(tmp_path):
    write(str(tmp_path / "t"), range(12))
    write(str(tmp_path / "t"), range(12, 20))
    write_parquet(str(tmp_path / "p"), [12, 8])
    resolved = resolve(Source(str(tmp_path / "t")))
    assert resolved.kind == "parquet" and resolved.delta_version == 1 and resolved.num_samples == 20
    assert epoch_ids(str(tmp_path / "t"), workers=2) == epoch_ids(str(tmp_path / "p")) == list(range(20))


def test_overwritten_files_are_not_read_where_a_parquet_glob_reads_them(tmp_path):
    url = str(tmp_path / "t")
    write(url, range(10))
    write(url, range(10, 15), mode="overwrite")
    assert epoch_ids(url) == list(range(10, 15))
    assert epoch_ids(url + "/*.parquet") == list(range(15))  # the stale files are still in the folder


def test_a_pinned_version_reads_that_snapshot(tmp_path):
    url = str(tmp_path / "t")
    write(url, range(10))
    write(url, range(10, 15), mode="overwrite")
    assert resolve(Source(url + "@v0")).delta_version == 0
    assert epoch_ids(url + "@v0") == list(range(10))
    with pytest.raises(Exception, match=r"version 7"):
        resolve(Source(url + "@v7"))


def test_index_names_its_version_and_a_later_version_ignores_it(tmp_path, monkeypatch, caplog):
    url = str(tmp_path / "t")
    write(url, range(10))
    index_in_place(url, progress=False)
    assert not (tmp_path / "t" / MANIFEST_NAME).exists()  # VACUUM would delete a non-hidden file
    assert json.loads((tmp_path / "t" / delta.DELTA_INDEX).read_text())["delta_version"] == 0

    def no_log_replay(*a, **kw):
        raise AssertionError("the index describes this version: no log replay")

    with monkeypatch.context() as m:
        m.setattr("gpupipe.sources.source.read_snapshot", no_log_replay)
        assert epoch_ids(url) == list(range(10))
    write(url, range(10, 13))
    with caplog.at_level(logging.WARNING, logger="gpupipe.sources.source"):
        assert epoch_ids(url) == list(range(13))
    assert "describes version 0 of the table, not version 1" in caplog.text
    assert f"no {delta.DELTA_INDEX} for" in caplog.text  # described afresh, and told where its index goes
    monkeypatch.setattr("gpupipe.sources.source.read_snapshot", no_log_replay)
    assert epoch_ids(url + "@v0") == list(range(10))  # the pinned version is the indexed one


def test_deletion_vectors_are_refused_naming_the_feature(tmp_path):
    url = str(tmp_path / "t")
    write(url, range(5))
    deltalake.DeltaTable(url).alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    with pytest.raises(ConfigError, match=r"deletionVectors.*will not read deleted rows"):
        resolve(Source(url))


def test_column_mapping_is_refused_naming_the_feature(tmp_path):
    url = str(tmp_path / "t")
    write(url, range(5), configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(ConfigError, match=r"uses columnMapping"):
        resolve(Source(url))


def test_a_partition_label_is_refused_naming_it_and_other_partitions_are_read(tmp_path):
    write(str(tmp_path / "t"), range(6), partition_by=["label"])
    with pytest.raises(ConfigError, match=r"'label' is a partition column"):
        resolve(Source(str(tmp_path / "t")))
    write(str(tmp_path / "c"), range(4), partition_by=["caption"])  # "caption=no. 0/part-....parquet"
    assert epoch_ids(str(tmp_path / "c")) == list(range(4))


def test_without_deltalake_the_error_names_the_extra_and_an_index_needs_none(tmp_path, monkeypatch):
    url = str(tmp_path / "t")
    write(url, range(3))
    index_in_place(url, progress=False)
    write(url, range(3, 5))
    monkeypatch.setitem(sys.modules, "deltalake", None)
    assert epoch_ids(url + "@v0") == list(range(3))  # the index describes version 0
    with pytest.raises(MissingDependencyError, match=r"pip install 'gpupipe\[delta\]'"):
        resolve(Source(url))  # version 1 has no index: the log must be read


def test_s3fs_options_become_object_store_options(s3_bucket):
    opts = delta.delta_storage_options(s3_bucket.storage_options)
    assert opts == {"AWS_ACCESS_KEY_ID": s3_bucket.key, "AWS_SECRET_ACCESS_KEY": s3_bucket.secret,
                    "AWS_ENDPOINT_URL": s3_bucket.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    nested = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "https://127.0.0.1:9"}, "anon": False}
    assert delta.delta_storage_options(nested) == {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                                                   "AWS_ENDPOINT_URL": "https://127.0.0.1:9", "AWS_REGION": "us-east-1"}


def test_table_on_s3_through_the_proxy(s3_bucket, s3_proxy):
    url = s3_bucket.url("t")
    write(url, range(8), storage_options=s3_bucket.storage_options)
    write(url, range(8, 14), mode="overwrite", storage_options=s3_bucket.storage_options)
    proxy = s3_proxy()
    opts = storage_options_via(proxy, s3_bucket)
    assert resolve(Source(url + "/", opts)).delta_version == 1
    assert epoch_ids(url + "/", opts) == list(range(8, 14))
    assert proxy.counts["requests"] > 0  # the log and the data went through the loopback proxy
    index_in_place(url, storage_options=opts, checksums=True, progress=False)
    assert s3_bucket.fs().exists(f"{s3_bucket.name}/t/{delta.DELTA_INDEX}")
    indexed = resolve(Source(url + "/", opts))
    assert indexed.delta_version == 1 and indexed.manifest.parquet.crc32 is not None
    assert epoch_ids(url + "/", opts) == list(range(8, 14))
