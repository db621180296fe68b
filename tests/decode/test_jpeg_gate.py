"""The strict JPEG header check (``gpupipe.formats.jpeg``) and the native-decoder gate in front
of DALI (``gpupipe.decode.gate``): clean encoder output always passes, every header breakage
libjpeg merely tolerates is flagged, each strict rule has a row of its own, and the verdict
caches never carry one file's verdict over to another."""
from __future__ import annotations

import functools
import importlib
import io
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import DecodeError
from gpupipe.decode.gate import native_decodable, why_not_native
from gpupipe.formats.imageheader import probe

Image = pytest.importorskip("PIL.Image")
ImageCms = pytest.importorskip("PIL.ImageCms")

from jpeg_mutations import join, segments  # noqa: E402  (tests/ is on sys.path; needs Pillow)

jpeg_module = importlib.import_module("gpupipe.formats.jpeg")  # its verdict caches, for the cache tests

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pillow-jpeg"  # tests/fixtures
SOF0, SOF1, SOF2, DHT, DQT, DRI, SOS = 0xC0, 0xC1, 0xC2, 0xC4, 0xDB, 0xDD, 0xDA
EXAMPLES = settings(max_examples=80, deadline=None)


def picture(seed: int, width: int, height: int, grain: int = 8) -> Image.Image:
    """A small RGB picture: random colours on a grid of ``grain`` px, smoothed. Not finer than 6 px:
    Pillow saves an optimised or progressive JPEG through a buffer of about 1-2 bytes a pixel, and
    near-noise at quality 100 overflows it ("broken data stream when writing image file")."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 256, (-(-height // grain), -(-width // grain), 3), dtype=np.uint8)
    return Image.fromarray(grid).resize((width, height), Image.BICUBIC)


def save(img: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **options)
    return out.getvalue()


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def regular(data: bytes) -> bool:
    header = probe(data)
    return header.irregular == "" and native_decodable(header)


HAS_RESTART = b"\xff\xdd" in save(picture(0, 16, 16), restart_marker_blocks=1)  # Pillow >= 10.2


# -- 1. clean encoder output passes -----------------------------------------------------------

@EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(8, 200), height=st.integers(8, 200),
       grain=st.sampled_from([6, 16, 48]), quality=st.integers(30, 100),
       mode=st.sampled_from(["RGB", "L", "CMYK"]), subsampling=st.sampled_from([0, 1, 2]),
       progressive=st.booleans(), optimize=st.booleans(), restart=st.none() | st.integers(1, 8),
       orientation=st.none() | st.integers(1, 8), icc=st.booleans())
def test_clean_encoder_output_goes_native(seed, width, height, grain, quality, mode, subsampling, progressive,
                                          optimize, restart, orientation, icc):
    options = {"quality": quality, "progressive": progressive, "optimize": optimize}
    if mode == "RGB":
        options["subsampling"] = subsampling
    if restart is not None:
        options["restart_marker_blocks"] = restart
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    if icc:
        options["icc_profile"] = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    data = save(picture(seed, width, height, grain).convert(mode), **options)
    if restart is not None and HAS_RESTART:
        assert b"\xff\xdd" in data  # the DRI segment really is in the header under test
    header = probe(data)
    assert header.irregular == ""
    assert why_not_native(header) == "" and native_decodable(header)
    assert (header.width, header.height, header.channels, header.progressive, header.bit_depth) == \
        (width, height, {"RGB": 3, "L": 1, "CMYK": 4}[mode], progressive, 8)
    assert header.orientation == (orientation or 1) and not header.exif_conflict


# -- 2. bytes between segments are always flagged ---------------------------------------------

@functools.cache
def corpus() -> tuple[bytes, ...]:
    """A few clean encodings to break: baseline 4:2:0, progressive, grayscale, Exif + optimised."""
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb = picture(7, 48, 40)
    data = (save(rgb, quality=90), save(rgb, quality=85, progressive=True), save(rgb.convert("L"), quality=90),
            save(rgb, quality=80, optimize=True, subsampling=0, exif=exif.tobytes()))
    assert all(regular(d) for d in data)  # otherwise the breakage tests below prove nothing
    return data


def break_header(draw, insert: bytes) -> tuple[bytes, bytes]:
    """(a corpus JPEG, the same with ``insert`` written at a drawn segment boundary between SOI and
    the first SOS)."""
    clean = corpus()[draw(st.integers(0, len(corpus()) - 1), label="file")]
    segs, rest = segments(clean)
    at = draw(st.integers(0, len(segs) - 1), label="before segment")  # len - 1: right before the SOS
    return clean, join(segs[:at] + [(0, insert)] + segs[at:], rest)


def assert_flagged(clean: bytes, data: bytes, *, tolerated: bool = False) -> None:
    """Refused outright, or marked irregular and kept away from the native decoders. ``tolerated``:
    what libjpeg skips without a word (fill bytes, RSTn, TEM); the lenient walk must read through it."""
    try:
        header = probe(data)
    except DecodeError:
        assert not tolerated
        return
    if tolerated:
        assert header == probe(clean)  # format, size, channels, orientation, coding, depth
    assert header.irregular != ""
    assert not native_decodable(header) and "irregular JPEG header" in why_not_native(header)


# Stray bytes start with anything but FF: an FF would make them a marker (FF 00 and fill bytes have
# tests of their own; FF E0 00 02 is a legal empty APP0 segment, not a breakage).
STRAY = st.builds(lambda first, more: bytes([first]) + more, st.integers(0, 0xFE), st.binary(max_size=23))


@EXAMPLES
@given(data=st.data(), stray=STRAY)
def test_stray_bytes_in_the_header_are_flagged(data, stray):
    assert_flagged(*break_header(data.draw, stray))


@EXAMPLES
@given(data=st.data(), tail=st.binary(max_size=3))
def test_ff00_in_the_header_is_flagged(data, tail):
    assert_flagged(*break_header(data.draw, b"\xff\x00" + tail))


@EXAMPLES
@given(data=st.data(), count=st.integers(1, 8))
def test_fill_bytes_in_the_header_are_flagged(data, count):
    assert_flagged(*break_header(data.draw, b"\xff" * count), tolerated=True)


@EXAMPLES
@given(data=st.data(), code=st.sampled_from([0x01, *range(0xD0, 0xD8)]))
def test_standalone_markers_in_the_header_are_flagged(data, code):
    assert_flagged(*break_header(data.draw, bytes([0xFF, code])), tolerated=True)


# -- 3. one rule per row ------------------------------------------------------------------------

@functools.cache
def base(kind: str) -> bytes:
    """The clean files the rows edit: 64x48 RGB, quality 90, 4:2:0 (baseline or progressive)."""
    data = save(picture(3, 64, 48), quality=90, progressive=kind == "progressive")
    assert regular(data)
    return data


class Refused(str):
    """A row whose edit the walk itself must refuse: DecodeError with this in its message."""


def edit_segments(change):
    """An edit of the header's segment list (``change(segs)`` returns the new list)."""
    def edit(data: bytes) -> bytes:
        segs, rest = segments(data)
        return join(change(list(segs)), rest)
    return edit


