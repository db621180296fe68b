"""The vectorized span scan (:mod:`gpupipe.formats.tarscan`) never disagrees with the streaming reader.

Whenever :func:`scan_span` answers (not ``None``), the streaming reader reads the same bytes into the
same samples: the same keys, the same image bytes (by the same extension preference), the same
labels, and the checksums it returns are the samples' :func:`sample_crc32`. So checking those
against the manifest guards the delivered bytes exactly as the streaming path does. Damaged
shards (flipped bytes, rewritten size fields with valid header checksums) are fuzzed against it.
"""
from __future__ import annotations

import io
import tarfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import ShardFormatError
from gpupipe.formats.tar import BLOCK, TarShardWriter, group_by_key, iter_members, sample_crc32
from gpupipe.formats.tarscan import scan_span
from gpupipe.stream.batch import IMAGE_EXTENSIONS, LABEL_EXTENSIONS, image_field, label_of

_EXTS = dict(image_exts=IMAGE_EXTENSIONS, label_exts=LABEL_EXTENSIONS)
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
