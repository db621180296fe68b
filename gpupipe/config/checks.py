"""Checks across two stages' settings: the augment pipeline against the decode that feeds it.

A torchvision pipeline starts with ``RandomResizedCrop`` or ``Resize`` because torchvision gets
each image at full size. Here the decoder has already resized it to ``decode.image_size``
(``resize`` ``fixed``, ``shorter`` or ``random_resized_crop``), so the same step left in
``augment`` crops or resizes a second time: less detail and, under ``fixed``, a stretched image
first. :func:`repeated_resizes` names those steps and the setting that does it while decoding.
``CenterCrop`` and ``RandomCrop`` are not named: a crop of the decoded image is the usual way to
get torchvision's ``Resize(256)`` + ``CenterCrop(224)`` (decode 256, ``shorter``, then the crop).

The other way round, a pipeline ported from torchvision with no ``decode.image_size`` at all would
decode every image at its own size and fail at the first batch (a batch has one size).
:func:`decode_from_augment` takes the size from the step torchvision would have resized with: a
leading ``RandomResizedCrop`` runs in the decode (``resize='random_resized_crop'``, its size, scale
and ratio: cut from the full-size image, as torchvision cuts it) and leaves the pipeline; a leading
``Resize((h, w))`` becomes the decode's ``fixed`` resize; ``Resize(s)`` followed by a ``CenterCrop``
becomes ``resize='shorter'`` at ``s`` (the crop stays: torchvision's evaluation recipe).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from gpupipe.config.augment import TransformSpec
from gpupipe.decode import DecodeConfig, ResizeMode

__all__ = ["repeated_resizes", "warn_repeated_resizes", "decode_from_augment"]

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


_PASS = ("ToImage", "PILToTensor")  # conversions a recipe puts before its crop: nothing to do on a batch


def decode_from_augment(transforms: Any, decode: DecodeConfig, train: bool = True) -> tuple[DecodeConfig, Any] | None:
    """``(decode, transforms)`` with the size taken from the step of ``transforms`` that torchvision
    resizes with, when ``decode`` has none (see the module doc); None when there is nothing to take
    (a size already set, or no such leading step). ``transforms``: a ``gpupipe.transforms`` pipeline,
    a torchvision one (v1 or v2: its ``Compose`` rebuilt without the step), or config specs (a tuple);
    what is left keeps its type (None / ``()`` when nothing is). ``train=False`` (an evaluation
    split): a ``RandomResizedCrop`` gives ``resize='shorter'`` at its size, as for a config's splits."""
    if decode.image_size is not None or transforms is None:
        return None
    steps = list(transforms) if isinstance(transforms, tuple) else _top_level(transforms)
    at = next((i for i, s in enumerate(steps) if _name(s) not in _PASS), None)
    if at is None:
        return None
    step, name, after = _module(steps[at]), _name(steps[at]), steps[at + 1:at + 2]
    taken = _taken(step, name, bool(after) and _name(after[0]) == "CenterCrop", train)
    if taken is None:
        return None
    settings, said = taken
    shown = ", ".join(f"{k}={_short(v) if k in ('scale', 'ratio') else repr(getattr(v, 'value', v))}"
                      for k, v in settings.items())
    log.info("augment: %s leads the pipeline and decode has no image_size: the decode does it instead (%s), from "
             "each full-size image as torchvision does; augment goes on without it", said, shown)
    return replace(decode, **settings), _rebuilt(transforms, steps[:at] + steps[at + 1:])


def _taken(step: Any, name: str, crop_follows: bool, train: bool) -> tuple[dict[str, Any], str] | None:
    """The decode settings a leading ``step`` gives, and the step in words; None: it gives none."""
    if name == "RandomResizedCrop":
        size = _hw(step.size)
        scale, ratio = tuple(float(v) for v in step.scale), tuple(float(v) for v in step.ratio)
        settings: dict[str, Any] = {"image_size": size,
                                    "resize": ResizeMode.RANDOM_CROP if train else ResizeMode.SHORTER}
        if train:
            settings.update(scale=scale, ratio=ratio)
        return settings, f"RandomResizedCrop({size[0]}x{size[1]}, scale={_short(scale)}, ratio={_short(ratio)})"
    if name != "Resize" or getattr(step, "max_size", None) is not None or getattr(step, "size", None) is None:
        return None
    given = step.size if isinstance(step.size, int) else tuple(step.size)
    if isinstance(given, tuple) and len(given) == 2:
        return {"image_size": _hw(given), "resize": ResizeMode.FIXED}, f"Resize({list(given)})"
    if crop_follows:  # Resize(s): the shorter side to s, then the crop of the decoded (s, s) centre
        s = int(given if isinstance(given, int) else given[0])
        return {"image_size": (s, s), "resize": ResizeMode.SHORTER}, f"Resize({s}) (then CenterCrop)"
    return None  # Resize(s) alone keeps each aspect ratio: a batch of one size only if the images have one


def _name(step: Any) -> str:
    return step.name if isinstance(step, TransformSpec) else type(step).__name__


def _module(step: Any) -> Any:
    return step.build() if isinstance(step, TransformSpec) else step


def _hw(size: Any) -> tuple[int, int]:
    """torchvision's ``size``: an int, or [h, w], or [s] (v2 keeps an int as a list of one)."""
    if isinstance(size, int):
        return size, size
    size = tuple(int(v) for v in size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _rebuilt(transforms: Any, steps: list[Any]) -> Any:
    """``transforms`` holding ``steps`` instead (the same kind of pipeline); None / () for none."""
    if isinstance(transforms, tuple):
        return tuple(steps)
    if not steps:
        return None
    if type(transforms).__name__ != "Compose":
        return steps[0]
    if type(transforms).__module__.split(".")[0] == "gpupipe":
        return type(transforms)(steps, fuse=transforms.fuse, compile=transforms.compile_colour)
    return type(transforms)(steps)  # torchvision's Compose (v1 or v2)


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
