"""The "pure DALI" reference: shards → decode → the transform set, all in one DALI pipeline.

``fn.readers.webdataset`` reads the same tar shards (shuffled with a 1,024-sample
buffer), ``fn.decoders.image`` decodes (``mixed``: nvJPEG on a GPU; the CPU decoder
with ``device_id=None`` without one), ``fn.resize`` scales to the output size, and
DALI's own operators run the steps: ``RandomAffine``/``RandomRotation`` (degrees
only) → ``fn.rotate`` (nearest, torchvision's default), flips → ``fn.flip`` with
``fn.random.coin_flip``, ``RandomPerspective`` → ``fn.experimental.warp_perspective``
with per-sample matrices drawn like torchvision's, ``ColorJitter`` →
``fn.color_twist`` (fixed order: DALI has no random order), and
``ToDtype``/``RepeatChannels``/``Normalize`` → one ``fn.crop_mirror_normalize``
(the decoder already gives 3 channels). ``workers`` is DALI's thread count.
"""
from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from gpupipe.augment.warp import check_interpolation
from gpupipe.tools.bench.steps import Step, check_supported

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

__all__ = ["DALI_SUPPORTED", "check_dali", "write_index", "dali_batches"]

DALI_SUPPORTED = ("Resize", "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip",
                  "RandomPerspective", "ColorJitter", "ToDtype", "ToTensor", "RepeatChannels", "Normalize")


def check_dali(steps: Iterable[Step]) -> None:
    steps = tuple(steps)
    check_supported(steps, DALI_SUPPORTED, who="the dali baseline")
    for i, (name, args) in enumerate(steps):
        if name == "RandomAffine" and any(args.get(k) is not None for k in ("translate", "scale", "shear")):
            from gpupipe.core.errors import ConfigError

            raise ConfigError(f"augment[{i}]: the dali baseline runs RandomAffine(degrees) only; "
                              "translate/scale/shear are not mapped (leave dali out of --compare)")


