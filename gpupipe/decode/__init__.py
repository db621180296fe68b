"""Decode batches of encoded images into uint8 tensors on the device.

``make_decoder(config, device)`` returns a :class:`Decoder` for one backend:

* ``dali`` — an NVIDIA DALI pipeline fed by ``external_source``: nvJPEG (``mixed``,
  with the A100/H100/H200 hardware decoder through ``hw_decoder_load``) on a GPU,
  DALI's CPU decoders (``device_id=None``) without one;
* ``nvjpeg`` — ``torchvision.io.decode_jpeg(device="cuda")`` where torchvision is
  installed and DALI is not;
* ``pil`` — Pillow, the reference;
* ``auto`` — DALI on a GPU, else nvjpeg on a GPU, else DALI on the CPU, else Pillow;
  the choice is logged.

Every backend passes one contract suite (tests/test_decode_contract.py): the same
shapes, pixels close to Pillow's, EXIF orientation applied (the image comes out
upright, as a viewer shows it), grayscale/CMYK/palette/RGBA/16-bit become 8-bit
RGB, and bad images handled by ``on_error`` identically.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Protocol

import torch

from gpupipe.core.errors import ConfigError, MissingDependencyError
from gpupipe.core.types import ErrorPolicy
from gpupipe.formats.imageheader import MAX_PIXELS

__all__ = ["ResizeMode", "DecodeConfig", "DecodedBatch", "DecodeStats", "Decoder", "BACKENDS",
           "make_decoder", "available_backends"]

log = logging.getLogger(__name__)


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
    ``images, labels = batch`` unpacks the two a training loop needs.
    """

    images: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    sample_ids: torch.Tensor
    keys: tuple[str, ...]
    epoch: int = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield self.images
        yield self.labels

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class DecodeStats:
    batches: int = 0
    images: int = 0
    skipped: int = 0
    seconds: float = 0.0
    skipped_keys: list[str] = field(default_factory=list)


class Decoder(Protocol):
    name: str
    device: torch.device
    stats: DecodeStats

    def decode(self, batch) -> DecodedBatch: ...

    def close(self) -> None: ...


_BACKENDS = {
    "dali": "gpupipe.decode.dali:DaliDecoder",
    "nvjpeg": "gpupipe.decode.nvjpeg:NvjpegDecoder",
    "pil": "gpupipe.decode.pil:PilDecoder",
}
BACKENDS = MappingProxyType(_BACKENDS)
_PACKAGES = {"dali": ("nvidia.dali", "nvidia-dali", "dali"), "nvjpeg": ("torchvision", "torchvision", "nvjpeg"),
             "pil": ("PIL", "Pillow", "pil")}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (``nvidia``) is missing
        return False


def available_backends(device: torch.device) -> list[str]:
    """Backends usable on ``device``, best first (the order ``auto`` tries)."""
    order = ["dali", "nvjpeg", "pil"] if device.type == "cuda" else ["dali", "pil"]
    return [b for b in order if _importable(_PACKAGES[b][0])]


def make_decoder(config: DecodeConfig, device: torch.device | str | None = None) -> Decoder:
    """A decoder for ``config.backend`` on ``device`` (default: CUDA if present, else CPU)."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = config.backend
    if name == "auto":
        found = available_backends(dev)
        if not found:
            raise MissingDependencyError("nvidia-dali or Pillow", extra="dali", feature="decoding images")
        name = found[0]
        log.info("decode backend: %s on %s (auto)", name, dev)
    module, package, extra = _PACKAGES[name]
    if name == "nvjpeg" and dev.type != "cuda":
        raise ConfigError("decode.backend: 'nvjpeg' decodes on a CUDA device; use 'dali' or 'pil' on the CPU")
    if not _importable(module):
        raise MissingDependencyError(package, extra=extra, feature=f"the {name!r} decode backend")
    mod, attr = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(mod), attr)(config, dev)
