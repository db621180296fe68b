"""A shard must never be a way into the machine (issue 7, the parts outside the YAML config).

Through the whole pipeline (EncodedLoader with and without workers, GpuLoader with the
Pillow decoder, ``gpupipe index`` and ``inspect``), not only the tar parser
(tests/formats/test_tar.py has the parser-level checks): pickles are never loaded, member names
never become paths, compressed shards (gzip bombs) are refused before anything is
inflated, images declaring 65500x65500 never reach a decoder, ``pipe:`` URLs never run,
and a secret in ``storage_options`` shows up in no log line, error or repr.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import struct
import tarfile
import time
import tracemalloc
import zlib

import numpy as np
import pytest
from datagen import ids_of, write_dataset
from s3util import storage_options_via

from gpupipe import GpuLoader
from gpupipe.core.errors import ConfigError, ShardFormatError, StorageError
from gpupipe.formats.writer import ShardSink
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index
from gpupipe.prepare.ingest import ingest
from gpupipe.sources.source import Source, resolve
from gpupipe.storage.fetch import FetchConfig
from gpupipe.tools.sourceinfo import inspect
from gpupipe.tools.synth import synthetic_jpeg

SECRET = "sentinel-secret-7c1f0e"


class _Marker:
    """Unpickling this creates a folder: proof that something was deserialised."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _walk(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files + dirs)


# ---------------------------------------------------------------- pickles


@pytest.mark.parametrize("workers", [0, 2])
def test_pickle_members_are_never_loaded_by_the_pipeline(tmp_path, workers):
    marker = tmp_path / "unpickled"
    bomb = pickle.dumps(_Marker(str(marker)))
    rng = np.random.default_rng(0)
    with ShardSink(str(tmp_path / "ds"), shard_size=8) as sink:
        for i in range(24):
            sink.write(f"s{i:03d}", {"jpg": synthetic_jpeg(rng, (32, 32)), "cls": b"1",
                                     "pkl": bomb, "pth": bomb, "pyd": bomb, "pickle": bomb})
    url = str(tmp_path / "ds")
    loader = EncodedLoader(url, batch_size=4, num_workers=workers, rank=0, world_size=1)
    assert sum(len(b) for b in loader) == 24
    gpu = GpuLoader(url, batch_size=4, image_size=(16, 16), decode="pil", device="cpu", num_workers=workers,
                    rank=0, world_size=1)
    assert sum(len(labels) for _, labels in gpu) == 24
    index(url, progress=False)
    assert "pkl" in inspect(url)["fields"]
    assert not marker.exists()
    pickle.loads(bomb)  # the payload is live: loading it is what would have made the marker
    assert marker.exists()


