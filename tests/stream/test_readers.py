"""The worker-side readers of sources read in place (gpupipe.stream.readers): one entry per
planned sample, in plan order, ``None`` and a reason where a sample cannot be read, and — when
the index holds CRC-32s — damaged bytes read again, never delivered. Real local files: image
folders of ``datagen.payload`` images and Parquet files written by pyarrow."""
from __future__ import annotations

import dataclasses

import pytest
from datagen import payload
from fsspec.implementations.local import LocalFileSystem
from inplace_data import label_of, write_class_folder, write_flat_folder, write_parquet

from gpupipe.core.errors import ShardFormatError, StorageError
from gpupipe.plan import Span
from gpupipe.sources.inplace import with_checksums
from gpupipe.sources.source import ResolvedSource, Source, resolve
from gpupipe.storage.fetch import FetchConfig, Fetcher
from gpupipe.stream.readers import object_spans, rowgroup_spans

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


class FlakyFS(LocalFileSystem):
    """The local disk, noting every read ``(path, start, end)``; the first ``flips[path]`` reads
    of a file come back with one byte flipped (whole bytes, wrong: damage in transit)."""

    reads: list
    flips: dict

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start=start, end=end, **kwargs)
        self.reads.append((path, start, end))
        if self.flips.get(path, 0) > 0 and data:
            self.flips[path] -= 1
            data = data[:-1] + bytes([data[-1] ^ 0x5A])
        return data


def fetcher(flips: dict | None = None, **config) -> Fetcher:
    fs = FlakyFS(skip_instance_cache=True)
    fs.reads, fs.flips = [], {str(k): v for k, v in (flips or {}).items()}
    return Fetcher(fs, FetchConfig(**{"retries": 0, "refetch": 2, **config}))


def checked(source: ResolvedSource) -> ResolvedSource:
    """The source with CRC-32s in its manifest, as `gpupipe index --checksums` writes them."""
    manifest = with_checksums(fetcher(), source.manifest, source.shard_urls)
    return dataclasses.replace(source, manifest=manifest)


def ids(read) -> list[int | None]:
    """The image id each entry holds (read from its bytes, checked whole), ``None`` where missing."""
    out = []
    for i, s in enumerate(read.samples):
        if s is None or i in read.problems:  # an object that gives no sample is its key alone (issue 36)
            out.append(None)
            continue
        data = next(v for k, v in s.fields.items() if k != "cls")
        sid = int.from_bytes(data[3:7], "big")
        assert data == payload(sid), f"{s.key}: bytes are not image {sid}"
        out.append(sid)
    return out


# ------------------------------------------------------------------------------ image folders

@pytest.fixture
def folder(tmp_path) -> ResolvedSource:
    write_class_folder(str(tmp_path / "imgs"), 6)  # c<i % 3>/img<i>.jpg
    return resolve(Source(str(tmp_path / "imgs")))


def unit_of(source: ResolvedSource, image_id: int) -> int:
    return next(i for i, n in enumerate(source.manifest.objects.names) if n.endswith(f"img{image_id:05d}.jpg"))


def test_objects_come_one_per_planned_sample_in_plan_order(folder):
    order = [5, 0, 3, 3, 1]  # any order the plan gives, a unit twice (a padded epoch end) included
    spans = [Span(unit_of(folder, i), 0, 1, valid=k < 4) for k, i in enumerate(order)]
    reads = list(object_spans(fetcher(), folder, spans))
    assert [ids(r) for r in reads] == [[i] for i in order]
    assert all(r.problems == {} for r in reads)
    first = reads[0].samples[0]
    assert first.key == "c2/img00005" and first.fields == {"jpg": payload(5), "cls": str(label_of(5)).encode()}
    assert first.shard == folder.shard_urls[unit_of(folder, 5)] and first.offset == 0


