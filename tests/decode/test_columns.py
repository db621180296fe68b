"""Issue 34: the per-image work moved out of the decode thread gives the very same answers.

* The header probe done where a batch is packed (:func:`gpupipe.decode.columns.annotate`, in a
  DataLoader worker) and remembered across images (:mod:`gpupipe.formats.jpeg` walks,
  :func:`gpupipe.formats.headers.probe_batch`) says of every image what probing it alone says.
* A batch packed padded (one (B, stride) array for the decoder) holds the same images.
* A decoder fed from the columns, padded or not, delivers the same pixels, labels, valid flags
  and counts as from a bare batch; fed one batch ahead (``decode_stream``) the same as batch by
  batch, also when DALI fails on a batch in between and one pass is broken off.
"""
from __future__ import annotations

import dataclasses
import pickle
import struct
import subprocess
import sys

import decode_corpus as corpus
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import DecodeError
from gpupipe.core.types import Sample
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.decode.columns import annotate
from gpupipe.formats.headers import probe_batch
from gpupipe.formats.imageheader import check_complete, probe
from gpupipe.stream.batch import pack, padded_stride

pytest.importorskip("PIL.Image")
from jpeg_mutations import base_jpegs, mutate  # noqa: E402  (tests/ is on sys.path; needs Pillow)

_CORPUS = corpus.cases()


def _all_fields(header) -> tuple | None:
    return None if header is None else dataclasses.astuple(header)


def _one_by_one(data: bytes, max_pixels: int | None) -> tuple[tuple | None, str | None]:
    try:
        header = probe(data, max_pixels=max_pixels)
        check_complete(data, header)
    except DecodeError as exc:
        return None, str(exc)
    return _all_fields(header), None


def _batch_images() -> list[tuple[str, bytes]]:
    """Every corpus case (good, bad and 'either'), natural JPEGs twice (the second time from
    memory), and the same JPEG cut short and with bytes after its EOI."""
    natural = corpus.natural_jpegs(6, (48, 40))
    images = [(name, data) for name, (data, _) in sorted(_CORPUS.items())]
    images += [(f"nat{i}", d) for i, d in enumerate(natural + natural)]
    images += [("cut", natural[0][:-300]), ("trailer", natural[1] + b"\0" * 100), ("no-eoi", natural[2][:-2])]
    return images


def _encode(images: list[tuple[str, bytes]], **kw):
    samples = [Sample(key=k, fields={"png" if d.startswith(b"\x89PNG") else "jpg": d, "cls": b"%d" % (i % 7)},
                      sample_id=100 + i, label=i % 7) for i, (k, d) in enumerate(images)]
    return pack(samples, [True] * len(samples), epoch=3, **kw)


def _padded(images: list[bytes], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The images as a padded batch's rows (B, stride) and sizes, garbage past each image: an
    EOI marker, a header's start, random bytes."""
    rng = np.random.default_rng(seed)
    sizes = np.array([len(d) for d in images], dtype=np.int64)
    rows = rng.integers(0, 256, (len(images), int(sizes.max()) + 8), dtype=np.uint8)
    rows[:, -8:-4], rows[:, -4:] = (0xFF, 0xD9, 0xFF, 0xD9), (0xFF, 0xD8, 0xFF, 0xE0)
    for i, d in enumerate(images):
        rows[i, :len(d)] = np.frombuffer(d, dtype=np.uint8)
    return rows, sizes


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("max_pixels", [None, 2000])
def test_probe_batch_says_what_probing_each_image_alone_says(max_pixels, padded):
    images = [d for _, d in _batch_images()]
    rows = _padded(images) if padded else None
    for _ in range(2):  # the second time, good JPEG headers come from memory
        got = probe_batch(None if padded else images, max_pixels, rows)  # (padded: each image read from its row)
        for i, data in enumerate(images):
            header, reason = _one_by_one(data, max_pixels)
            assert got.reasons.get(i) == reason, i
            assert _all_fields(got.headers()[i]) == header, i


@pytest.mark.parametrize("max_pixels", [None, 2000])
def test_a_batch_whose_headers_are_all_remembered_gets_the_same_table(max_pixels):
    """Good JPEGs of a few sizes in a shuffled order, probed twice from their padded rows: the
    second time every header comes from memory (its table built from the header objects' ids);
    each image still gets exactly its own header, the table holds each distinct one once, in order
    of first appearance."""
    from gpupipe.tools.synth import synthetic_jpeg

    kinds = [synthetic_jpeg(np.random.default_rng(k), (16 + 4 * k, 24)) for k in range(4)]
    order = np.random.default_rng(1).integers(0, 4, 40)
    images = [kinds[k] for k in order.tolist()]
    rows = _padded(images)
    first, again = probe_batch(None, max_pixels, rows), probe_batch(None, max_pixels, rows)
    for got in (first, again):
        assert not got.reasons and len(got.table) == len(set(map(id, got.table))) == len(np.unique(order))
        assert [id(h) for h in got.table] == list(dict.fromkeys(id(h) for h in got.headers()))  # first appearance
        for i, data in enumerate(images):
            assert _all_fields(got.headers()[i]) == _one_by_one(data, max_pixels)[0], i
    assert [_all_fields(h) for h in again.headers()] == [_all_fields(h) for h in first.headers()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 400), tail=st.sampled_from([b"", b"\xff\xd9", b"\0\0"]))
