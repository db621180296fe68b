"""The streaming tar reader and the shard writer (:mod:`gpupipe.formats.tar`).

Round trips through every chunking, agreement with ``tarfile`` and ``webdataset``
on shards they write, byte-range reads at manifest offsets, every rejection
(with the shard and the bad header's offset), and a fuzz run showing that a
damaged shard only ever gives samples or ``ShardFormatError``, quickly and with
bounded member sizes.
"""
from __future__ import annotations

import io
import os
import pickle
import tarfile
import time
import tracemalloc
from collections.abc import Iterable, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import ShardFormatError
from gpupipe.core.types import Sample, TarMember
from gpupipe.formats.manifest import index_shard
from gpupipe.formats.tar import (
    BLOCK,
    MAX_MEMBER_BYTES,
    TarShardWriter,
    group_by_key,
    iter_members,
    split_name,
)

SHARD = "s3://bucket/train/shard-000042.tar"
END = bytes(2 * BLOCK)
CHUNKINGS = [1, 511, 512, 513, 4096, None]  # None: the whole shard as one chunk

# ---------------------------------------------------------------- helpers


def chunked(data: bytes, size: int | None) -> Iterator[bytes]:
    if size is None:
        yield data
        return
    for i in range(0, len(data), size):
        yield data[i:i + size]


def read(data: bytes, chunk: int | None = None, *, base_offset: int = 0, **kw) -> list[tuple[str, dict, int]]:
    """(key, fields, offset) of every sample of ``data``, read in chunks of ``chunk`` bytes."""
    members = iter_members(chunked(data, chunk), shard=SHARD, base_offset=base_offset, **kw)
    return [(s.key, dict(s.fields), s.offset) for s in group_by_key(members, shard=SHARD)]


def write(samples: Iterable[tuple[str, dict[str, bytes]]], *, close: bool = True) -> tuple[bytes, list[int]]:
    buf = io.BytesIO()
    w = TarShardWriter(buf)
    for key, fields in samples:
        w.write(key, fields)
    if close:
        w.close()
    return buf.getvalue(), w.offsets


def member(name: str, data: bytes = b"", *, type: bytes = tarfile.REGTYPE,
           fmt: int = tarfile.GNU_FORMAT, **attrs) -> bytes:
    """One tar member (headers, data, padding) built by ``tarfile``."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = type, len(data), 0
    for k, v in attrs.items():
        setattr(info, k, v)
    return info.tobuf(fmt, "utf-8", "surrogateescape") + data + bytes(-len(data) % BLOCK)


def with_checksum(header: bytes) -> bytes:
    """``header`` with its checksum field recomputed (unsigned, as tar writes it)."""
    block = bytearray(header[:BLOCK])
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + header[BLOCK:]


def tarfile_shard(samples, fmt: int, **open_kw) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", **open_kw) as tf:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tarfile_offsets(data: bytes) -> list[tuple[str, int, int]]:
    """(name, first header offset, end of padded data) of each regular member, per ``tarfile``."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, m.offset, m.offset_data + -(-m.size // BLOCK) * BLOCK) for m in tf if m.isreg()]


def expect_error(data: bytes, *, chunk: int | None = None, base_offset: int = 0, **kw) -> ShardFormatError:
    with pytest.raises(ShardFormatError) as info:
        read(data, chunk, base_offset=base_offset, **kw)
    exc = info.value
    assert exc.shard == SHARD and SHARD in str(exc)
    return exc


LONG_KEY = "deep/" + "n" * 60 + "/" + "ü" * 40  # > 100 chars: a pax path, GNU long name or ustar prefix
FIXED = [
    ("a", {"jpg": b"\xff\xd8\xff" + bytes(100), "cls": b"7"}),
    ("a/b/c", {"png": bytes(range(256)) * 2, "json": b'{"k": 1}'}),  # png: exactly 512 bytes
    (LONG_KEY, {"jpg": b"\x01" * 513}),
    ("ünïcødé/日本", {"txt": "héllo".encode(), "empty": b""}),
    ("c", {"seg.png": b"seg", "jpg": b"x" * 1000}),
]

# ---------------------------------------------------------------- round trip

_NAME_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\0.")
_dir_part = st.text(st.one_of(_NAME_CHARS, st.just(".")), min_size=1, max_size=40).filter(
    lambda s: s not in (".", ".."))
