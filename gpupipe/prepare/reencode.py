"""Re-encoding at ingest (issue 39): images larger than asked are stored smaller, upright and as
JPEG — the largest single saving in decode time and bytes read for training at 224 px, as FFCV
stores ImageNet. ``--max-side N`` bounds the longer side, ``--short-side N`` the shorter;
``--quality Q`` is the JPEG quality of what is re-encoded. An image already small enough is
copied as it is (bytes unchanged). A re-encoded image has its EXIF orientation applied first (the
stored image is upright, orientation 1), is resized with Pillow's antialiased Lanczos filter,
and its boxes (``.json``) and mask (``.mask.png``, nearest) are scaled with it: targets are in the
upright image's pixels (docs/targets.md), so a scale is all they need."""
from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import numpy as np

from gpupipe.core.errors import ConfigError
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, encode_boxes, parse_boxes
from gpupipe.formats.headers import upright_hw
from gpupipe.formats.imageheader import ImageHeader, image_extensions

__all__ = ["Reencode", "reencoded"]


@dataclass(frozen=True)
class Reencode:
    """What ``gpupipe ingest`` stores: the longer side at most ``max_side``, or the shorter side at
    most ``short_side`` (one of the two), re-encoded as JPEG of ``quality``."""

    max_side: int | None = None
    short_side: int | None = None
    quality: int = 90

    def __post_init__(self) -> None:
        if (self.max_side is None) == (self.short_side is None):
            raise ConfigError("ingest: give one of --max-side and --short-side")
        side = self.max_side if self.max_side is not None else self.short_side
        if side is not None and side < 8:
            raise ConfigError(f"ingest: --max-side/--short-side must be >= 8 pixels, got {side}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"ingest: --quality must be in [1, 100], got {self.quality}")

    def size_for(self, height: int, width: int) -> tuple[int, int] | None:
        """The (h, w) an upright ``height`` × ``width`` image is stored at, or ``None`` when it is
        small enough already (kept as it is)."""
        if self.max_side is not None:
            scale = self.max_side / max(height, width)
        else:
            assert self.short_side is not None, "__post_init__ makes sure one is set"
            scale = self.short_side / min(height, width)
        if scale >= 1:
            return None
        return max(1, round(height * scale)), max(1, round(width * scale))

    def record(self, reencoded: int, kept: int) -> dict:
        """What ``index.json`` says was done (``prepared.reencode``)."""
        return {**{k: v for k, v in asdict(self).items() if v is not None}, "reencoded": reencoded, "kept": kept}


def reencoded(fields: dict[str, bytes], key: str, header: ImageHeader, spec: Reencode) -> dict[str, bytes] | None:
    """The sample's fields with its image stored at ``spec`` (and its boxes and mask scaled), or
    ``None`` when the image is small enough and the sample goes in unchanged."""
    upright = upright_hw(header)
    size = spec.size_for(*upright)
    if size is None:
        return None
    from PIL import Image, ImageOps

    name = next(f for f in image_extensions() if f in fields)
    with Image.open(io.BytesIO(fields[name])) as im:
        im.draft("RGB", (size[1], size[0]))  # JPEG: decode at a reduced scale where it is still >= the target
        image = ImageOps.exif_transpose(im).convert("RGB")
    scale_y, scale_x = size[0] / upright[0], size[1] / upright[1]
    out = io.BytesIO()
    image.resize((size[1], size[0]), Image.Resampling.LANCZOS).save(out, "JPEG", quality=spec.quality)
    new = {k: v for k, v in fields.items() if k != name}
    new["jpg"] = out.getvalue()
    if BOXES_FIELD in fields:
        boxes, labels = parse_boxes(fields[BOXES_FIELD], key)
        scaled = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * [scale_x, scale_y, scale_x, scale_y]
        new[BOXES_FIELD] = encode_boxes(scaled, labels)
    if MASK_FIELD in fields:
        with Image.open(io.BytesIO(fields[MASK_FIELD])) as mask:
            small = mask.resize((size[1], size[0]), Image.Resampling.NEAREST)
            buf = io.BytesIO()
            small.save(buf, "PNG")
        new[MASK_FIELD] = buf.getvalue()
    return new
