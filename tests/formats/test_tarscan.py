"""The vectorized span scan (:mod:`gpupipe.formats.tarscan`) never disagrees with the streaming reader.

Whenever :func:`scan_span` answers (not ``None``), the streaming reader reads the same bytes into the
same samples: the same keys, the same image bytes (by the same extension preference), the same
labels, and the checksums it returns are the samples' :func:`sample_crc32`. So checking those
against the manifest guards the delivered bytes exactly as the streaming path does. Damaged
shards (flipped bytes, rewritten size fields with valid header checksums) are fuzzed against it.
"""
from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import ShardFormatError
from gpupipe.formats.imageheader import image_extensions
from gpupipe.formats.manifest import index_shard
from gpupipe.formats.tar import BLOCK, TarShardWriter, group_by_key, iter_members, sample_crc32
from gpupipe.formats.tarscan import scan_span
from gpupipe.stream.batch import LABEL_EXTENSIONS, image_field, label_of

_EXTS = dict(image_exts=image_extensions(), label_exts=LABEL_EXTENSIONS)
_MEMBERS = ("json", "mask.png")  # located on request (a sample's boxes and mask)


def _write(samples) -> tuple[bytes, list[int], list[int]]:
    buf = io.BytesIO()
    w = TarShardWriter(buf)
    for key, fields in samples:
        w.write(key, fields)
    w.close()
    return buf.getvalue(), w.offsets, w.crcs


def _streamed(data: bytes, offsets: list[int], a: int, b: int):
    """What the streaming reader gives for samples [a, b): (key, image, label, crc) each, or None."""
    try:
        got = list(group_by_key(iter_members([data[offsets[a]:offsets[b]]], base_offset=offsets[a])))
        if len(got) != b - a:
            return None
        return [(s.key, bytes(image_field(s)), label_of(s), sample_crc32(s.key, s.fields),
                 tuple(None if m not in s.fields else bytes(s.fields[m]) for m in _MEMBERS)) for s in got]
    except ShardFormatError:
        return None


def _scanned(data: bytes, offsets: list[int], a: int, b: int, block: int | None = None):
    """What the scan gives for samples [a, b), the span cut into ``block``-byte segments."""
    span = data[offsets[a]:offsets[b]]
    segments = [span] if block is None else [span[i:i + block] for i in range(0, len(span), block)]
    got = scan_span(segments, np.asarray(offsets[a:b + 1]) - offsets[a], **_EXTS, member_exts=_MEMBERS)
    if got is None:
        return None

    def member(ext: str, j: int) -> bytes | None:
        where, start, size = (int(c[j]) for c in got.members[ext])
        return None if size < 0 else bytes(got.buffers[where][start:start + size])

    return [(k, bytes(got.buffers[i][s:s + z]), int(lab), int(c), tuple(member(m, j) for m in _MEMBERS))
            for j, (k, i, s, z, lab, c) in enumerate(
                zip(got.keys, got.image_buffer, got.image_start, got.image_size, got.labels, got.crcs))]


_keys = st.from_regex(r"[a-z0-9_]{1,12}(/[a-z0-9_]{1,6})?", fullmatch=True)
_field = st.sampled_from(["jpg", "png", "jpeg", "cls", "json", "txt", "seg.png", "webp", "mask.png"])


@st.composite
def _samples(draw):
    keys = draw(st.lists(_keys, min_size=1, max_size=8, unique=True))
    out = []
    for key in keys:
        exts = draw(st.lists(_field, min_size=1, max_size=4, unique=True))
        fields = {}
        for ext in exts:
            if ext == "cls":
                fields[ext] = draw(st.sampled_from([b"0", b"7", b"123456", b" 3", b"x", b"-1", b""]))
            else:
                fields[ext] = draw(st.binary(min_size=0, max_size=1500))
        out.append((key, fields))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=_samples(), data=st.data())