# ---------------------------------------------------------------- member names never become paths


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _info(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_path_tricks_are_never_written_anywhere(tmp_path, monkeypatch):
    escape = tmp_path / "escape-target"
    tricks = {
        "dotdot": _info("../../evil-dotdot.jpg"),
        "absolute": _info(str(escape / "evil-abs.jpg")),
        "symlink": _info("evil-link.jpg", tarfile.SYMTYPE, str(escape / "linked")),
        "hardlink": _info("evil-hard.jpg", tarfile.LNKTYPE, "good.jpg"),
        "chardev": _info("evil-dev.jpg", tarfile.CHRTYPE),
        "fifo": _info("evil-fifo.jpg", tarfile.FIFOTYPE),
    }
    shards = tmp_path / "shards"
    shards.mkdir()
    for name, info in tricks.items():
        good = [(_info(f"{name}-{k}.{ext}"), data) for k in ("ok", "cut")
                for ext, data in (("jpg", b"\xff\xd8\xff" + bytes(9)), ("cls", b"3"))]
        # "-ok" is complete before the bad header; "-cut" is still open there and is lost with it
        (shards / f"{name}.tar").write_bytes(_tar(good + [(info, b"\xff\xd8\xffevil")]))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    urls = sorted(str(p) for p in shards.glob("*.tar"))
    stream = StreamConfig(on_error="skip", fetch=FetchConfig(cache_dir=str(tmp_path / "cache")))
    for workers in (0, 2):
        loader = EncodedLoader(urls, batch_size=1, num_workers=workers, rank=0, world_size=1, drop_last=False,
                               stream=stream)
        assert sorted(k for b in loader for k in b.keys) == sorted(f"{n}-ok" for n in tricks)
    with pytest.raises(ShardFormatError, match="not allowed|unsafe member name"):
        list(EncodedLoader(urls, batch_size=1, num_workers=0, rank=0, world_size=1, drop_last=False))
    for url in urls:
        with pytest.raises(ShardFormatError):
            index([url], progress=False)
    assert not escape.exists()
    assert _walk(work) == []
    assert not [p for p in _walk(tmp_path) if "evil" in p or os.path.islink(tmp_path / p)]


# ---------------------------------------------------------------- compressed shards (gzip bombs)


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """gzip bytes (~250 KiB) inflating to 256 MiB of zeros, made in 1 MiB pieces."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([comp.compress(zeros) for _ in range(256)] + [comp.flush()])


@pytest.mark.parametrize("name", ["bomb.tar.gz", "bomb.tgz", "bomb.tar"])
def test_gzip_bomb_shard_is_refused_before_anything_is_inflated(tmp_path, name, gzip_bomb):
    (tmp_path / name).write_bytes(gzip_bomb)
    size = len(gzip_bomb)
    assert size < 1 << 20
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ShardFormatError, match=r"gzip-compressed; gpupipe reads uncompressed tar"):
            list(EncodedLoader([str(tmp_path / name)], batch_size=1, num_workers=0, rank=0, world_size=1))
        with pytest.raises(ShardFormatError, match=r"gzip-compressed"):
            index([str(tmp_path / name)], progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 10
    assert peak < 16 * size  # the compressed bytes, a few times over; never the 256 MiB


# ---------------------------------------------------------------- images declaring 65500 x 65500


def _declares(data: bytes, fmt: str, side: int = 65500) -> bytes:
    if fmt == "jpg":
        at = data.index(b"\xff\xc0") + 5  # SOF0: marker, length, precision, then height and width
        return data[:at] + struct.pack(">HH", side, side) + data[at + 4:]
    ihdr = b"IHDR" + struct.pack(">II", side, side) + data[24:29]
    return data[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def _png(rng) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["jpg", "png"])
def test_pixel_bomb_never_reaches_a_decoder(tmp_path, monkeypatch, fmt, caplog):
    import gpupipe.decode.pil as pil

    rng = np.random.default_rng(1)
    with ShardSink(str(tmp_path / "ds"), shard_size=8) as sink:
        for i in range(8):
            data = synthetic_jpeg(rng, (24, 24)) if fmt == "jpg" else _png(rng)
            sink.write(f"s{i}", {fmt: _declares(data, fmt) if i == 5 else data, "cls": b"0"})
    seen: list[bytes] = []
    real = pil.decode_one
    monkeypatch.setattr(pil, "decode_one", lambda data, *a: seen.append(bytes(data)) or real(data, *a))
    loader = GpuLoader(str(tmp_path / "ds"), batch_size=8, image_size=(16, 16), decode="pil", device="cpu",
                       num_workers=0, rank=0, world_size=1, on_error="skip")
    batches = list(loader)
    assert len(seen) == 7 and not any(struct.pack(">HH", 65500, 65500) in s or
                                      struct.pack(">II", 65500, 65500) in s for s in seen)
    assert loader.stats.skipped == 1 and "s5" in caplog.text and "65500x65500" in caplog.text
    assert int(batches[0].valid.sum()) == 7


# ---------------------------------------------------------------- pipe: URLs


def test_pipe_urls_are_refused_at_every_entry_point(tmp_path):
    marker = tmp_path / "ran"
    url = f"pipe:touch {marker}"
    calls = [
        lambda: EncodedLoader(url, batch_size=1, rank=0, world_size=1),
        lambda: EncodedLoader([str(tmp_path / "a.tar"), url], batch_size=1, rank=0, world_size=1),
        lambda: GpuLoader(url, batch_size=1, decode="pil", device="cpu", rank=0, world_size=1),
        lambda: resolve(Source(url)),
        lambda: index(url, progress=False),
        lambda: ingest(url, str(tmp_path / "out"), progress=False),
        lambda: inspect(url),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match="pipe: URLs .*are refused"):
            call()
    assert not marker.exists()


# ---------------------------------------------------------------- secrets


def test_secret_appears_in_no_log_error_or_repr(s3_bucket, s3_proxy, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, botocore and s3fs included
    bucket = dataclasses.replace(s3_bucket, secret=SECRET)  # the server accepts any secret
    write_dataset(bucket.url("ds"), [20, 0, 13], storage_options=bucket.storage_options, manifest=False)
    index(bucket.url("ds/"), storage_options=bucket.storage_options, progress=False)
    proxy = s3_proxy(fault_rate=0.2, faults=("slowdown", "reset", "flip", "truncate"), seed=4)
    opts = storage_options_via(proxy, bucket)
    fetch = FetchConfig(block_bytes=2048, backoff_s=0.001, retries=20)
    loader = EncodedLoader(bucket.url("ds/"), batch_size=4, num_workers=0, storage_options=opts, rank=0,
                           world_size=1, drop_last=False, stream=StreamConfig(fetch=fetch))
    assert sorted(i for b in loader for i in ids_of(b)) == list(range(33))
    texts = [repr(loader.source), repr(loader.stream), repr(loader.state_dict()), repr(loader._dataset()),
             repr(Source(bucket.url("ds/"), opts)), caplog.text]
    proxy.faults, proxy.fault_rate = ("forbidden",), 1.0
    for make in (lambda: EncodedLoader(bucket.url("ds/"), batch_size=4, storage_options=opts, rank=0, world_size=1),
                 lambda: list(loader)):
        with pytest.raises(StorageError) as info:
            make()
        texts += [str(info.value), repr(info.value), repr(info.value.__cause__)]
    texts.append(caplog.text)
    assert caplog.text.count("retrying") > 0  # the DEBUG lines were really there
    assert not [t for t in texts if SECRET in t]