def index(segs, marker: int, nth: int = 0) -> int:
    return [i for i, (m, _) in enumerate(segs) if m == marker][nth]


def patch(marker: int, at: int, *values: int, nth: int = 0):
    """Overwrite the body bytes at ``at`` of the ``nth`` segment with ``marker``."""
    def change(segs):
        i = index(segs, marker, nth)
        seg = segs[i][1]
        segs[i] = (marker, seg[:4 + at] + bytes(values) + seg[4 + at + len(values):])
        return segs
    return edit_segments(change)


def replace_body(marker: int, body: bytes, nth: int = 0):
    def change(segs):
        segs[index(segs, marker, nth)] = (marker, segment(marker, body))
        return segs
    return edit_segments(change)


def remarker(old: int, new: int):
    def change(segs):
        i = index(segs, old)
        segs[i] = (new, bytes([0xFF, new]) + segs[i][1][2:])
        return segs
    return edit_segments(change)


def insert_before_sos(marker: int, body: bytes):
    def change(segs):
        return segs[:-1] + [(marker, segment(marker, body))] + segs[-1:]
    return edit_segments(change)


def drop(keep):
    """Only the segments for which ``keep(marker, segment)`` holds."""
    return edit_segments(lambda segs: [s for s in segs if keep(*s)])