def test_objects_of_a_flat_folder_without_labels_carry_no_label(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    (root / "a.PNG").write_bytes(payload(1))
    (root / "b.jpeg").write_bytes(payload(2))
    source = resolve(Source(str(root)))
    reads = list(object_spans(fetcher(), source, [Span(0, 0, 1), Span(1, 0, 1)]))
    # the field is named from the bytes (JPEG here), not from the extension a file was given
    assert [r.samples[0].fields for r in reads] == [{"jpg": payload(1)}, {"jpg": payload(2)}]
    assert [r.samples[0].key for r in reads] == ["a", "b"]


def test_a_flat_folder_with_labels_carries_them(tmp_path):
    write_flat_folder(str(tmp_path / "flat"), 4)  # labels.csv: c<i % 3>
    source = resolve(Source(str(tmp_path / "flat")))
    reads = list(object_spans(fetcher(), source, [Span(u, 0, 1) for u in range(4)]))
    assert [r.samples[0].fields["cls"] for r in reads] == [str(label_of(i)).encode() for i in range(4)]


def test_a_missing_object_is_none_with_its_error_and_the_rest_still_come(folder, tmp_path):
    """An object that gives no sample comes as its key alone (a sample without fields, the key known from
    the listing: the stream's placeholder, the log and validate name it by it), with its problem."""
    (tmp_path / "imgs" / "c1" / "img00004.jpg").unlink()
    spans = [Span(unit_of(folder, i), 0, 1) for i in (0, 4, 2)]
    reads = list(object_spans(fetcher(), folder, spans))
    assert [ids(r) for r in reads] == [[0], [None], [2]]
    assert (reads[1].samples[0].key, reads[1].samples[0].fields) == ("c1/img00004", {})
    assert list(reads[1].problems) == [0] and isinstance(reads[1].problems[0], StorageError)
    assert "img00004.jpg" in str(reads[1].problems[0])
    assert reads[0].problems == reads[2].problems == {}


def test_an_object_damaged_in_transit_is_read_again_when_the_index_has_checksums(folder):
    source = checked(folder)
    u = unit_of(source, 3)
    f = fetcher({source.shard_urls[u]: 1})
    reads = list(object_spans(f, source, [Span(u, 0, 1), Span(unit_of(source, 4), 0, 1)]))
    assert [ids(r) for r in reads] == [[3], [4]] and reads[0].problems == {}
    assert f.stats.refetches == 1
    assert [r[0] for r in f.fs.reads].count(source.shard_urls[u]) == 2


def test_without_checksums_damaged_bytes_go_through(folder):
    """Why the checksums exist: without them a flipped byte is delivered as the image."""
    u = unit_of(folder, 3)
    f = fetcher({folder.shard_urls[u]: 1})
    (read,) = object_spans(f, folder, [Span(u, 0, 1)])
    assert read.samples[0].fields["jpg"] != payload(3) and f.stats.refetches == 0


def test_an_object_changed_after_indexing_is_none_after_every_refetch(folder, tmp_path):
    source = checked(folder)
    u = unit_of(source, 2)
    path = tmp_path / "imgs" / "c2" / "img00002.jpg"
    path.write_bytes(payload(2)[:-1] + b"\0")  # same size, other bytes
    f = fetcher(refetch=3)
    (read,) = object_spans(f, source, [Span(u, 0, 1)])
    assert ids(read) == [None] and read.samples[0].key == "c2/img00002" and isinstance(read.problems[0],
                                                                                       ShardFormatError)
    assert "fails its checksum on every read" in str(read.problems[0]) and "gpupipe index" in str(read.problems[0])
    assert f.stats.refetches == 3 and [r[0] for r in f.fs.reads].count(str(path)) == 4


def test_refetch_zero_gives_up_after_the_first_read(folder):
    source = checked(folder)
    u = unit_of(source, 1)
    f = fetcher({source.shard_urls[u]: 1}, refetch=0)
    (read,) = object_spans(f, source, [Span(u, 0, 1)])
    assert ids(read) == [None] and "checksum" in str(read.problems[0]) and f.stats.refetches == 0


# ------------------------------------------------------------------------------ Parquet row groups

@pytest.fixture
def table(tmp_path) -> ResolvedSource:
    # part-000: ids 0..9 in row groups of 4, 4, 2; part-001: ids 10..14 in 4, 1
    write_parquet(str(tmp_path / "pq"), [10, 5], row_group_rows=4)
    source = resolve(Source(str(tmp_path / "pq")))
    assert source.manifest.sample_counts() == (4, 4, 2, 4, 1)
    return source


def test_row_group_spans_give_their_rows_in_order(table):
    spans = [Span(1, 1, 3), Span(1, 3, 4), Span(0, 0, 4), Span(4, 0, 1), Span(3, 2, 3)]
    reads = list(rowgroup_spans(fetcher(), table, spans))
    assert [ids(r) for r in reads] == [[5, 6], [7], [0, 1, 2, 3], [14], [12]]
    assert all(r.problems == {} for r in reads)
    s = reads[0].samples[0]
    assert (s.key, s.offset, s.shard) == ("part-000.parquet/5", 5, table.shard_urls[1])
    assert s.fields == {"jpg": payload(5), "cls": str(label_of(5)).encode()}
    tail = reads[3].samples[0]
    assert (tail.key, tail.offset) == ("part-001.parquet/4", 4)  # row 4 of its own file


def test_consecutive_spans_of_one_row_group_read_it_once(table):
    f = fetcher()
    spans = [Span(2, 0, 1), Span(2, 1, 2), Span(0, 0, 2), Span(0, 2, 4)]
    assert [ids(r) for r in rowgroup_spans(f, table, spans)] == [[8], [9], [0, 1], [2, 3]]
    t = table.manifest.parquet
    wanted = sorted((table.shard_urls[g], a, b) for g in (2, 0) for a, b in t.byte_ranges(g))
    assert sorted(f.fs.reads) == wanted  # no footer read either: it is in the index


def test_row_groups_seen_lately_are_read_once_and_the_oldest_again_past_the_budget(table, monkeypatch):
    """The units of a shuffled window each hold a few rows of the same row groups: a row group
    among the latest seen is not read again; past _GROUPS_KEPT_BYTES the oldest is."""
    from gpupipe.stream import readers

    f = fetcher()
    spans = [Span(0, 0, 1), Span(1, 0, 1), Span(0, 3, 4), Span(1, 2, 3), Span(0, 1, 2)]
    assert [ids(r) for r in rowgroup_spans(f, table, spans)] == [[0], [4], [3], [6], [1]]
    t = table.manifest.parquet
    assert sorted(f.fs.reads) == sorted((table.shard_urls[g], a, b) for g in (0, 1) for a, b in t.byte_ranges(g))
    monkeypatch.setattr(readers, "_GROUPS_KEPT_BYTES", 1)  # one group kept: the last
    f = fetcher()
    assert [ids(r) for r in rowgroup_spans(f, table, spans)] == [[0], [4], [3], [6], [1]]
    assert len(f.fs.reads) == 5 * len(t.byte_ranges(0))


def test_null_cells_are_none_with_a_reason(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"image": pa.array([payload(0), None, payload(2), payload(3)], pa.binary()),
                             "label": pa.array([0, 1, None, 0], pa.int64())}), root / "t.parquet")
    source = resolve(Source(str(root)))
    (read,) = rowgroup_spans(fetcher(), source, [Span(0, 0, 4)])
    assert ids(read) == [0, None, None, 3]
    assert sorted(read.problems) == [1, 2]
    assert "sample 't.parquet/1': the image cell is null" in str(read.problems[1])
    assert "sample 't.parquet/2': the label cell is null" in str(read.problems[2])
    part = list(rowgroup_spans(fetcher(), source, [Span(0, 2, 4)]))[0]  # reasons by index in the span
    assert ids(part) == [None, 3] and list(part.problems) == [0] and "t.parquet/2'" in str(part.problems[0])