def test_scan_agrees_with_the_streaming_reader(samples, data):
    shard, offsets, crcs = _write(samples)
    n = len(samples)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    block = data.draw(st.sampled_from([None, 512, 1024, 4096]))
    scanned = _scanned(shard, offsets, a, b, block)
    if scanned is not None:
        assert scanned == _streamed(shard, offsets, a, b)
        assert [c for *_, c, _ in scanned] == crcs[a:b]


def test_members_are_located_across_segment_edges():
    """Boxes and masks are found where they lie, also when a member straddles two segments
    (then it is copied, like an image), and a sample without one says so (size -1)."""
    samples = [(f"d{i}", {"jpg": bytes([i]) * (300 + 40 * i), "json": b'{"boxes":[],"labels":[]}' * (i + 1),
                          **({"mask.png": bytes([7, i]) * (200 + 90 * i)} if i % 3 else {})}) for i in range(9)]
    shard, offsets, _ = _write(samples)
    for block in (None, 512, 1536):
        got = _scanned(shard, offsets, 0, 9, block)
        assert got is not None and got == _streamed(shard, offsets, 0, 9)
        assert [m[1] is None for *_, m in got] == [i % 3 == 0 for i in range(9)]


def test_plain_shards_take_the_fast_path():
    samples = [(f"img_{i:04d}", {"jpg": bytes([i]) * (100 + i), "cls": str(i % 10).encode()}) for i in range(50)]
    shard, offsets, crcs = _write(samples)
    for block in (None, 512, 1536, 4096):  # segments that cut headers off images, images in two
        got = _scanned(shard, offsets, 0, 50, block)
        assert got is not None and got == _streamed(shard, offsets, 0, 50)
        assert [c for *_, c, _ in got] == crcs
    assert _scanned(shard, offsets, 0, 50, 700) is None  # segments off the 512-byte grid are not taken


def _tarfile_shard(samples, fmt=tarfile.GNU_FORMAT) -> tuple[bytes, list[int]]:
    """A shard written by ``tarfile`` from ``[(key, [(ext, payload), ...]), ...]``, and its offsets."""
    out, offsets = io.BytesIO(), []
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for key, members in samples:
            offsets.append(out.tell())
            for ext, payload in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        offsets.append(out.tell())
    return out.getvalue(), offsets


def test_unusual_layouts_are_left_to_the_streaming_reader():
    cases = [("a", [("JPG", b"abc")]),  # the extension is lower-cased in the sample
             ("b", [("cls", b"1")]),  # no image
             ("c", [("jpg", b"")]),  # an empty image
             ("d", [("jpg", b"abc"), ("cls", b"cat")]),  # a label that is not an integer
             ("e", [("jpg", b"abc"), ("jpg", b"def")])]  # a repeated extension
    for sample in cases:
        shard, offsets = _tarfile_shard([sample], tarfile.PAX_FORMAT)
        assert _scanned(shard, offsets, 0, 1) is None, sample[0][:10]


def test_tarfile_shards_with_gnu_and_ustar_headers():
    samples = [(f"dir/s{i}", [("jpg", b"x" * (600 + i)), ("cls", str(i).encode())]) for i in range(5)]
    for fmt in (tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT):
        shard, offsets = _tarfile_shard(samples, fmt)
        assert _scanned(shard, offsets, 0, 5) == _streamed(shard, offsets, 0, 5) is not None


_BASE_SAMPLES = [(f"k{i}", {"jpg": bytes(j % 256 for j in range(i, i + 200 + 137 * i)), "cls": str(i).encode()}) for i in range(6)]
_BASE, _OFFSETS, _CRCS = _write(_BASE_SAMPLES)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_bytes_are_never_taken_for_good_ones(data):
    """Flipped bytes anywhere, or a size field rewritten with a valid header checksum: the scan
    answers None, or exactly what the streaming reader answers (whose checksums then differ
    from the manifest's wherever a sample's bytes changed)."""
    shard = bytearray(_BASE)
    for _ in range(data.draw(st.integers(1, 4))):
        if data.draw(st.booleans()):
            at = data.draw(st.integers(0, len(shard) - 1))
            shard[at] ^= data.draw(st.integers(1, 255))
        else:
            header = data.draw(st.sampled_from(_OFFSETS[:-1]))
            size = data.draw(st.integers(0, 3000))
            shard[header + 124:header + 136] = b"%011o\0" % size
            block = shard[header:header + BLOCK]
            block[148:156] = b" " * 8
            shard[header + 148:header + 156] = b"%06o\0 " % sum(block)
    scanned = _scanned(bytes(shard), _OFFSETS, 0, len(_BASE_SAMPLES))
    if scanned is not None:
        assert scanned == _streamed(bytes(shard), _OFFSETS, 0, len(_BASE_SAMPLES))