def move_dqt_after_sof(segs):
    tables = [s for s in segs if s[0] == DQT]
    rest = [s for s in segs if s[0] != DQT]
    at = index(rest, SOF0) + 1
    return rest[:at] + tables + rest[at:]


def dht_counts(change_counts):
    """The first DHT (DC table 0) with its 16 counts changed, its values left as they are."""
    def change(segs):
        i = index(segs, DHT)
        seg = segs[i][1]
        counts = change_counts(list(seg[5:21]))
        segs[i] = (DHT, seg[:5] + bytes(counts) + seg[21:])
        return segs
    return edit_segments(change)


def overflow(counts):
    """Three codes of length 1, which cannot exist; as many values as before (three longer codes
    made shorter), so only the code space is wrong."""
    moved = 0
    for length in range(15, 0, -1):
        while counts[length] and moved < 3:
            counts[length] -= 1
            moved += 1
    assert moved == 3
    counts[0] += 3
    return counts


def one_more(counts):
    counts[15] += 1  # one value more than the segment holds
    return counts


def dc_table_with_one_more_code(length: int):
    """The first DHT (DC table 0) with one more value, coded with ``length`` bits, 12."""
    def change(segs):
        i = index(segs, DHT)
        body = bytearray(segs[i][1][4:])
        body[length] += 1
        segs[i] = (DHT, segment(DHT, bytes(body) + b"\x0c"))
        return segs
    return edit_segments(change)


def define_huffman_tables_2(segs):
    """Copies of the luma DC and AC tables (ids 0) as tables 2, right before the SOS."""
    copies = [(DHT, seg[:4] + bytes([seg[4] | 2]) + seg[5:]) for marker, seg in segs
              if marker == DHT and seg[4] in (0x00, 0x10)]
    return segs[:-1] + copies + segs[-1:]


def then(*edits):
    return lambda data: functools.reduce(lambda d, e: e(d), edits, data)