def test_string_labels_become_their_class_index(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"image": [payload(i) for i in range(4)], "label": ["dog", "cat", "emu", "cat"]}),
                   root / "t.parquet", row_group_size=2)
    source = resolve(Source(str(root), classes=("ant", "cat", "dog", "emu")))
    reads = list(rowgroup_spans(fetcher(), source, [Span(0, 0, 2), Span(1, 0, 2)]))
    assert [s.fields["cls"] for r in reads for s in r.samples] == [b"2", b"1", b"3", b"1"]


def test_images_in_hugging_face_structs_and_pngs(tmp_path):
    write_parquet(str(tmp_path / "hf"), [3], layout="hf")
    source = resolve(Source(str(tmp_path / "hf")))
    (read,) = rowgroup_spans(fetcher(), source, [Span(0, 0, 3)])
    assert ids(read) == [0, 1, 2]
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    root = tmp_path / "png"
    root.mkdir()
    pq.write_table(pa.table({"image": [png, payload(1)]}), root / "p.parquet")  # and no label column
    (read,) = rowgroup_spans(fetcher(), resolve(Source(str(root))), [Span(0, 0, 2)])
    assert [s.fields for s in read.samples] == [{"png": png}, {"jpg": payload(1)}]


def test_a_missing_file_fails_its_row_groups_and_the_rest_still_come(table, tmp_path):
    (tmp_path / "pq" / "part-001.parquet").unlink()
    reads = list(rowgroup_spans(fetcher(), table, [Span(3, 0, 2), Span(0, 1, 2), Span(4, 0, 1)]))
    assert [ids(r) for r in reads] == [[None, None], [1], [None]]
    assert sorted(reads[0].problems) == [0, 1] and isinstance(reads[0].problems[0], StorageError)
    assert "part-001.parquet" in str(reads[0].problems[0]) and reads[1].problems == {}