_last_part = st.text(_NAME_CHARS, min_size=1, max_size=70)
keys = st.builds(lambda dirs, last: "/".join([*dirs, last]), st.lists(_dir_part, max_size=3), _last_part)
payloads = st.one_of(
    st.binary(max_size=700),
    st.sampled_from([0, 1, 511, 512, 513, 1024, 1025]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
)
exts = st.sampled_from(["jpg", "png", "cls", "json", "seg.png", "txt", "pkl", "pth", "ünï", ""])
sample_lists = st.lists(keys, unique=True, max_size=6).flatmap(
    lambda ks: st.tuples(*[st.tuples(st.just(k), st.dictionaries(exts, payloads, min_size=1, max_size=3))
                           for k in ks]).map(list))
chunk_sizes = st.one_of(st.sampled_from(CHUNKINGS), st.integers(1, 5000))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(samples=sample_lists, chunk=chunk_sizes)
@example(samples=FIXED, chunk=1)
@example(samples=FIXED, chunk=511)
@example(samples=FIXED, chunk=512)
@example(samples=FIXED, chunk=513)
@example(samples=FIXED, chunk=4096)
@example(samples=FIXED, chunk=None)
def test_writer_round_trip(samples, chunk):
    data, offsets = write(samples)
    assert read(data, chunk) == [(k, f, o) for (k, f), o in zip(samples, offsets)]
    assert len(offsets) == len(samples) + 1
    ends = [m.end for m in iter_members(chunked(data, chunk))]
    assert (ends[-1] if ends else 0) == offsets[-1] == len(data) - len(END)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(samples=sample_lists, data=st.data())
@example(samples=FIXED, data=None)
def test_tarfile_reads_writer_output_and_offsets_allow_range_reads(samples, data):
    shard, offsets = write(samples)
    names = [f"{k}.{e}" for k, f in samples for e in f]
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        infos = tf.getmembers()
        assert [m.name for m in infos] == names
        assert [tf.extractfile(m).read() for m in infos] == [v for _, f in samples for v in f.values()]
    firsts = iter(m.offset for m in infos)  # tarfile's offset counts the pax header, like ours
    starts = []
    for _, fields in samples:
        starts.append(next(firsts))
        for _ in range(len(fields) - 1):
            next(firsts)
    assert offsets[:-1] == starts
    n = len(samples)
    if data is None:
        pairs = [(i, j) for i in range(n + 1) for j in range(i, n + 1)]
    else:
        i = data.draw(st.integers(0, n))
        pairs = [(i, data.draw(st.integers(i, n)))]
    for i, j in pairs:
        got = read(shard[offsets[i]:offsets[j]], 513, base_offset=offsets[i])
        assert got == [(k, f, o) for (k, f), o in zip(samples[i:j], offsets[i:j])]


@pytest.mark.parametrize("key, fields", [
    ("a", {}),
    ("", {"jpg": b""}),
    ("x.y", {"jpg": b""}),
    ("a/../b", {"jpg": b""}),
    ("../b", {"jpg": b""}),
    ("/abs", {"jpg": b""}),
    ("./a", {"jpg": b""}),
    ("a\\b", {"jpg": b""}),
    ("a\0b", {"jpg": b""}),
    ("a\udcffb", {"jpg": b""}),
    ("dir/", {"jpg": b""}),
    ("a", {"JPG": b""}),
    ("a", {"x/y": b""}),
])
def test_writer_refuses_samples_that_would_not_read_back(key, fields):
    w = TarShardWriter(io.BytesIO())
    with pytest.raises(ValueError):
        w.write(key, fields)
    assert w.offsets == [] and w.size == 0


def test_writer_refuses_a_repeated_key_and_is_deterministic():
    buf = io.BytesIO()
    w = TarShardWriter(buf)
    w.write("a", {"jpg": b"1"})
    with pytest.raises(ValueError, match="previous key"):
        w.write("a", {"cls": b"2"})
    w.write("b", {"jpg": b"1"})
    w.write("a", {"jpg": b"3"})  # not consecutive: a separate sample, as the reader sees it
    w.close()
    w.close()  # idempotent
    assert [k for k, _, _ in read(buf.getvalue())] == ["a", "b", "a"]
    assert write([("a", {"jpg": b"1"})])[0] == write([("a", {"jpg": b"1"})])[0]


@pytest.mark.parametrize("name, expected", [
    ("a/b/x.seg.png", ("a/b/x", "seg.png")),
    ("x.JPG", ("x", "jpg")),
    ("a.b/x.jpg", ("a.b/x", "jpg")),
    ("x.", ("x", "")),
    ("._x.jpg", ("", "")),
    ("dir/.hidden", ("", "")),
    ("noext", ("", "")),
    ("dir/", ("", "")),
])
def test_split_name(name, expected):
    assert split_name(name) == expected

# ---------------------------------------------------------------- other writers


def _wds_read(url: str) -> list[tuple[str, dict]]:
    import webdataset as wds

    return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
            for s in wds.WebDataset(url, shardshuffle=False, empty_check=False)]


