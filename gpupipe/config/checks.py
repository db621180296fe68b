"""Checks across two stages' settings: the augment pipeline against the decode that feeds it.

A torchvision pipeline starts with ``RandomResizedCrop`` or ``Resize`` because torchvision gets
each image at full size. Here the decoder has already resized it to ``decode.image_size``
(``resize`` ``fixed``, ``shorter`` or ``random_resized_crop``), so the same step left in
``augment`` crops or resizes a second time: less detail and, under ``fixed``, a stretched image
first. :func:`repeated_resizes` names those steps and the setting that does it while decoding.
``CenterCrop`` and ``RandomCrop`` are not named: a crop of the decoded image is the usual way to
get torchvision's ``Resize(256)`` + ``CenterCrop(224)`` (decode 256, ``shorter``, then the crop).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from gpupipe.decode import DecodeConfig, ResizeMode

__all__ = ["repeated_resizes", "warn_repeated_resizes"]

log = logging.getLogger(__name__)


def warn_repeated_resizes(transforms: Any, decode: DecodeConfig) -> None:
    """Log a warning for each step of ``transforms`` that resizes again what the decoder
    resized (called once per loader, where its augment stage is built)."""
    for problem in repeated_resizes(transforms, decode):
        log.warning("augment: %s", problem)


def repeated_resizes(transforms: Any, decode: DecodeConfig) -> list[str]:
    """What ``transforms`` (a ``gpupipe.transforms`` pipeline, a torchvision one, any callable)
    resizes again after ``decode`` resized: a ``RandomResizedCrop`` anywhere in it, a ``Resize``
    among its first steps to another size than the decoder's. Each with the way out."""
    size = decode.resize_to
    if size is None or transforms is None:
        return []
    problems: list[str] = []
    crop = next((t for t in _walk(transforms) if type(t).__name__ == "RandomResizedCrop"), None)
    if crop is not None:
        problems.append(_crop_again(crop, decode, size))
    hw: tuple[int, int] | None = size  # the size reaching the step; None once unknown
    for step in _top_level(transforms):
        if type(step).__name__ == "Resize" and hw == size and hasattr(step, "output_size") \
                and tuple(step.output_size(hw)) != hw:
            out = tuple(step.output_size(hw))
            problems.append(f"Resize to {out[0]}x{out[1]} resizes images the decoder has already resized to "
                            f"{size[0]}x{size[1]} (decode resize={decode.resize.value!r}): two resamplings. Resize while "
                            f"decoding instead: image_size={out} (resize='shorter' keeps the aspect ratio, as "
                            "torchvision's Resize(int) does) and drop Resize from augment")
        hw = tuple(step.output_size(hw)) if hw is not None and hasattr(step, "output_size") else None
    return problems


def _crop_again(crop: Any, decode: DecodeConfig, size: tuple[int, int]) -> str:
    if decode.resize is ResizeMode.RANDOM_CROP:
        return (f"RandomResizedCrop crops again images the decoder has already cropped at random and resized to "
                f"{size[0]}x{size[1]} (decode resize='random_resized_crop'): a crop of a crop. Drop it from "
                "augment; decode scale= and ratio= take its scale and ratio")
    scale, ratio = tuple(getattr(crop, "scale", (0.08, 1.0))), tuple(getattr(crop, "ratio", (3 / 4, 4 / 3)))
    return (f"RandomResizedCrop crops images the decoder has already resized to {size[0]}x{size[1]} (decode "
            f"resize={decode.resize.value!r}): torchvision crops the full image, this crop is cut from the "
            "resized one and resized again. Crop while decoding instead: resize='random_resized_crop', "
            f"scale={_short(scale)}, ratio={_short(ratio)} (decode.resize, decode.scale, decode.ratio in YAML) "
            "and drop RandomResizedCrop from augment; or resize='none' if every image already has the one size")


def _short(pair: tuple) -> str:
    return "(" + ", ".join(f"{float(v):.4g}" for v in pair) + ")"


def _top_level(transforms: Any) -> list[Any]:
    """The steps of a ``Compose`` (gpupipe's, torchvision's v1 or v2), else the one transform."""
    if type(transforms).__name__ == "Compose":
        return list(transforms.transforms)
    return [transforms]


def _walk(t: Any) -> Iterator[Any]:
    """``t`` and every transform inside it: a container's ``transforms`` (gpupipe's and
    torchvision's containers keep them there), else a module's children."""
    yield t
    inner = getattr(t, "transforms", None)
    if inner is None or isinstance(inner, (str, bytes)):
        inner = t.children() if hasattr(t, "children") and callable(t.children) else ()
    try:
        items = list(inner)
    except TypeError:
        return
    for child in items:
        yield from _walk(child)
