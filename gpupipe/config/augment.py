"""The ``augment`` section: transform specs, the docs' presets, and checking a pipeline before any image.

A :class:`TransformSpec` is one step as written in YAML (a ``gpupipe.transforms`` name and
torchvision's arguments); :func:`parse_augment` turns a preset name or a list into specs and
follows dtype, channels and size through them, refusing the first step that cannot take what
reaches it.
"""
from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupipe.augment.presets import PRESETS
from gpupipe.augment.registry import TRANSFORMS, build_transform, transform_class
from gpupipe.config.values import check_keys, suggest
from gpupipe.core.errors import ConfigError

__all__ = ["TransformSpec", "preset", "parse_augment", "parse_spec"]


@dataclass(frozen=True)
class TransformSpec:
    """One augmentation step as written in the config: a ``gpupipe.transforms`` name and its
    arguments (torchvision's names). ``build()`` makes the transform."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", types.MappingProxyType(dict(self.args)))

    def __reduce__(self):  # mappingproxy does not pickle; the spec is plain data
        return (TransformSpec, (self.name, dict(self.args)))

    def build(self):
        return build_transform(self.name, dict(self.args))

    def to_dict(self) -> dict:
        return {"name": self.name, **dict(self.args)}

    plain_form = to_dict  # how values.plain writes it: the YAML item it came from


def preset(name: str) -> tuple[TransformSpec, ...]:
    """The docs' transform sets as specs (:data:`gpupipe.augment.presets.PRESETS`): ``simple``,
    ``complex``, ``none``, or a flip and an auto-augment policy as in torchvision's ImageNet recipes
    (``trivialaugment``, ``randaugment``, ``autoaugment``); after a decode to the output size;
    ImageNet normalisation, float32."""
    if name not in PRESETS:
        raise ConfigError(f"augment: unknown preset {name!r}{suggest(name, PRESETS)} (choose from {', '.join(PRESETS)})")
    return tuple(TransformSpec(step, args) for step, args in PRESETS[name])


def parse_augment(value: Any, path: str, hw: tuple[int, int] | None) -> tuple[TransformSpec, ...]:
    """The steps of ``value`` (a preset name or a list), checked along the images' way from a
    decoder giving ``hw`` (None: sizes vary)."""
    if value is None:
        return ()
    if isinstance(value, str):
        specs = preset(value)
    elif isinstance(value, Sequence):
        specs = tuple(parse_spec(item, f"{path}[{i}]") for i, item in enumerate(value))
    else:
        raise ConfigError(f"{path}: expected a list of transforms or a preset name (simple, complex, none, "
                          "trivialaugment, randaugment, autoaugment)")
    _check_pipeline(specs, path, hw)
    return specs


def parse_spec(item: Any, path: str, registry: Mapping[str, str] = TRANSFORMS) -> TransformSpec:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, Mapping) or "name" not in item:
        raise ConfigError(f"{path}: expected a mapping with 'name' and the transform's arguments")
    name = item["name"]
    if name not in registry:
        raise ConfigError(f"{path}.name: unknown {name!r}{suggest(str(name), registry)} "
                          f"(supported: {', '.join(sorted(registry))})")
    args = {k: v for k, v in item.items() if k != "name"}
    from gpupipe.augment.base import config_keys  # (torch: not before a config names a transform)

    check_keys(args, config_keys(transform_class(name)), path)
    spec = TransformSpec(name, args)
    try:
        spec.build()
    except (ValueError, TypeError, ConfigError) as exc:
        raise ConfigError(f"{path} ({name}): {exc}") from None
    return spec


def _check_pipeline(specs: Sequence[TransformSpec], path: str, hw: tuple[int, int] | None) -> None:
    """A config pipeline starts from the decoder's uint8 RGB of size ``hw``: follow through the
    steps the dtype (torchvision v2's rules, :meth:`Transform.output_dtype`), the channel count
    (3; ``Grayscale`` and ``RepeatChannels`` set it; unknown after a container that holds one)
    and the size (:meth:`Transform.output_size`; unknown without ``hw``), and refuse the first
    step that cannot take what reaches it (Normalize before a ToDtype or with 2 means for 3
    channels, a RandomCrop larger than its input) before any image is decoded."""
    import torch

    from gpupipe.augment.color import Grayscale, Normalize, RepeatChannels

    dtype = torch.uint8
    channels: int | None = 3  # None: unknown after a container that holds a channel-setting step
    for i, spec in enumerate(specs):
        module, where = spec.build(), f"{path}[{i}] ({spec.name})"
        try:
            dtype = module.output_dtype(dtype)
            if isinstance(module, Normalize) and channels is not None:
                module.check_channels(channels)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if hw is not None:
            try:
                hw = tuple(module.output_size(hw))
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}; the images reaching it are {hw[0]}x{hw[1]} "
                                  "(decode.image_size, through the steps before it)") from None
        if isinstance(module, Grayscale):
            channels = module.num_output_channels
        elif isinstance(module, RepeatChannels):
            channels = module.num_channels
        elif any(isinstance(m, (Grayscale, RepeatChannels)) for m in module.modules()):
            channels = None