def _check_index(shard: bytes, samples) -> None:
    entry = index_shard(SHARD, chunked(shard, 1000))
    assert entry.num_samples == len(samples) and entry.size == len(shard)
    members = tarfile_offsets(shard)
    starts, pos = [], 0
    for _, fields in samples:
        starts.append(members[pos][1])
        pos += len(fields)
    assert entry.offsets.tolist() == [*starts, members[-1][2]]
    for i, (key, fields) in enumerate(samples):
        start, stop = entry.byte_range(i, i + 1)
        assert read(shard[start:stop], 300, base_offset=start) == [(key, fields, start)]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, "gpupipe"],
                         ids=["gnu", "ustar", "pax", "gpupipe"])
def test_shards_from_tarfile_and_gpupipe_read_like_webdataset(tmp_path, fmt):
    if fmt == "gpupipe":
        shard = write(FIXED)[0]
    else:
        extra = {"pax_headers": {"comment": "global header"}} if fmt == tarfile.PAX_FORMAT else {}
        shard = tarfile_shard(FIXED, fmt, **extra)
    path = tmp_path / "shard.tar"
    path.write_bytes(shard)
    ours = [(k, f) for k, f, _ in read(shard, 777)]
    assert ours == FIXED == _wds_read(str(path))
    _check_index(shard, FIXED)


def test_directory_entries_are_skipped():
    shard = (member("a/", type=tarfile.DIRTYPE) + member("a/x.jpg", b"1") + member("a/x.cls", b"2")
             + member("b/", type=tarfile.DIRTYPE) + member("b/y.jpg", b"3") + END)
    assert read(shard, 100) == [("a/x", {"jpg": b"1", "cls": b"2"}, 512), ("b/y", {"jpg": b"3"}, 3072)]


def test_shards_from_webdataset_writers(tmp_path):
    import webdataset as wds

    samples = [(f"s{i:03d}" if i % 2 else f"dir/s{i:03d}", {"jpg": bytes([i]) * (300 * i), "cls": str(i).encode()})
               for i in range(7)]
    buf = io.BytesIO()
    with wds.TarWriter(buf, encoder=False) as tw:
        for key, fields in samples:
            tw.write({"__key__": key, **fields})
    shard = buf.getvalue()
    path = tmp_path / "one.tar"
    path.write_bytes(shard)
    want = [(k, dict(sorted(f.items()))) for k, f in samples]  # TarWriter writes fields sorted
    assert [(k, f) for k, f, _ in read(shard, 4096)] == want == _wds_read(str(path))
    _check_index(shard, want)

    with wds.ShardWriter(str(tmp_path / "part-%06d.tar"), maxcount=3, encoder=False, verbose=0) as sw:
        for key, fields in samples:
            sw.write({"__key__": key, **fields})
    parts = sorted(tmp_path.glob("part-*.tar"))
    assert len(parts) == 3
    got = []
    for p in parts:
        shard = p.read_bytes()
        part = [(k, f) for k, f, _ in read(shard, 511)]
        assert part == _wds_read(str(p))
        _check_index(shard, part)
        got += part
    assert got == want

# ---------------------------------------------------------------- rejections

GOOD = member("good.jpg", b"ok")  # 1024 bytes: every bad header below starts at byte 1024


