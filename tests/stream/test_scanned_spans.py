"""Tar spans read by the vectorized scan give exactly the batches of the streaming reader.

The loader reads each planned span with :func:`gpupipe.formats.tarscan.scan_span` and falls
back to the streaming reader for anything the scan does not take. Forcing the fallback
everywhere (the scan patched to decline) must not change a single batch — bytes, keys, labels,
ids, valid flags — with blocks small enough that samples straddle block edges, nor what a
damaged shard gives (the damaged sample skipped and counted, never delivered).
"""
from __future__ import annotations

import numpy as np
import pytest

from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.writer import ShardSink
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.storage.fetch import FetchConfig
from gpupipe.stream import chunks
from gpupipe.stream.chunks import StreamConfig

N = 100


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "ds"
    with ShardSink(str(root), shard_size=30) as sink:
        for i in range(N):
            sink.write(f"s{i:04d}", {"jpg": rng.integers(0, 256, 300 + 97 * (i % 13), dtype=np.uint8).tobytes(),
                                     "cls": str(i % 7).encode()})
    return root


def _batches(url: str, **kw) -> list[tuple]:
    stream = StreamConfig(shuffle_buffer=48, fetch=FetchConfig(block_bytes=4096, refetch=1))
    loader = EncodedLoader(url, batch_size=8, num_workers=0, rank=0, world_size=1, stream=stream, **kw)
    out = [(bytes(b.data.numpy()), b.offsets.tolist(), b.labels.tolist(), b.sample_ids.tolist(), b.valid.tolist(),
            b.keys) for b in loader]
    return out + [("skipped", loader.stats.skipped)]


def _slow(monkeypatch) -> None:
    monkeypatch.setattr(chunks, "scan_span", lambda *a, **k: None)


@pytest.mark.parametrize("drop_last", [True, False])
def test_scan_and_streaming_reader_give_the_same_batches(shards, monkeypatch, drop_last):
    fast = _batches(str(shards), drop_last=drop_last, seed=3)
    assert len(fast) > 1 and fast[-1] == ("skipped", 0)
    _slow(monkeypatch)
    assert _batches(str(shards), drop_last=drop_last, seed=3) == fast


def test_damaged_image_is_skipped_alike(shards, monkeypatch):
    entry = Manifest.from_json((shards / MANIFEST_NAME).read_text()).shards[1]
    shard = shards / entry.name
    data = bytearray(shard.read_bytes())
    data[int(entry.offsets[2]) + 512 + 50] ^= 0xFF  # inside the image of the shard's third sample
    shard.write_bytes(bytes(data))
    fast = _batches(str(shards), on_error="skip", seed=1)
    assert fast[-1] == ("skipped", 1)
    _slow(monkeypatch)
    assert _batches(str(shards), on_error="skip", seed=1) == fast
