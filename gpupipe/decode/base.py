"""The decode stage's values: how to decode (:class:`DecodeConfig`), what comes out
(:class:`DecodedBatch`), what it counted (:class:`DecodeStats`) and what a backend is
(:class:`Decoder`), and what the shared decode steps (:mod:`gpupipe.decode.common`) ask of the
targets of a batch (:class:`TargetRows`, made by :mod:`gpupipe.decode.targets`). Every backend
imports these from here; :mod:`gpupipe.decode` picks one."""
from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Protocol

import numpy as np
import torch

from gpupipe.core.errors import ConfigError
from gpupipe.core.targets import Targets
from gpupipe.core.types import ErrorPolicy
from gpupipe.formats.imageheader import MAX_PIXELS

__all__ = ["ResizeMode", "DecodeConfig", "DecodedBatch", "DecodeStats", "Decoder", "BACKENDS", "BackendSpec",
           "register_backend", "RowTargets", "TargetRows"]


@dataclass(frozen=True)
class BackendSpec:
    """What a decode backend is, in one record: its name (``decode.backend``), its class
    (``"module:Class"``, imported on first use), the library it needs (the module looked for, the
    pip package and gpupipe's extra that bring it), the device types it decodes on, whether it
    decodes in the host's memory (the loader then counts the decode as CPU work), whether it is
    native code that could take the process down on hostile bytes (``gpupipe validate`` then runs
    it in a child process), what it imports on its first batch beyond its module (imported ahead by
    :func:`gpupipe.decode.preload`), and its place in ``auto``'s order (lower first)."""

    name: str
    decoder: str
    module: str
    package: str
    extra: str
    devices: tuple[str, ...]
    on_host: bool
    native: bool
    first_use: tuple[str, ...] = ()
    rank: int = 100


_BACKENDS: dict[str, BackendSpec] = {}
BACKENDS = MappingProxyType(_BACKENDS)  # name -> its BackendSpec, in auto's order


def register_backend(spec: BackendSpec) -> None:
    """Make ``spec`` a ``decode.backend`` (a name already taken is replaced)."""
    _BACKENDS[spec.name] = spec
    ordered = sorted(_BACKENDS.values(), key=lambda s: s.rank)
    _BACKENDS.clear()
    _BACKENDS.update((s.name, s) for s in ordered)


for _spec in (
    # DALI's Python side is 0.3-0.45 s of CPU to import (its operator registry): ahead, not inside an epoch
    BackendSpec("dali", "gpupipe.decode.dali:DaliDecoder", "nvidia.dali", "nvidia-dali", "dali", ("cuda", "cpu"),
                on_host=False, native=True, first_use=("nvidia.dali.fn", "nvidia.dali.types", "nvidia.dali.pipeline"),
                rank=0),
    BackendSpec("nvjpeg", "gpupipe.decode.nvjpeg:NvjpegDecoder", "torchvision", "torchvision", "nvjpeg", ("cuda",),
                on_host=False, native=True, first_use=("torchvision.io",), rank=1),
    BackendSpec("pil", "gpupipe.decode.pil:PilDecoder", "PIL", "Pillow", "pil", ("cuda", "cpu"), on_host=True,
                native=False, first_use=("PIL.Image", "PIL.ImageOps"), rank=2),
):
    register_backend(_spec)


class ResizeMode(str, Enum):
    NONE = "none"  # keep decoded sizes (the batch must then be all one size)
    FIXED = "fixed"  # resize to image_size exactly (aspect ratio not kept), like Resize((h, w))
    SHORTER = "shorter"  # shorter side to image_size's, then centre crop, like Resize(s) + CenterCrop
    RANDOM_CROP = "random_resized_crop"  # torchvision RandomResizedCrop(image_size, scale, ratio)