@pytest.mark.parametrize("bad", [
    member("x.jpg", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
    member("x.jpg", type=tarfile.LNKTYPE, linkname="good.jpg"),
    member("x.jpg", type=tarfile.CHRTYPE),
    member("x.jpg", type=tarfile.BLKTYPE),
    member("x.jpg", type=tarfile.FIFOTYPE),
    member("/etc/passwd"),
    member("../x.jpg", b"evil"),
    member("a/../../x.jpg", b"evil"),
    member("./../x.jpg", b"evil"),
    member("a\\..\\x.jpg", b"evil"),
    member("x.jpg", b"v", type=b"S"),  # GNU sparse: not a plain file
], ids=["symlink", "hardlink", "chardev", "blockdev", "fifo", "absolute", "dotdot", "nested-dotdot",
        "dot-dotdot", "backslash", "sparse"])
@pytest.mark.parametrize("chunk, base", [(None, 0), (1, 0), (700, 1 << 20)])
def test_rejected_members(bad, chunk, base):
    exc = expect_error(GOOD + bad + member("after.jpg", b"z") + END, chunk=chunk, base_offset=base)
    assert exc.offset == base + len(GOOD)


def test_rejected_member_behind_a_pax_header_is_reported_at_its_own_header():
    bad = member("l" * 120 + ".jpg", type=tarfile.SYMTYPE, fmt=tarfile.PAX_FORMAT, linkname="x")
    exc = expect_error(GOOD + bad + END)
    assert "symbolic link" in exc.reason and exc.offset == len(GOOD) + len(bad) - BLOCK
    bad = member("../" + "l" * 120 + ".jpg", b"evil", fmt=tarfile.PAX_FORMAT)
    assert expect_error(GOOD + bad + END).offset == len(GOOD) + len(bad) - 2 * BLOCK


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1:]


@pytest.mark.parametrize("pos", [0, 5, 100, 130, 150, 156, 300, 511])
def test_corrupt_checksum(pos):
    shard = GOOD + member("x.jpg", b"abc") + END
    exc = expect_error(_flip(shard, len(GOOD) + pos))
    assert exc.offset == len(GOOD) and ("checksum" in exc.reason or "octal" in exc.reason)


@pytest.mark.parametrize("field", [b"0000000x012\0", b"12345678912\x99", b"0o7777\0\0\0\0\0\0", b"-0000000001\0",
                                   b"\xff" * 12, b"\x81" + bytes(11)])
def test_bad_size_field(field):
    header = bytearray(member("x.jpg", b"abc")[:BLOCK])
    header[124:136] = field
    exc = expect_error(GOOD + with_checksum(bytes(header)) + b"abc" + bytes(509) + END, base_offset=77)
    assert exc.offset == 77 + len(GOOD)


BODY = member("x.jpg", b"d" * 1000)  # header, 1000 bytes of data, 24 of padding


@pytest.mark.parametrize("cut, what", [
    (1, "header"), (200, "header"), (511, "header"),
    (512 + 1, "data"), (512 + 300, "data"), (512 + 999, "data"),
    (512 + 1000 + 1, "padding"), (512 + 1023, "padding"),
])
@pytest.mark.parametrize("chunk", [1, 512, None])
def test_truncation(cut, what, chunk):
    exc = expect_error(GOOD + BODY[:cut], chunk=chunk, base_offset=4096)
    assert exc.offset == 4096 + len(GOOD) and what in exc.reason


def test_stream_ending_after_an_extended_header():
    pax = member("p" * 150 + ".jpg", b"x", fmt=tarfile.PAX_FORMAT)
    gnu = member("g" * 150 + ".jpg", b"x", fmt=tarfile.GNU_FORMAT)
    for ext_header in (pax[:2 * BLOCK], gnu[:2 * BLOCK]):  # the extended header and its data only
        assert expect_error(GOOD + ext_header).offset == len(GOOD) + 2 * BLOCK
        exc = expect_error(GOOD + ext_header + END)  # end-of-archive right after it
        assert exc.offset == len(GOOD) + 2 * BLOCK and "extended header" in exc.reason


def _endless(first: bytes, counter: list[int]) -> Iterator[bytes]:
    counter[0] += 1
    yield first
    while True:
        counter[0] += 1
        yield bytes(1 << 16)


def _pax_sized(size: str) -> bytes:
    """A pax header saying ``size``, then a ustar header saying 0."""
    info = tarfile.TarInfo("x.jpg")
    info.pax_headers = {"size": size}
    return info.tobuf(tarfile.PAX_FORMAT)


