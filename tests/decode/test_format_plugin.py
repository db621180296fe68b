"""An image format and its decoder from outside the package, in this one module (issue 37): a
folder of ``.npy`` arrays (``<class>/<name>.npy``) registered as an image format (magic bytes,
extension, header parser) and a decode backend, then read in place and from shards by
``GpuLoader`` and trained on — no edit inside gpupipe/. The gate holds for it as for built-in
formats: a cut file or a bad header is refused by name."""
from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpupipe
from gpupipe import GpuLoader
from gpupipe.core.errors import DecodeError
from gpupipe.decode.base import DecodedBatch, DecodeStats
from gpupipe.decode.common import StandIn, account, assemble, prepare
from gpupipe.decode.settings import _BACKENDS, BackendSpec, register_backend
from gpupipe.formats import imageheader
from gpupipe.formats.imageheader import ImageFormat, ImageHeader, check_complete, probe, register_image_format

MAGIC = b"\x93NUMPY"


def npy_header(view: memoryview) -> ImageHeader:
    """The shape an ``.npy`` file declares: (H, W) or (H, W, C) uint8, C 1 or 3."""
    f = io.BytesIO(bytes(view[:4096]))
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if dtype != np.uint8 or fortran or len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3)):
        raise DecodeError(f"npy: not an (H, W[, 1|3]) uint8 C-order array: {shape} {dtype}")
    return ImageHeader("npy", width=int(shape[1]), height=int(shape[0]), channels=1 if len(shape) == 2 else shape[2],
                       scan=f.tell())


def npy_complete(view: memoryview, header: ImageHeader) -> None:
    if len(view) < header.scan + header.width * header.height * header.channels:
        raise DecodeError(f"npy: {len(view)} bytes, cut short (the header declares {header.height}x{header.width})")


class NpyDecoder:
    """The plugin's decode backend: the gate's checks (``prepare``), then each array resized."""

    name = "npy"

    def __init__(self, config, device: torch.device):
        self.config, self.device, self.stats, self._stand_in = config, device, DecodeStats(), StandIn()

    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        checked, _ = prepare(batch, self.config, self.stats)
        pixels = {}
        for i in checked.good():
            a = np.load(io.BytesIO(bytes(batch.image(i))))
            a = np.repeat(a[..., None] if a.ndim == 2 else a, 3 // (a.shape[-1] if a.ndim == 3 else 1), axis=-1)
            x = torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None].float()
            size = self.config.resize_to or tuple(a.shape[:2])
            pixels[i] = torch.nn.functional.interpolate(x, size=size, mode="nearest")[0].permute(1, 2, 0).to(torch.uint8)
        out = assemble(pixels, checked, batch, self.device, self.config.image_size, self._stand_in)
        account(self.stats, batch, t0)
        return out

    def close(self) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def npy_plugin():
    formats, backends = dict(imageheader._FORMATS), dict(_BACKENDS)
    register_image_format(ImageFormat("npy", ("npy",), lambda head: head.startswith(MAGIC), npy_header, npy_complete))
    register_backend(BackendSpec("npy", f"{__name__}:NpyDecoder", "numpy", "numpy", "", ("cpu", "cuda"),
                                 on_host=True, native=False))
    yield
    imageheader._FORMATS.clear()
    for f in formats.values():  # the built-in formats again, and the extension lists with them
        register_image_format(f)
    _BACKENDS.clear()
    _BACKENDS.update(backends)


def _array(i: int) -> np.ndarray:
    return np.full((6 + i % 3, 8, 3), 10 * i, dtype=np.uint8)  # image i: one grey level, 10 * i


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("npy") / "train"
    for i in range(12):
        path = root / ("even" if i % 2 == 0 else "odd") / f"a{i:02d}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, _array(i))
    return root


def _check(batches) -> int:
    seen = 0
    for batch in batches:
        assert batch.images.shape[1:] == (3, 4, 4)
        for image, key, label in zip(batch.images, batch.keys, batch.labels.tolist()):
            i = int(key.rsplit("a", 1)[1])
            assert label == i % 2 and torch.all(image == 10 * i), key  # even, odd: classes by folder name
            seen += 1
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_folder_of_npy_arrays_trains_through_gpu_loader_in_place_and_from_shards(folder, tmp_path, workers,
                                                                                   train_steps):
    loader = GpuLoader(str(folder), batch_size=4, image_size=4, resize="fixed", decode="npy", device="cpu",
                       num_workers=workers, seed=1)
    assert _check(loader) == 12
    report = gpupipe.ingest(str(folder), str(tmp_path / "shards"), shard_size=5, progress=False)
    assert (report.num_samples, report.skipped) == (12, [])
    from_shards = GpuLoader(str(tmp_path / "shards"), batch_size=4, image_size=4, resize="fixed", decode="npy",
                            device="cpu", num_workers=workers, seed=1)
    assert _check(from_shards) == 12
    assert torch.isfinite(train_steps(from_shards))


def test_the_gate_holds_for_a_plugin_format(folder, tmp_path):
    bad = tmp_path / "bad"
    for name, data in {"ok/a00.npy": (folder / "even" / "a00.npy").read_bytes(),
                       "ok/a02.npy": (folder / "even" / "a02.npy").read_bytes(),
                       "cut/a04.npy": (folder / "even" / "a04.npy").read_bytes()[:-20],
                       "float/a06.npy": _npy(np.zeros((4, 4), np.float32))}.items():
        (bad / name).parent.mkdir(parents=True, exist_ok=True)
        (bad / name).write_bytes(data)
    with pytest.raises(DecodeError, match="cut short|not an .H, W"):
        list(GpuLoader(str(bad), batch_size=4, image_size=4, resize="fixed", decode="npy", device="cpu",
                       num_workers=0, drop_last=False))
    loader = GpuLoader(str(bad), batch_size=4, image_size=4, resize="fixed", decode="npy", device="cpu",
                       num_workers=0, on_error="skip", drop_last=False)
    batch = next(iter(loader))
    assert sorted(k for k, v in zip(batch.keys, batch.valid.tolist()) if v) == ["ok/a00", "ok/a02"]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_plugin_parser_on_mutated_bytes_only_ever_refuses_with_a_decode_error(data):
    """The plugin's own parser raises what numpy raises (ValueError, SyntaxError, EOFError, ...) on
    damaged headers; the registry turns each into a DecodeError naming the format, as the gate
    needs (a worker must count or raise it, never die of it)."""
    raw = bytearray(_npy(_array(data.draw(st.integers(0, 11)))))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, min(len(raw), 140) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    raw = raw[:data.draw(st.integers(1, len(raw)))]
    try:
        check_complete(bytes(raw), probe(bytes(raw)))
    except DecodeError as e:
        assert str(e)