def test_a_remembered_header_never_answers_for_another_file(seed, cut, tail):
    """A clean JPEG is probed first (its header remembered), then files sharing all or part of
    its header — mutated headers, the same header over other data, cut short, trailing bytes:
    each gets what a fresh probe of it alone gets."""
    rng = np.random.default_rng(seed)
    clean = base_jpegs(seed % 3, 12)[int(rng.integers(12))]
    _, mutated = mutate(clean, rng)
    others = [mutated, clean[:max(4, len(clean) - cut)] + tail, clean + tail, clean[:len(clean) // 2] + clean[-2:]]
    probe_batch([clean], None)  # remembered
    for padded in (None, _padded([clean, *others], seed)):  # one image at a time, or the batch's rows at once
        got = probe_batch([clean, *others], None, padded)
        for i, data in enumerate([clean, *others]):
            header, reason = _one_by_one(data, None)
            assert got.reasons.get(i) == reason
            assert _all_fields(got.headers()[i]) == header


def test_padded_pack_holds_the_same_images_and_chooses_its_layout():
    images = _batch_images()
    packed, padded = _encode(images), _encode(images, pad=100.0)
    assert packed.stride == 0 and padded.stride == max(len(d) for _, d in images)
    assert [bytes(v) for v in padded.images()] == [bytes(v) for v in packed.images()] == [d for _, d in images]
    assert [bytes(padded.image(i)) for i in range(len(images))] == [d for _, d in images]
    assert torch.equal(padded.labels, packed.labels) and torch.equal(padded.valid, packed.valid)
    assert padded_stride(np.array([10, 10, 10]), 1.0) == 10  # equal sizes: padding is free
    assert padded_stride(np.array([10, 10, 50]), 2.0) == 0  # 150 bytes against 70: over 2x
    assert padded_stride(np.array([10, 10, 40]), 2.0) == 40  # 120 against 60: 2x
    assert padded_stride(np.array([10, 10, 40]), 0.0) == 0
    again = pickle.loads(pickle.dumps(annotate(padded, DecodeConfig())))  # what crosses from a worker
    assert again.stride == padded.stride and [bytes(v) for v in again.images()] == [d for _, d in images]


def _decoders():
    out = [pytest.param("pil", id="pil")]
    out.append(pytest.param("dali", id="dali", marks=pytest.mark.dali))
    return out


@pytest.mark.parametrize("backend", _decoders())
@pytest.mark.parametrize("resize", ["random_resized_crop", "shorter", "fixed"])
def test_columns_and_layout_change_nothing_a_decoder_delivers(backend, resize, device):
    """The same pixels, labels and skips whether the batch is packed or padded, annotated in a
    worker or not (on CUDA: DALI's ``mixed`` decode)."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs nvidia-dali")
    images = [(k, d) for k, d in _batch_images() if k != "bomb"]  # (a 65500² header is only refused)
    config = DecodeConfig(backend=backend, image_size=(24, 32), resize=resize, on_error="skip", num_threads=2, seed=9)
    results = []
    for form in ("bare", "padded", "annotated", "padded+annotated", "padded+garbage"):
        batch = _encode(images, pad=100.0 if "padded" in form else 0.0)
        if "garbage" in form:  # what a reused buffer holds past each image: another batch's bytes
            rows = batch.data.numpy()[:len(batch) * batch.stride].reshape(len(batch), batch.stride)
            filler = np.frombuffer(b"".join(d for _, d in images) * 2, dtype=np.uint8)
            for i, size in enumerate(batch.image_sizes().tolist()):
                rows[i, size:] = filler[i * 7:i * 7 + batch.stride - size]
        if "annotated" in form:
            batch = annotate(batch, config)
            assert batch.probed is not None and (batch.crops is not None) == (resize == "random_resized_crop")
        decoder = make_decoder(config, device)
        try:
            out = decoder.decode(batch)
        finally:
            decoder.close()
        results.append((form, out, decoder.stats.skipped, list(decoder.stats.skipped_keys)))
    _, first, skipped, keys = results[0]
    assert skipped > 0
    for form, out, n, k in results[1:]:
        assert torch.equal(out.images, first.images), form
        assert torch.equal(out.labels, first.labels) and torch.equal(out.valid, first.valid), form
        assert (n, k) == (skipped, keys), form


@pytest.mark.dali
@pytest.mark.gpu
def test_dali_mixed_decodes_padded_rows_uncut_as_it_decodes_them_cut(monkeypatch):
    """Owed on a GPU (benchmarks/gpu/README.md): the CPU decoders take a padded row whatever follows
    the image in it (``DaliDecoder._cuts`` is False there); does nvJPEG, its hardware decoder
    included? If this passes, ``_cuts`` can be False on a GPU too (fn.slice costs DALI's CPU threads)."""
    pytest.importorskip("nvidia.dali", reason="needs nvidia-dali")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpupipe.decode.dali import DaliDecoder

    images = [(f"n{i}", d) for i, d in enumerate(corpus.natural_jpegs(24, (300, 260)))]
    batch = _encode(images, pad=100.0)
    rows = batch.data.numpy()[:len(batch) * batch.stride].reshape(len(batch), batch.stride)
    filler = np.frombuffer(b"".join(d for _, d in images) * 2, dtype=np.uint8)
    for i, size in enumerate(batch.image_sizes().tolist()):
        rows[i, size:] = filler[i * 7:i * 7 + batch.stride - size]
    out = {}
    for cut in (True, False):
        monkeypatch.setattr(DaliDecoder, "_cuts", property(lambda self, cut=cut: cut))
        for load in (0.0, 1.0):  # nvJPEG's CUDA decoder, then the hardware decoder where there is one
            config = DecodeConfig(backend="dali", image_size=(64, 64), resize="shorter", hw_decoder_load=load)
            decoder = make_decoder(config, "cuda")
            try:
                out[cut, load] = decoder.decode(batch).images.cpu()
            finally:
                decoder.close()
    for load in (0.0, 1.0):
        assert torch.equal(out[True, load], out[False, load]), load


def test_crops_drawn_for_other_settings_are_not_used():
    """Boxes drawn in a worker for one seed (or epoch) are not taken by a decoder with another."""
    images = [(f"n{i}", d) for i, d in enumerate(corpus.natural_jpegs(8, (60, 50)))]
    made = DecodeConfig(backend="pil", image_size=(16, 16), resize="random_resized_crop", seed=1)
    other = dataclasses.replace(made, seed=2)
    batch = annotate(_encode(images), made)
    fresh = make_decoder(other, "cpu").decode(_encode(images))
    assert torch.equal(make_decoder(other, "cpu").decode(batch).images, fresh.images)
    assert not torch.equal(make_decoder(made, "cpu").decode(batch).images, fresh.images)


_STREAM_CHILD = r"""
import pickle, sys, torch
from gpupipe.decode import DecodeConfig, make_decoder
batches = pickle.load(open(sys.argv[1], "rb"))
config = DecodeConfig(backend="dali", num_threads=2, on_error="skip", image_size=(24, 24))
one = make_decoder(config, sys.argv[2])
alone = [one.decode(b) for b in batches]
ahead = make_decoder(config, sys.argv[2])
stream = list(ahead.decode_stream(iter(batches)))
for a, b in zip(alone, stream):
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels) and torch.equal(a.valid, b.valid)
assert (one.stats.skipped, one.stats.skipped_keys) == (ahead.stats.skipped, ahead.stats.skipped_keys)
broken = ahead.decode_stream(iter(batches))
next(broken)
broken.close()  # a pass broken off with a batch in flight
again = ahead.decode(batches[2])
assert torch.equal(again.images, alone[2].images), "a batch left in flight came out of a later decode"
print(len(stream), one.stats.skipped)
"""


def _damaged_png(seed: int) -> bytes:
    """A plain PNG whose compressed data is damaged, its CRC made right: it passes the gate and
    DALI fails on it (tests/decode/test_png_native.py)."""
    rng = np.random.default_rng(seed)
    data = corpus.png_bytes(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8), colour=2)
    at = data.index(b"IDAT") - 4
    length = struct.unpack_from(">I", data, at)[0]
    body = bytearray(data[at + 8:at + 8 + length])
    body[0:2] = b"\x00\x00"  # a bad zlib header
    import zlib

    chunk = struct.pack(">I", len(body)) + b"IDAT" + bytes(body) + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return data[:at] + chunk + data[at + 12 + length:]


def test_fed_ahead_is_batch_by_batch_also_when_dali_fails_in_between(tmp_path, device):
    """Four batches decoded ahead (batches i+1 and i+2 fed before batch i is taken) give what
    each decoded alone gives — with DALI failing on batch 1 (its pipeline is rebuilt while
    batches 2 and 3 were fed to the old one) — and a pass broken off leaves nothing for a later
    decode to find.
    In a child process: a native decoder's failure must not take the suite with it."""
    pytest.importorskip("nvidia.dali", reason="needs nvidia-dali")
    natural = corpus.natural_jpegs(12, (40, 30))
    batches = []
    for b in range(4):
        images = [(f"b{b}i{i}", natural[(b * 3 + i) % 12]) for i in range(5)]
        if b == 1:
            images[2] = ("damaged", _damaged_png(b))
        batches.append(annotate(_encode(images, pad=2.0), DecodeConfig(image_size=(24, 24))))
    path = tmp_path / "batches.pkl"
    path.write_bytes(pickle.dumps(batches))
    run = subprocess.run([sys.executable, "-c", _STREAM_CHILD, str(path), str(device)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    count, skipped = map(int, run.stdout.split()[-2:])
    assert count == 4 and skipped in (0, 1)  # Pillow may still read what DALI refused


@pytest.mark.dali
def test_a_delivered_batch_stays_intact_while_later_ones_are_decoded(device):
    """DALI's output is handed over without a copy (on the CPU where its executor reference-counts
    outputs; on CUDA through DLPack): batches kept by the consumer must not change while later
    batches are decoded."""
    pytest.importorskip("nvidia.dali", reason="needs nvidia-dali")
    natural = corpus.natural_jpegs(16, (40, 30))
    batches = [_encode([(f"b{b}i{i}", natural[(b * 4 + i) % 16]) for i in range(4)], pad=2.0) for b in range(4)]
    decoder = make_decoder(DecodeConfig(backend="dali", num_threads=2), device)
    kept = []
    for out in decoder.decode_stream(iter(batches * 3)):
        kept.append((out.images, out.images.clone()))
    assert all(torch.equal(images, copy) for images, copy in kept)
    assert not torch.equal(kept[0][1], kept[1][1])  # (distinct batches: a reused buffer would show)


@pytest.mark.dali
def test_a_batch_that_raises_leaves_nothing_fed_for_the_next_decode():
    """Under on_error "raise", a batch holding an image the gate sends to Pillow and Pillow
    refuses raises; the next decode (another batch size) gets its own pixels, not rows of the
    batch that raised (seen: validate's one-image decode after such a batch got 8 rows back)."""
    pytest.importorskip("nvidia.dali", reason="needs nvidia-dali")
    natural = corpus.natural_jpegs(8, (40, 30))
    at = natural[3].index(b"\xff\xc4") + 5  # a Huffman table's 16 code-length counts: all 0xFF
    bogus = natural[3][:at] + b"\xff" * 16 + natural[3][at + 16:]
    config = DecodeConfig(backend="dali", num_threads=2, image_size=(16, 16))
    decoder = make_decoder(config, "cpu")
    with pytest.raises(DecodeError, match="'bogus'"):
        decoder.decode(_encode([(f"n{i}", natural[i]) for i in range(3)] + [("bogus", bogus)], pad=2.0))
    alone = decoder.decode(_encode([("one", natural[5])]))
    fresh = make_decoder(config, "cpu").decode(_encode([("one", natural[5])]))
    assert alone.images.shape == (1, 3, 16, 16) and torch.equal(alone.images, fresh.images)
