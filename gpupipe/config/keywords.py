"""The keyword form: ``GpuLoader(url, batch_size=256, image_size=224, ...)`` → a :class:`SplitConfig`.

:func:`split_from_options` writes the keywords into the same mapping a YAML file gives and
parses it, so a bad value gets the same ``ConfigError`` either way. A setting given twice with
two values (``image_size=32`` and a ``DecodeConfig`` with another size) raises naming both; a
setting given once is the one used.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from gpupipe.config.augment import TransformSpec
from gpupipe.config.schema import parse_config
from gpupipe.config.split import SplitConfig
from gpupipe.config.values import plain
from gpupipe.core.errors import ConfigError
from gpupipe.core.types import World
from gpupipe.decode import DecodeConfig
from gpupipe.sources.source import Source
from gpupipe.stream.chunks import StreamConfig

__all__ = ["split_from_options"]


def split_from_options(source, *, batch_size: int, image_size: int | tuple[int, int] | None = None,
                       decode: str | DecodeConfig | None = None, augment: Any = None, mix: Any = None,
                       shuffle: bool | None = None, drop_last: bool | None = None, seed: int | None = None,
                       on_error: str | None = None, resize: str | None = None, num_workers: int | None = None,
                       prefetch: int | None = None, storage_options: Mapping[str, Any] | None = None,
                       stream: StreamConfig | None = None, device: Any = None, rank: int | None = None,
                       world_size: int | None = None) -> tuple[SplitConfig, World]:
    """The keyword form → (the training split it describes, the ``World`` it runs in).

    ``source``: a URL, a list of them or a :class:`~gpupipe.sources.source.Source`. ``decode`` is
    a backend name or a :class:`DecodeConfig`; ``stream`` a
    :class:`StreamConfig`; the plain keywords fill in what those leave at their defaults
    and must agree with what they set.
    """
    decode_given = {"backend": decode} if isinstance(decode, str) else _non_default(decode)
    stream_given = _non_default(stream)
    decode_section = _merge(decode_given, "decode", image_size=image_size, resize=resize)
    stream_section = _merge(stream_given, "stream", shuffle=shuffle, drop_last=drop_last)
    policy = _one_value("on_error", [("on_error", on_error), ("decode.on_error", decode_section.pop("on_error", None)),
                                     ("stream.on_error", stream_section.pop("on_error", None))])
    seed = _one_value("seed", [("seed", seed), ("decode.seed", decode_section.pop("seed", None))])
    if policy is not None:
        decode_section["on_error"] = policy
    loader = {k: v for k, v in (("batch_size", batch_size), ("num_workers", num_workers), ("prefetch", prefetch),
                                ("device", None if device is None else str(device))) if v is not None}
    given_source = source if isinstance(source, Source) else None  # kept whole: it may name columns, labels
    if given_source is not None:
        if storage_options and dict(storage_options) != dict(given_source.storage_options):
            raise ConfigError("storage_options: given twice, as storage_options= and in the Source; give it once")
        source, storage_options = given_source.url, given_source.storage_options
    mapping: dict[str, Any] = {"source": {"train": list(source) if isinstance(source, (list, tuple)) else source,
                                          "storage_options": dict(storage_options or {})},
                               "stream": plain(stream_section), "decode": plain(decode_section), "loader": loader,
                               "seed": 0 if seed is None else seed}
    objects = {}  # transforms given as Python objects skip the parser and are set as they are
    for name, value in (("augment", augment), ("mix", mix)):
        if _yaml_able(value, TransformSpec):
            if value is not None:
                mapping[name] = plain(value)
        else:
            objects[name] = _composed(value) if name == "augment" else value
    split = parse_config(mapping, origin="GpuLoader").split("train")
    if given_source is not None:
        objects["source"] = given_source
    return replace(split, **objects), World.detect(rank, world_size)


def _non_default(config) -> dict[str, Any]:
    """The fields of a stage config that differ from the defaults (what the caller set)."""
    if config is None:
        return {}
    default = type(config)()
    return {f.name: getattr(config, f.name) for f in fields(config)
            if getattr(config, f.name) != getattr(default, f.name)}


def _merge(given: dict[str, Any], section: str, **keywords: Any) -> dict[str, Any]:
    """``given`` with the keywords that were passed; a keyword that disagrees with a value
    the section object set raises naming both."""
    out = dict(given)
    for name, value in keywords.items():
        if value is None:
            continue
        if name in out and _normal(name, out[name]) != _normal(name, value):
            raise ConfigError(f"{name}: given twice, {name}={value!r} and {section}.{name}={out[name]!r}; "
                              "give it once")
        out[name] = _normal(name, value)
    return out


def _one_value(name: str, given: list[tuple[str, Any]]) -> Any:
    """The one value among the places a setting may be given; two different ones raise."""
    found = [(where, _normal(name, v)) for where, v in given if v is not None]
    if len({v for _, v in found}) > 1:
        raise ConfigError(f"{name}: given twice, " + " and ".join(f"{w}={v!r}" for w, v in found) + "; give it once")
    return found[0][1] if found else None


def _normal(name: str, value: Any) -> Any:
    """A value in one comparable form: enums by value, an int image size as (h, w)."""
    value = getattr(value, "value", value)
    if name == "image_size" and isinstance(value, int):
        return (value, value)
    return tuple(value) if isinstance(value, list) else value


def _composed(value: Any) -> Any:
    """A list of transform objects (``augment=[T.RandomHorizontalFlip(), ...]``) as the
    ``Compose`` a torchvision user would have wrapped it in; anything else as given."""
    if not isinstance(value, (list, tuple)):
        if value is not None and not callable(value):
            raise ConfigError("augment: expected a transform, a list of transforms, a preset name or specs; "
                              f"got {type(value).__name__}")
        return value
    from gpupipe.augment.compose import Compose

    try:
        return Compose(list(value))
    except TypeError as exc:
        raise ConfigError(f"augment: {exc} (torchvision transforms: gpupipe.transforms.from_torchvision)") from None


def _yaml_able(value: Any, spec_type: type) -> bool:
    """Whether ``augment``/``mix`` can go through the YAML parser (a preset name, specs,
    mappings) rather than being a transform object given in Python."""
    if value is None or isinstance(value, (str, spec_type, Mapping)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, (str, spec_type, Mapping)) for v in value)