def _huge_header(size: int, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    info = tarfile.TarInfo("x.jpg")
    info.size = size
    return info.tobuf(fmt)


@pytest.mark.parametrize("header, limit, bad", [
    (_huge_header(2 ** 40), None, 0),           # GNU base-256 size, default limit
    (_huge_header(2 ** 40), 1 << 20, 0),
    (_huge_header(8 ** 11 - 1), None, 0),       # largest octal size (8 GiB)
    (_huge_header(MAX_MEMBER_BYTES + 1), None, 0),
    (_huge_header(2049), 2048, 0),
    (_pax_sized(str(2 ** 40)), None, 2 * BLOCK),  # the member's own header, after the pax header
    (_pax_sized(str(2 ** 40)), 1 << 20, 2 * BLOCK),
    (_pax_sized("9" * 5000), None, 0),          # more digits than int() converts: the pax header is bad
], ids=["b256-default", "b256-1MiB", "octal-8GiB", "limit+1", "2049-of-2048", "pax-default", "pax-1MiB",
        "pax-5000-digits"])
def test_oversized_member_is_rejected_without_reading_it(header, limit, bad):
    """The header is followed by an endless stream: reading the member would never end."""
    kw = {} if limit is None else {"max_member_bytes": limit}
    pulled = [0]
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError) as info:
            list(iter_members(_endless(GOOD + header, pulled), shard=SHARD, base_offset=10, **kw))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pulled[0] == 1 and peak < 1 << 20
    assert info.value.offset == 10 + len(GOOD) + bad
    assert SHARD in str(info.value)


def test_member_at_the_limit_is_read():
    shard = member("x.jpg", b"m" * 2048) + END
    assert read(shard, 100, max_member_bytes=2048) == [("x", {"jpg": b"m" * 2048}, 0)]


@pytest.mark.parametrize("second", ["x.jpg", "x.JPG"])
def test_repeated_extension_within_one_key(second):
    shard = member("x.jpg", b"1") + member("x.cls", b"2") + member(second, b"3") + END
    assert expect_error(shard, chunk=3).offset == 2048


def test_pickles_are_returned_as_bytes_never_loaded(tmp_path):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Bomb(str(marker)))
    shard = write([("x", {"pkl": payload, "pth": payload, "pickle": payload})])[0]
    assert read(shard, 64) == [("x", {"pkl": payload, "pth": payload, "pickle": payload}, 0)]
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: loading it is what would have made the marker
    assert marker.exists()


class _Bomb:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)

# ---------------------------------------------------------------- clean ends and skipped members


@pytest.mark.parametrize("chunk", CHUNKINGS)
def test_shard_without_end_blocks_ends_cleanly(chunk):
    full, offsets = write(FIXED)
    assert full.endswith(END)
    assert read(full[:-len(END)], chunk) == read(full, chunk) == [(k, f, o) for (k, f), o in zip(FIXED, offsets)]
    assert read(b"", chunk) == [] and read(END, chunk) == []


def test_bytes_after_the_end_marker_are_not_read():
    assert read(member("a.jpg", b"1") + END + b"garbage that is not a header") == [("a", {"jpg": b"1"}, 0)]


def test_hidden_and_extensionless_members_are_skipped():
    shard = (member("a.jpg", b"1") + member("._a.jpg", b"mac") + member("README", b"r")
             + member("a.cls", b"2") + member("d/.hidden", b"h") + member("b.jpg", b"3") + member("LICENSE") + END)
    assert read(shard, 5) == [("a", {"jpg": b"1", "cls": b"2"}, 0), ("b", {"jpg": b"3"}, 5 * 1024)]
    assert read(member("._only.jpg", b"x") + member("noext", b"y")) == []


def test_signed_checksum_is_accepted():
    """Old tars store the checksum summed over signed bytes; tarfile accepts both."""
    header = bytearray(member("é/ü.jpg", b"abc")[:BLOCK])
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(b - 256 if b > 127 else b for b in header)
    shard = bytes(header) + b"abc" + bytes(509) + END
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        assert tf.getnames() == ["é/ü.jpg"]
    assert read(shard) == [("é/ü", {"jpg": b"abc"}, 0)]


@pytest.mark.parametrize("value", ["-5", "+5", " 5", "5e3", "0x10", ""])
def test_pax_size_must_be_a_plain_decimal(value):
    shard = GOOD + _pax_sized(value) + END
    assert expect_error(shard).offset == len(GOOD)


def test_pax_size_applies_to_the_member_not_to_a_following_extended_header():
    first = _pax_sized("1000")[:-BLOCK]  # pax header + records, without its ustar header
    second = member("x.jpg", fmt=tarfile.PAX_FORMAT, pax_headers={"comment": "a" * 600})[:-BLOCK]
    shard = first + second + tarfile.TarInfo("x.jpg").tobuf(tarfile.GNU_FORMAT) + b"d" * 1000 + bytes(24) + END
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        assert tf.extractfile("x.jpg").read() == b"d" * 1000
    assert read(shard, 100) == [("x", {"jpg": b"d" * 1000}, 0)]