class _PerspectiveMatrices:
    """Per-sample 3×3 output→input homographies, torchvision's RandomPerspective draw
    (identity with probability 1 - p); an ``external_source`` callable (sample mode)."""

    def __init__(self, size: tuple[int, int], distortion_scale: float, p: float, seed: int):
        self.size, self.scale, self.p, self.seed = size, distortion_scale, p, seed

    def __call__(self, info) -> np.ndarray:
        from gpupipe.tools.bench.persample import perspective_coeffs

        rng = np.random.default_rng([self.seed, info.iteration, info.idx_in_batch])
        if rng.random() >= self.p:
            return np.eye(3, dtype=np.float32)
        h, w = self.size
        dw, dh = int(self.scale * (w // 2)), int(self.scale * (h // 2))
        r = [int(v) for v in rng.integers(0, [dw + 1, dh + 1] * 4)]
        start = [(0, 0), (w - 1, 0), (w - 1, h - 1), (0, h - 1)]
        end = [(r[0], r[1]), (w - 1 - r[2], r[3]), (w - 1 - r[4], h - 1 - r[5]), (r[6], h - 1 - r[7])]
        return np.array([*perspective_coeffs(end, start), 1.0], np.float32).reshape(3, 3)


def _interp_type(interpolation):
    """DALI's interp_type for a torchvision ``interpolation`` (name, mode or Pillow code)."""
    from nvidia.dali import types

    name = check_interpolation(interpolation)
    modes = types.DALIInterpType
    return {"nearest": modes.INTERP_NN, "bilinear": modes.INTERP_LINEAR, "bicubic": modes.INTERP_CUBIC}[name]


def _apply(img, name: str, args: dict, size: tuple[int, int], seed: int):
    """One step as DALI operators (``size``: the current (height, width))."""
    from nvidia.dali import fn, types

    if name == "Resize":
        s = args["size"]
        return fn.resize(img, size=list(s) if not isinstance(s, int) else None,
                         resize_shorter=s if isinstance(s, int) else None, antialias=True)
    if name in ("RandomAffine", "RandomRotation"):
        d = args["degrees"]
        lo, hi = (-d, d) if isinstance(d, (int, float)) else d
        return fn.rotate(img, angle=fn.random.uniform(range=(lo, hi)), keep_size=True, fill_value=0,
                         interp_type=_interp_type(args.get("interpolation", "nearest")))
    if name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        coin = fn.random.coin_flip(probability=args.get("p", 0.5), dtype=types.DALIDataType.INT32)
        return fn.flip(img, horizontal=coin, vertical=0) if "Horizontal" in name else fn.flip(img, horizontal=0,
                                                                                              vertical=coin)
    if name == "RandomPerspective":
        m = fn.external_source(source=_PerspectiveMatrices(size, args.get("distortion_scale", 0.5),
                                                           args.get("p", 0.5), seed), batch=False)
        return fn.experimental.warp_perspective(img, matrix=m, fill_value=0,
                                                interp_type=_interp_type(args.get("interpolation", "bilinear")))
    if name == "ColorJitter":
        def factor(v, centre=1.0, unit=1.0):
            return fn.random.uniform(range=(max(0.0, centre - v) * unit, (centre + v) * unit))

        b, c, s, h = (float(args.get(k, 0) or 0) for k in ("brightness", "contrast", "saturation", "hue"))
        return fn.color_twist(img, brightness=factor(b), contrast=factor(c), saturation=factor(s),
                              hue=fn.random.uniform(range=(-h * 360, h * 360)))
    return img  # the tensor tail is handled by _tail


def _tail(img, steps: tuple[Step, ...]):
    """ToDtype + Normalize (+ the layout change) as one crop_mirror_normalize."""
    from nvidia.dali import fn, types

    names = [n for n, _ in steps]
    if not {"ToDtype", "ToTensor", "Normalize"} & set(names):
        return fn.transpose(img, perm=[2, 0, 1])
    mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    for name, args in steps:
        if name == "Normalize":
            mean, std = list(args["mean"]), list(args["std"])
    return fn.crop_mirror_normalize(img, dtype=types.DALIDataType.FLOAT, output_layout="CHW", mean=[m * 255 for m in mean],
                                    std=[s * 255 for s in std])


def write_index(shards: Iterable[str], folder: str) -> list[str]:
    """DALI's webdataset index (format v1.2: per sample, ``ext offset size name`` for each
    member) for each local shard, written under ``folder``; returns their paths. With
    them the reader starts at once instead of scanning the tars on every build."""
    import os
    import tarfile

    paths = []
    for n, shard in enumerate(shards):
        samples: dict[str, list[str]] = {}
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.isfile():
                    samples.setdefault(m.name.partition(".")[0], []).append(
                        f"{m.name.partition('.')[2]} {m.offset_data} {m.size} {m.name}")
        path = os.path.join(folder, f"{n:06d}.idx")
        with open(path, "w") as f:
            f.write(f"v1.2 {len(samples)}\n" + "".join(" ".join(v) + "\n" for v in samples.values()))
        paths.append(path)
    return paths


def _pipeline(shards: list[str], index: list[str], steps: tuple[Step, ...], *, image_size, batch_size: int,
              threads: int, gpu: bool, seed: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, seed=seed, prefetch_queue_depth=2,
                  # None (CPU only) is what DALI's docs and code take; its overload's annotation says int
                  device_id=0 if gpu else None)  # type: ignore[arg-type]
    def pipe():
        read = fn.readers.webdataset(paths=shards, index_paths=index, ext=["jpg", "cls"], random_shuffle=True,
                                     initial_fill=1024, missing_component_behavior="skip", name="reader")
        jpegs, labels = cast("Sequence[DataNode]", read)  # one output per ext (the stub says "any node(s)")
        img = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.DALIImageType.RGB)
        size = tuple(image_size)
        out = fn.resize(img, size=list(size), antialias=True, interp_type=types.DALIInterpType.INTERP_LINEAR)
        for name, args in steps:
            out = _apply(out, name, dict(args), size, seed)
            if name == "Resize" and not isinstance(args["size"], int):
                size = tuple(args["size"])
        return _tail(out, steps), labels

    p = pipe()
    p.build()
    return p


def dali_batches(shards: list[str], index: list[str], steps: Iterable[Step], *, image_size: tuple[int, int],
                 batch_size: int, threads: int, device, seed: int = 0) -> Generator[int, None, None]:
    """Yield the size of each batch, forever (the reader wraps around epochs); each batch
    is handed to torch like gpupipe's (a copy on the CPU, the device tensor on a GPU)."""
    import torch

    steps = tuple(steps)
    check_dali(steps)
    gpu = torch.device(device).type == "cuda"
    pipe = _pipeline(shards, index, steps, image_size=image_size, batch_size=batch_size, threads=max(1, threads),
                     gpu=gpu, seed=seed)
    try:
        while True:
            images, _ = pipe.run()
            out = _to_torch(images.as_tensor(), gpu)
            yield int(out.shape[0])
    finally:
        del pipe


def _to_torch(dense, gpu: bool):
    """The batch as a torch tensor: a copy on the CPU (DALI reuses its buffer), zero-copy
    DLPack on the GPU, or the DALI plugin's copy where this DALI has no DLPack export."""
    import torch

    if not gpu:
        return torch.from_numpy(np.array(dense))
    try:
        return torch.from_dlpack(dense)
    except (TypeError, AttributeError, RuntimeError):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        dtype = torch.float32 if "FLOAT" in str(dense.dtype) else torch.uint8
        out = torch.empty(dense.shape(), dtype=dtype, device="cuda")
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream())
        return out