# Body offsets: SOF: P 0, Y 1, X 3, Nf 5, then (id, HxV, Tq) at 6, 9, 12. SOS (3 components): Ns 0,
# (id, Td/Ta) at 1, 3, 5, Ss 7, Se 8, Ah/Al 9. DQT: Pq/Tq 0. DHT: Tc/Th 0, counts 1..16, values 17...
ROWS = [
    pytest.param("baseline", None, "", id="clean-baseline"),
    pytest.param("progressive", None, "", id="clean-progressive"),
    pytest.param("baseline", edit_segments(move_dqt_after_sof), "", id="dqt-after-sof-is-fine"),
    pytest.param("baseline", insert_before_sos(0xFE, b"a comment"), "", id="com-is-fine"),
    pytest.param("baseline", patch(SOF0, 7, 0x32), "SOF component 1 sampling 3x2", id="sof-sampling-3"),
    pytest.param("baseline", patch(SOF0, 10, 0x31), "SOF component 1 sampling 2x2 (of at most 3x2)",
                 id="sof-chroma-sampling-3"),  # 2 does not divide 3: the luma component is named
    pytest.param("baseline", patch(SOF0, 7, 0x44), "more than 10 blocks per MCU", id="sof-16-blocks-per-mcu"),
    pytest.param("baseline", then(patch(SOF0, 9, 1), patch(SOF0, 12, 1)),
                 "SOF with repeated component ids [1, 1, 1]", id="sof-repeated-ids"),
    pytest.param("baseline", patch(SOF0, 8, 4), "SOF component 1 quantisation table 4", id="sof-quant-table-4"),
    pytest.param("baseline", remarker(SOF0, 0xC9), "SOF 0xFFC9 (lossless, arithmetic or hierarchical",
                 id="sof-arithmetic-c9"),
    pytest.param("baseline", remarker(SOF0, 0xC3), "SOF 0xFFC3 (lossless, arithmetic or hierarchical",
                 id="sof-lossless-c3"),
    pytest.param("baseline", then(replace_body(SOF0, b"\x08\x00\x30\x00\x40\x02\x01\x22\x00\x02\x11\x01"),
                                  replace_body(SOS, b"\x02\x01\x00\x02\x11\x00\x3f\x00")),
                 "SOF with 2 components", id="sof-2-components"),
    pytest.param("baseline", patch(SOF0, 0, 0), Refused("invalid sample precision 0"), id="sof-precision-0"),
    pytest.param("baseline", patch(SOF0, 5, 5), Refused("does not fit its 5 components"), id="sof-count-5"),
    pytest.param("baseline", edit_segments(lambda s: s[:-1] + [s[index(s, SOF0)]] + s[-1:]),
                 Refused("second SOF"), id="sof-twice"),
    pytest.param("baseline", drop(lambda m, s: m != SOF0), Refused("before any SOF"), id="sof-missing"),
    pytest.param("baseline", patch(DQT, 0, 0x05), "DQT table with precision 0 and id 5", id="dqt-id-5"),
    pytest.param("baseline", patch(DQT, 0, 0x20), "DQT table with precision 2 and id 0", id="dqt-precision-2"),
    pytest.param("baseline", patch(DQT, 0, 0x10), "DQT segment shorter than its tables", id="dqt-16-bit-short"),
    pytest.param("baseline", drop(lambda m, s: m != DQT), "SOS before the quantisation tables of every component",
                 id="dqt-removed"),
    pytest.param("baseline", drop(lambda m, s: m != DQT or s[4] != 0x01),
                 "SOS before the quantisation tables of every component", id="dqt-chroma-removed"),
    pytest.param("baseline", dht_counts(overflow), "DHT table 0/0: more codes than its code lengths hold",
                 id="dht-code-space-overflow"),
    # The standard DC table fills all but 1/512 of its code space: one more 9-bit code would be all
    # ones (libjpeg refuses it), one more 10-bit code still fits.
    pytest.param("baseline", dc_table_with_one_more_code(9), "DHT table 0/0: more codes than its code lengths hold",
                 id="dht-all-ones-code"),
    pytest.param("baseline", dc_table_with_one_more_code(10), "", id="dht-one-more-code-fits"),
    pytest.param("baseline", replace_body(DHT, b""), "empty DHT segment", id="dht-empty"),
    pytest.param("baseline", replace_body(DQT, b""), "empty DQT segment", id="dqt-empty"),
    pytest.param("baseline", patch(DHT, 17, 16), "DHT DC table 0 with a symbol above 15", id="dht-dc-symbol-16"),
    pytest.param("baseline", dht_counts(one_more), "DHT segment shorter than its tables", id="dht-counts-too-many"),
    pytest.param("baseline", patch(DHT, 0, 0x20), "DHT table with class 2 and id 0", id="dht-class-2"),
    pytest.param("baseline", drop(lambda m, s: m != DHT or s[4] != 0x11),
                 "SOS component 2 uses undefined Huffman tables 1/1", id="dht-chroma-ac-removed"),
    pytest.param("baseline", insert_before_sos(DRI, b"\x00\x04\x00\x00"), "DRI segment of 4 bytes, not 2",
                 id="dri-4-bytes"),
    pytest.param("baseline", patch(SOS, 1, 9), "SOS components [9, 2, 3] are not the frame's [1, 2, 3]",
                 id="sos-unknown-component"),
    pytest.param("baseline", patch(SOS, 3, 1), "SOS components [1, 1, 3] are not the frame's",
                 id="sos-repeated-component"),
    pytest.param("baseline", patch(SOS, 0, 2), "SOS with 2 components in 10 bytes", id="sos-count-off"),
    pytest.param("baseline", then(edit_segments(define_huffman_tables_2), patch(SOS, 2, 0x22)),
                 "SOS component 1 uses undefined Huffman tables 2/2", id="sos-huffman-2-in-baseline"),
    pytest.param("baseline", then(remarker(SOF0, SOF1), edit_segments(define_huffman_tables_2), patch(SOS, 2, 0x22)),
                 "", id="sos-huffman-2-in-extended-is-fine"),
    pytest.param("baseline", then(remarker(SOF0, SOF1), patch(SOS, 2, 0x22)),
                 "SOS component 1 uses undefined Huffman tables 2/2", id="sos-huffman-never-defined"),
    pytest.param("baseline", patch(SOS, 8, 62), "SOS spectral selection 0..62", id="sos-sequential-se-62"),
    pytest.param("baseline", patch(SOS, 9, 0x01), "approximation 0x01 in a sequential frame",
                 id="sos-sequential-approximation"),
    pytest.param("progressive", patch(SOS, 7, 1, 5), "SOS of a progressive frame is not a first DC scan (Ss 1",
                 id="progressive-first-scan-ac"),
    pytest.param("progressive", patch(SOS, 9, 0x10), "not a first DC scan (Ss 0, Se 0, Ah/Al 0x10)",
                 id="progressive-first-scan-refinement"),
    pytest.param("baseline", insert_before_sos(0xCC, b"\x10\x01"), "unexpected marker 0xFFCC", id="dac-segment"),
    pytest.param("baseline", insert_before_sos(0xF0, b"jpg0"), "unexpected marker 0xFFF0", id="jpg0-segment"),
    pytest.param("baseline", insert_before_sos(0xDC, b"\x00\x30"), "unexpected marker 0xFFDC", id="dnl-segment"),
]