def test_a_row_group_damaged_in_transit_is_read_again_when_the_index_has_checksums(table):
    source = checked(table)
    url = source.shard_urls[1]
    f = fetcher({url: 1})
    (read,) = rowgroup_spans(f, source, [Span(1, 0, 4)])
    assert ids(read) == [4, 5, 6, 7] and read.problems == {}
    assert f.stats.refetches == 1


def test_a_row_group_changed_after_indexing_is_none_after_every_refetch(table, tmp_path):
    source = checked(table)
    t = source.manifest.parquet
    path = tmp_path / "pq" / "part-000.parquet"
    data = bytearray(path.read_bytes())
    a, b = t.byte_ranges(2)[0]
    data[b - 1] ^= 0xFF  # one byte of row group 2's chunks, on disk
    path.write_bytes(bytes(data))
    f = fetcher(refetch=2)
    reads = list(rowgroup_spans(f, source, [Span(2, 0, 2), Span(3, 0, 1)]))
    assert ids(reads[0]) == [None, None] and ids(reads[1]) == [10]
    assert sorted(reads[0].problems) == [0, 1]
    assert "row group 2 fails its checksum" in str(reads[0].problems[0])
    assert f.stats.refetches == 2


def test_a_damaged_footer_in_the_index_fails_its_file_with_a_reason(table):
    t = table.manifest.parquet
    start, footer = t.footer(0)
    broken = footer[:8] + b"\xee" * (len(footer) - 16) + footer[-8:]  # the trailer kept: parses as PAR1
    blob = broken + t.footer_blob[len(footer):]
    bad = dataclasses.replace(table, manifest=dataclasses.replace(
        table.manifest, table=dataclasses.replace(t, footer_blob=blob)))
    reads = list(rowgroup_spans(fetcher(), bad, [Span(0, 0, 4), Span(3, 0, 1)]))
    assert ids(reads[0]) == [None] * 4 and ids(reads[1]) == [10]
    assert "damaged index.json" in str(reads[0].problems[0])