@dataclass(frozen=True)
class DecodeConfig:
    """How images are decoded. ``image_size`` is (height, width)."""

    backend: str = "auto"
    image_size: tuple[int, int] | None = None
    resize: ResizeMode = ResizeMode.FIXED
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    on_error: ErrorPolicy = ErrorPolicy.RAISE
    max_pixels: int | None = MAX_PIXELS
    num_threads: int | None = None
    hw_decoder_load: float = 0.9
    fancy_upsampling: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name, kind in (("resize", ResizeMode), ("on_error", ErrorPolicy)):
            try:
                object.__setattr__(self, name, kind(getattr(self, name)))
            except ValueError:
                choices = ", ".join(repr(k.value) for k in kind)
                raise ConfigError(f"decode.{name}: {getattr(self, name)!r} is not one of {choices}") from None
        if self.backend not in ("auto", *BACKENDS):
            raise ConfigError(f"decode.backend: unknown {self.backend!r}; choose from auto, {', '.join(BACKENDS)}")
        if self.image_size is not None:
            size = tuple(int(s) for s in self.image_size)
            if len(size) != 2 or min(size) < 1:
                raise ConfigError(f"decode.image_size: expected (height, width) > 0, got {self.image_size!r}")
            object.__setattr__(self, "image_size", size)
        elif self.resize in (ResizeMode.SHORTER, ResizeMode.RANDOM_CROP):
            raise ConfigError(f"decode.resize: {self.resize.value!r} needs decode.image_size (the output size)")
        else:  # the default resize without a size: keep decoded sizes
            object.__setattr__(self, "resize", ResizeMode.NONE)
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            raise ConfigError(f"decode.scale: expected 0 < min <= max <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"decode.ratio: expected 0 < min <= max, got {self.ratio}")
        if not 0.0 <= self.hw_decoder_load <= 1.0:
            raise ConfigError(f"decode.hw_decoder_load: expected within [0, 1], got {self.hw_decoder_load}")

    @property
    def resize_to(self) -> tuple[int, int] | None:
        """The (height, width) images are resized to: ``image_size``, or ``None`` under resize
        ``none`` (every other mode has an ``image_size``: ``__post_init__`` makes sure)."""
        return None if self.resize is ResizeMode.NONE else self.image_size


@dataclass
class DecodedBatch:
    """Decoded images and what travels with them.

    Shape: ``images`` (B, 3, H, W) uint8, channels_last, on the decoder's device;
    ``labels``, ``sample_ids`` (B,) int64; ``valid`` (B,) bool — False for padding
    and for images replaced because they could not be decoded.
    ``targets`` (:class:`~gpupipe.core.targets.Targets`): the boxes and masks of a source
    with targets, moved with the decode's crop and resize (``None`` without).
    ``images, labels = batch`` unpacks the two a training loop needs; with targets,
    ``images, targets = batch`` gives torchvision's per-image dicts (``targets.per_image()``).
    It indexes as that pair too (what a DataLoader's batch is): ``batch[0]`` the images,
    ``batch[1]`` (and ``batch[-1]``) the labels or per-image targets, ``batch[:2]`` both.
    ``len(batch)`` is still the number of samples (B), not 2.
    """

    images: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    sample_ids: torch.Tensor
    keys: tuple[str, ...]
    epoch: int = 0
    targets: Targets | None = None

    def __iter__(self) -> Iterator:
        yield self.images
        yield self.labels if self.targets is None else self.targets.per_image()

    def __getitem__(self, index: int | slice):
        """``tuple(batch)[index]``: ``batch[0]`` the images, ``batch[1]`` the labels (with targets,
        the per-image dicts); a slice gives a tuple of them."""
        if isinstance(index, slice):
            return tuple(self)[index]
        if isinstance(index, bool) or not hasattr(index, "__index__") or not -2 <= operator.index(index) <= 1:
            raise IndexError(f"a batch indexes as the pair it unpacks to, (images, labels): 0 or 1 (or -2, -1), got "
                             f"{index!r}; batch.images[i] is image i and batch.keys[i] its key")
        if operator.index(index) in (0, -2):
            return self.images
        return self.labels if self.targets is None else self.targets.per_image()

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class DecodeStats:
    batches: int = 0
    images: int = 0
    skipped: int = 0
    seconds: float = 0.0
    skipped_keys: list[str] = field(default_factory=list)
    stretched: int = 0  # images whose aspect ratio resize "fixed" changed (common.count_stretched)
    worst_stretch: float = 1.0  # the largest such change: 1.33 is a 4:3 image made square
    # warn the first time images are stretched; False for a decode that is no one's training input
    # (`gpupipe validate` decodes to 8x8 to check every image in full: its stretch is its own business)
    warn_stretched: bool = True


class Decoder(Protocol):
    name: str
    device: torch.device
    stats: DecodeStats

    def decode(self, batch) -> DecodedBatch: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RowTargets:
    """One image's targets in the output frame: (n, 4) float32 boxes and (n,) int64 labels
    (None without boxes), an (H, W) uint8 mask (None without masks)."""

    boxes: np.ndarray | None
    labels: np.ndarray | None
    mask: np.ndarray | None


class TargetRows(Protocol):
    """The targets of one batch on their way through a decode, as :func:`~gpupipe.decode.common.finish`
    uses them (:class:`gpupipe.decode.targets.TargetJob` is the one there is): ``settle`` waits for what is
    still decoding (a bad mask makes its sample bad in the ``checked`` verdict), ``row(i)`` is image ``i``'s
    targets in the output frame, ``gather(rows, stand_in, device)`` row ``i``'s of image ``rows[i]`` (the
    ``stand_in``'s where None)."""

    def settle(self, checked) -> None: ...

    def row(self, i: int) -> RowTargets: ...

    def gather(self, rows: Sequence[int | None], stand_in: RowTargets | None, device: torch.device) -> Targets: ...