# Shards as writers write them: Python's tarfile (pax, GNU, ustar), webdataset's TarWriter, GNU tar. The
# offsets and checksums are the real indexer's (manifest.index_shard: a sample starts at its first
# header, the pax or long-name header where there is one), and the scan must take every span.

_dir = st.from_regex(r"[a-z0-9_]{1,45}", fullmatch=True)
_long_keys = st.builds(lambda dirs, base: "/".join([*dirs, base]), st.lists(_dir, max_size=3),
                       st.from_regex(r"[a-z0-9_]{1,40}", fullmatch=True))  # up to 186 bytes: L, path= and prefixes


def _indexed(shard: bytes) -> tuple[list[int], list[int]]:
    entry = index_shard("shard.tar", [shard])
    return [int(x) for x in entry.offsets], [int(c) for c in entry.crc32]


def _assert_fast_and_same(shard: bytes, spans=None, block: int | None = None) -> None:
    """Every span (or those given) is taken by the scan, exactly as the streaming reader reads it."""
    offsets, crcs = _indexed(shard)
    n = len(offsets) - 1
    for a, b in spans or [(0, n)]:
        scanned = _scanned(shard, offsets, a, b, block)
        assert scanned is not None, (a, b)
        assert scanned == _streamed(shard, offsets, a, b)
        assert [c for *_, c, _ in scanned] == crcs[a:b]


def _python_tar(samples, fmt: int, mtime: float, extra: dict[str, str] | None = None,
                global_headers: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers=global_headers or {}) as tar:
        for key, fields in samples:
            for ext, payload in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.pax_headers = len(payload), mtime, dict(extra or {})
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


@st.composite
def _writer_samples(draw):
    keys = draw(st.lists(_long_keys, min_size=1, max_size=6, unique=True))
    out = []
    for key in keys:
        exts = draw(st.lists(st.sampled_from(["jpg", "png", "cls", "json", "seg.png"]), min_size=1, max_size=3,
                             unique=True))
        out.append((key, {e: (str(draw(st.integers(0, 999))).encode() if e == "cls"
                              else draw(st.binary(min_size=1, max_size=1200))) for e in ["jpg", *exts]}))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=_writer_samples(), fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
       mtime=st.sampled_from([0, 1_700_000_000, 1_700_000_000.123456]), data=st.data())