# ---------------------------------------------------------------- fuzz

FUZZ_MAX = 1 << 20
_BASES = [
    write(FIXED)[0],
    tarfile_shard(FIXED, tarfile.GNU_FORMAT),
    tarfile_shard(FIXED[:3], tarfile.USTAR_FORMAT),
    tarfile_shard(FIXED[2:], tarfile.PAX_FORMAT, pax_headers={"comment": "g"}),
]


def _header_offsets(shard: bytes) -> list[int]:
    """Where ``tarfile`` sees headers in ``shard``: each member's first and its own."""
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        return sorted({m.offset for m in tf} | {m.offset_data - BLOCK for m in tf})


_HEADERS = [_header_offsets(b) for b in _BASES]
_size_fields = st.one_of(
    st.integers(0, 8 ** 11 - 1).map(lambda n: b"%011o\0" % n),
    st.binary(min_size=11, max_size=11).map(lambda b: b"\x80" + b),
    st.binary(min_size=12, max_size=12),
    st.sampled_from([b"7" * 12, b"\xff" * 12, b"-0000000001\0", b" 1_0 \0\0\0\0\0\0\0", b"\0" * 12]),
)
_pax_sizes = st.one_of(st.integers(0, 2 ** 70).map(str), st.text("0123456789-+ e_x", max_size=30))


@st.composite
def damaged_shards(draw) -> bytes:
    which = draw(st.integers(0, len(_BASES) - 1))
    data, headers = bytearray(_BASES[which]), _HEADERS[which]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "size", "pax"]))
        if kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "flip" and data:
            for _ in range(draw(st.integers(1, 20))):
                data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.binary(min_size=1, max_size=700))
        elif kind == "delete":
            at = draw(st.integers(0, len(data)))
            del data[at:draw(st.integers(at, min(len(data), at + 700)))]
        elif kind == "size":
            at = draw(st.sampled_from(headers))
            if at + BLOCK <= len(data):
                data[at + 124:at + 136] = draw(_size_fields)
                if draw(st.booleans()):
                    data[at:at + BLOCK] = with_checksum(bytes(data[at:at + BLOCK]))
        elif kind == "pax":
            at = draw(st.sampled_from(headers))
            data[at:at] = _pax_sized(draw(_pax_sizes))[:-BLOCK]
    return bytes(data)


def _outcome(data: bytes, chunk: int | None, base: int):
    """What reading ``data`` gives: the samples, then the error (reason, offset) or None."""
    def checked(members: Iterable[TarMember]) -> Iterator[TarMember]:
        last = base
        for m in members:
            assert isinstance(m, TarMember) and isinstance(m.data, bytes) and len(m.data) <= FUZZ_MAX
            assert last <= m.offset < m.end <= base + len(data)
            last = m.end
            yield m

    samples, error = [], None
    try:
        members = iter_members(chunked(data, chunk), shard=SHARD, base_offset=base, max_member_bytes=FUZZ_MAX)
        for s in group_by_key(checked(members), shard=SHARD):
            assert isinstance(s, Sample) and s.key and s.shard == SHARD
            samples.append((s.key, dict(s.fields), s.offset))
    except ShardFormatError as exc:
        assert exc.shard == SHARD and SHARD in str(exc)
        assert exc.offset is not None and base <= exc.offset <= base + len(data)
        error = (exc.reason, exc.offset)
    return samples, error


def _check_fuzz(data: bytes, chunk: int | None, base: int) -> None:
    started = time.perf_counter()
    got = _outcome(data, chunk, base)
    assert time.perf_counter() - started < 2.0
    assert got == _outcome(data, None, base)  # the chunking never changes the answer
    offsets = [o for _, _, o in got[0]]
    assert offsets == sorted(offsets)


_fuzz_chunks = st.one_of(st.integers(1, 1100), st.sampled_from([4096, None]))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=damaged_shards(), chunk=_fuzz_chunks, base=st.sampled_from([0, 512, 10 ** 9]))
def test_fuzz_damaged_shards(data, chunk, base):
    _check_fuzz(data, chunk, base)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=3000),
                      st.binary(max_size=2000).map(lambda b: member("x.jpg", b"abc")[:BLOCK] + b)),
       chunk=_fuzz_chunks)
def test_fuzz_random_bytes(data, chunk):
    _check_fuzz(data, chunk, 0)
