"""How to decode, as plain settings: :class:`DecodeConfig` and :class:`ResizeMode`, and what a decode
backend is (:class:`BackendSpec`, the :data:`BACKENDS` registry). No torch here: reading a config, a
command line's flags or ``gpupipe --help`` imports this module, not the decoders."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from gpupipe.core.errors import ConfigError
from gpupipe.core.types import ErrorPolicy
from gpupipe.formats.imageheader import MAX_PIXELS

__all__ = ["ResizeMode", "DecodeConfig", "BACKENDS", "BackendSpec", "register_backend"]


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