def test_python_tarfile_shards_take_the_fast_path(samples, fmt, mtime, data):
    """tarfile in each format (pax: a float mtime, records of other keys, a global header; long names
    as pax paths, GNU long names or ustar prefixes): the scan takes every span."""
    extra = data.draw(st.sampled_from([None, {"comment": "a b=c\nd"}, {"uname": "ünï"}, {"SCHILY.xattr.x": "1"}]))
    glob = data.draw(st.sampled_from([None, {"comment": "global"}]))
    shard = _python_tar(samples, fmt, mtime, extra if fmt == tarfile.PAX_FORMAT else None,
                        glob if fmt == tarfile.PAX_FORMAT else None)
    n = len(samples)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    _assert_fast_and_same(shard, [(0, n), (a, b)], data.draw(st.sampled_from([None, 512, 1024, 4096])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=_writer_samples())
def test_webdataset_tarwriter_shards_take_the_fast_path(samples):
    """webdataset's TarWriter: tarfile's default pax format with a float mtime, so a pax header before
    every member (and a path record for each long name)."""
    wds = pytest.importorskip("webdataset")
    out = io.BytesIO()
    with wds.TarWriter(out) as writer:
        for key, fields in samples:
            writer.write({"__key__": key, **fields})
    assert out.getvalue()[156:157] == b"x"  # the layout this test is about
    _assert_fast_and_same(out.getvalue())


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_gnu_tar_shards_take_the_fast_path(tmp_path, fmt):
    """GNU tar in each format, names given as ./name (stripped by the reader), long ones (L records,
    path= records, ustar prefixes), and a directory entry between two samples."""
    names = []
    for i in range(7):
        key = f"{'d' * 45}/{'e' * 45}/{'f' * 30}/s{i}" if i % 2 else f"s{i}"
        if i == 4:
            names.append("./sub")
            key = f"sub/s{i}"
        for ext, payload in (("jpg", bytes([i]) * (300 + 97 * i)), ("cls", str(i).encode())):
            path = tmp_path / "src" / f"{key}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload)
            names.append(f"./{key}.{ext}")
    shard = tmp_path / f"{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--no-recursion", "-cf", str(shard), "-C", str(tmp_path / "src"),
                    *names], check=True)
    data = shard.read_bytes()
    headers = _headers_of(data)
    assert {"gnu": any(t == b"L" for _, t, _ in headers), "posix": any(t == b"x" for _, t, _ in headers),
            "ustar": any(data[at + 345] for at, _, _ in headers)}[fmt]  # the layout this test is about
    _assert_fast_and_same(data, [(0, 7), (1, 5), (3, 6)])
    _assert_fast_and_same(data, [(0, 7)], block=1024)


# Hand-made layouts: every way the streaming reader names a member (header field, ustar prefix, GNU
# long name, pax path, with or without leading ./), pax records it reads past or takes (size), and
# the entries it skips (global pax headers, GNU long link names, directories) between members.

def _header(name: bytes, typeflag: bytes, size: int, prefix: bytes = b"", gnu: bool = False) -> bytes:
    h = bytearray(BLOCK)
    h[:len(name[:100])] = name[:100]
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136], h[136:148], h[156:157] = b"%011o\0" % size, b"%011o\0" % 1_700_000_000, typeflag
    h[257:265] = b"ustar  \0" if gnu else b"ustar\x0000"
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b"%06o\0 " % (sum(h) + 8 * 0x20 - sum(h[148:156]))
    return bytes(h)


def _entry(typeflag: bytes, data: bytes, name: bytes = b"././@PaxHeader", size: int | None = None) -> bytes:
    return _header(name, typeflag, len(data) if size is None else size) + data + bytes(-len(data) % BLOCK)


def _pax(*records: tuple[str, str]) -> bytes:
    """Pax records ``"%d %s=%s\\n"``, the length counting its own digits (tarfile's rule)."""
    out = b""
    for key, value in records:
        body = f" {key}={value}\n".encode()
        n = p = 0
        while (n := len(body) + len(str(p))) != p:
            p = n
        out += str(n).encode() + body
    return out