@pytest.mark.parametrize("kind, edit, expected", ROWS)
def test_one_broken_rule(kind, edit, expected):
    clean = base(kind)
    data = clean if edit is None else edit(clean)
    assert (data == clean) is (edit is None)  # every edit really edits
    if isinstance(expected, Refused):
        with pytest.raises(DecodeError, match="JPEG") as info:
            probe(data)
        assert expected in str(info.value)
        return
    header = probe(data)
    assert (header.width, header.height) == (64, 48)
    if expected:
        assert expected in header.irregular
        assert not native_decodable(header)
    else:
        assert header.irregular == "" and native_decodable(header)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.jpg")), ids=lambda p: p.stem)
def test_real_world_broken_headers_are_irregular(path):
    header = probe(path.read_bytes())
    assert "stray or fill bytes" in header.irregular
    assert not native_decodable(header)


def test_the_real_world_fixtures_are_there():
    assert len(list(FIXTURES.glob("*.jpg"))) == 3


# -- 4. the verdict caches ----------------------------------------------------------------------

def clear_caches() -> None:
    jpeg_module._HUFF_CACHE.clear()
    jpeg_module._LAYOUT_CACHE.clear()


@functools.cache
def optimized(seed: int) -> bytes:
    """Optimised Huffman tables: their own per image, unlike the standard tables of ``base``."""
    return save(picture(seed, 64, 48), quality=90, optimize=True)


@pytest.mark.parametrize("variant, expected", [
    pytest.param("clean", "", id="clean"),
    pytest.param("overflow", "more codes than its code lengths hold", id="dht-overflow"),
    pytest.param("chroma-ac-removed", "undefined Huffman tables 1/1", id="dht-missing"),
])
def test_a_verdict_is_the_same_cached_or_not(variant, expected):
    data = {"clean": lambda d: d, "overflow": dht_counts(overflow),
            "chroma-ac-removed": drop(lambda m, s: m != DHT or s[4] != 0x11)}[variant](optimized(11))
    dht_bodies = [seg[4:] for marker, seg in segments(data)[0] if marker == DHT]
    clear_caches()
    fresh = probe(data).irregular
    assert dht_bodies[0] in jpeg_module._HUFF_CACHE  # the verdict was cached ...
    cached = probe(data).irregular  # ... and this time it comes from the cache
    clear_caches()
    again = probe(data).irregular
    assert fresh == cached == again
    assert (expected in fresh) if expected else fresh == ""


def test_one_files_broken_tables_do_not_leak_into_the_next():
    """Files with the same frame and scan header but other tables: each gets its own verdict, in
    any order, whatever the caches hold."""
    broken_dht = dht_counts(overflow)(optimized(11))
    no_chroma_ac = drop(lambda m, s: m != DHT or s[4] != 0x11)(base("baseline"))  # same SOF and SOS bytes
    no_chroma_dqt = drop(lambda m, s: m != DQT or s[4] != 0x01)(base("baseline"))  # as base("baseline")
    good = [optimized(11), optimized(12), base("baseline")]
    bad = [broken_dht, no_chroma_ac, no_chroma_dqt]
    assert segments(optimized(11))[0][-1] == segments(base("baseline"))[0][-1]  # the same SOS segment
    assert len({seg for d in good for marker, seg in segments(d)[0] if marker == DHT}) > 4  # other tables
    clear_caches()
    for order in (good + bad, bad + good, [x for pair in zip(bad, good) for x in pair]):
        for data in order:
            header = probe(data)
            assert (header.irregular == "") is (data in good), header.irregular
            assert native_decodable(header) is (data in good)