def _member(name: str, payload: bytes, style: str, draw) -> bytes:
    raw = name.encode()
    pad = payload + bytes(-len(payload) % BLOCK)
    mtime = ("mtime", "1700000000.25")
    if style == "prefix" and "/" in name[:-1] and len(raw) - raw.rfind(b"/") <= 100:
        cut = raw.rfind(b"/", 0, len(raw) - 1)
        return _header(raw[cut + 1:], b"0", len(payload), prefix=raw[:cut]) + pad
    if style == "long":
        return _entry(b"L", raw + b"\0", b"././@LongLink") + _header(raw[:100], b"0", len(payload), gnu=True) + pad
    if style == "long-then-pax":  # a pax header without a path keeps the long name
        return _entry(b"L", raw + b"\0") + _entry(b"x", _pax(mtime)) + _header(b"x", b"0", len(payload)) + pad
    if style == "pax-then-long":  # the later one names the member
        return _entry(b"x", _pax(("path", "other.jpg"))) + _entry(b"L", raw) + _header(b"x", b"0", len(payload)) + pad
    if style == "empty-path" and len(raw) <= 100:  # an empty path is no path: the header's name
        return _entry(b"x", _pax(("path", ""), mtime)) + _header(raw, b"0", len(payload)) + pad
    if style == "pax-size":  # the header's size field says otherwise; the pax record rules
        return (_entry(b"x", _pax(("path", name), ("size", str(len(payload))), mtime))
                + _header(b"ignored", b"0", draw(st.integers(0, 4000))) + pad)
    if style == "pax" or len(raw) > 100:
        return _entry(b"x", _pax(mtime, ("path", name))) + _header(raw[:100], b"0", len(payload)) + pad
    if style == "pax-mtime":
        records = _pax(mtime, ("atime", "1.5"), ("comment", "x=y z"))
        return _entry(b"x", records) + _header(raw, b"0", len(payload)) + pad
    return _header(raw, b"0", len(payload)) + pad


_SKIPPED = [_entry(b"g", _pax(("comment", "all"), ("mtime", "1"))),
            _entry(b"K", b"some/long/link\0", b"././@LongLink"),
            _header(b"adir/", b"5", 0),
            _entry(b"x", _pax(("mtime", "2"))) + _header(b"./bdir/", b"5", 0)]
_STYLES = ["header", "prefix", "long", "long-then-pax", "pax-then-long", "empty-path", "pax", "pax-mtime", "pax-size"]


@st.composite
def _layouts(draw):
    """A shard of hand-made members, each named in one of the ways of ``_STYLES``, some after an
    entry the reader skips."""
    keys = draw(st.lists(_long_keys, min_size=1, max_size=6, unique=True))
    shard = b""
    for key in keys:
        for ext in ["jpg", *draw(st.lists(st.sampled_from(["cls", "json", "mask.png"]), max_size=2, unique=True))]:
            payload = (str(draw(st.integers(0, 99))).encode() if ext == "cls"
                       else draw(st.binary(min_size=1, max_size=900)))
            if draw(st.integers(0, 5)) == 0:
                shard += draw(st.sampled_from(_SKIPPED))
            dots = draw(st.sampled_from(["", "", "./", "././"]))
            shard += _member(f"{dots}{key}.{ext}", payload, draw(st.sampled_from(_STYLES)), draw)
    return shard + bytes(2 * BLOCK)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shard=_layouts(), data=st.data())
def test_every_member_naming_takes_the_fast_path(shard, data):
    offsets, _ = _indexed(shard)
    n = len(offsets) - 1
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    _assert_fast_and_same(shard, [(0, n), (a, b)], data.draw(st.sampled_from([None, 512, 1536])))


def _base256(header: bytes, field: slice, value: int) -> bytes:
    """``header`` with a numeric field in GNU base-256 (the first byte 0x80), its checksum redone."""
    h = bytearray(header)
    width = field.stop - field.start
    h[field] = b"\x80" + value.to_bytes(width - 1, "big")
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def test_edge_fields_match_the_streaming_reader():
    """Names at the edges of each field: a 100-byte name (no NUL), a 155-byte prefix, a pax ``path``
    record without ``=`` (an empty name: the header's), a long name without its NUL; sizes and
    times in GNU base-256."""
    pad = b"\xff" * 10 + bytes(BLOCK - 10)
    members = [_header(b"a" * 96 + b".jpg", b"0", 10) + pad,
               _header(b"b.jpg", b"0", 10, prefix=b"p" * 155) + pad,
               _entry(b"x", b"7 path\n") + _header(b"c.jpg", b"0", 10) + pad,
               _entry(b"x", _pax(("path", "zz.jpg"))) + _entry(b"x", b"7 path\n") + _header(b"d.jpg", b"0", 10) + pad,
               _entry(b"L", b"e.jpg") + _header(b"zz.jpg", b"0", 10) + pad,
               _base256(_base256(_header(b"f.jpg", b"0", 0, gnu=True), slice(124, 136), 10), slice(136, 148), 7) + pad]
    shard = b"".join(members) + bytes(2 * BLOCK)
    _assert_fast_and_same(shard)
    offsets, _ = _indexed(shard)
    assert [k for k, *_ in _scanned(shard, offsets, 0, 6)] == ["a" * 96, "p" * 155 + "/b", "c", "d", "e", "f"]
    huge = _base256(_header(b"g.jpg", b"0", 0, gnu=True), slice(124, 136), 1 << 40) + pad
    assert _scanned(shard[:-2 * BLOCK] + huge, [*offsets, offsets[-1] + 2 * BLOCK], 0, 7) is None


def _headers_of(shard: bytes) -> list[tuple[int, bytes, int]]:
    """``(offset, typeflag, size)`` of each header, read plainly (the shard is undamaged; a pax
    ``size`` record gives the next member's size)."""
    out, at, pax_size = [], 0, None
    while shard[at:at + BLOCK].strip(b"\0"):
        size, typeflag = int(shard[at + 124:at + 135], 8), shard[at + 156:at + 157]
        if typeflag not in (b"x", b"L", b"g", b"K") and pax_size is not None:
            size, pax_size = pax_size, None
        out.append((at, typeflag, size))
        if typeflag == b"x" and (hit := re.search(rb" size=(\d+)\n", shard[at + BLOCK:at + BLOCK + size])):
            pax_size = int(hit.group(1))
        at += BLOCK + -(-size // BLOCK) * BLOCK
    return out


def _resum(shard: bytearray, at: int) -> None:
    block = shard[at:at + BLOCK]
    block[148:156] = b" " * 8
    shard[at + 148:at + 156] = b"%06o\0 " % sum(block)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shard=_layouts(), data=st.data())
def test_damaged_extended_headers_are_never_taken_for_good_ones(shard, data):
    """Flipped bytes (in pax records, long names, anywhere), record lengths rewritten, pax sizes that
    disagree with the data, extended headers' sizes cut or grown (a truncated long name) with valid
    checksums: the scan answers None or what the streaming reader answers, and raises nothing."""
    offsets, _ = _indexed(shard)
    headers = _headers_of(shard)
    extended = [(at, size) for at, t, size in headers if t in (b"x", b"L")] or [(headers[0][0], headers[0][2])]
    damaged = bytearray(shard)
    for _ in range(data.draw(st.integers(1, 3))):
        at, size = data.draw(st.sampled_from(extended))
        how = data.draw(st.sampled_from(["flip", "data", "digits", "size", "pax-size"]))
        if how == "flip":
            damaged[data.draw(st.integers(0, len(damaged) - 1))] ^= data.draw(st.integers(1, 255))
        elif how == "data" and size:
            damaged[at + BLOCK + data.draw(st.integers(0, size - 1))] = data.draw(st.sampled_from(b"/.\0 =\n9Ax\xc3"))
        elif how == "digits" and size:
            damaged[at + BLOCK] = data.draw(st.sampled_from(b"0123456789 +-"))
        elif how in ("size", "pax-size"):
            new = data.draw(st.integers(0, size + 700))
            if how == "size":
                damaged[at + 124:at + 136] = b"%011o\0" % new
                _resum(damaged, at)
            else:  # a pax size record of the same width that names another size
                body = bytes(damaged[at + BLOCK:at + BLOCK + size])
                hit = body.find(b" size=")
                if hit >= 0:
                    end = body.index(b"\n", hit)
                    digits = str(new).rjust(end - hit - 6, "0")[-(end - hit - 6):].encode()
                    damaged[at + BLOCK + hit + 6:at + BLOCK + end] = digits
    n = len(offsets) - 1
    scanned = _scanned(bytes(damaged), offsets, 0, n)
    if scanned is not None:
        assert scanned == _streamed(bytes(damaged), offsets, 0, n)
