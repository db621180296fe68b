"""The transform set a benchmark runs, as plain data: ``(name, args)`` steps.

The same steps drive every loader: gpupipe builds its batch pipeline from them (or
the config does), the baselines build per-sample equivalents
(:mod:`gpupipe.tools.bench.persample`, :mod:`gpupipe.tools.bench.dali`). The names and
arguments are those of ``gpupipe.transforms`` (torchvision's). ``SETS`` holds the
docs' simple and complex sets, read from :data:`gpupipe.augment.presets.PRESETS` as the
config's presets and ``gpupipe.transforms.simple_set()`` / ``complex_set()`` are.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from gpupipe.augment.presets import PRESETS, Step
from gpupipe.core.errors import ConfigError

__all__ = ["Step", "SETS", "SUPPORTED", "steps_of", "check_supported", "gpupipe_pipeline"]

SETS: Mapping[str, tuple[Step, ...]] = MappingProxyType({name: PRESETS[name] for name in ("none", "simple", "complex")})
# What the per-sample baselines implement (the DALI one: see gpupipe.tools.bench.dali).
SUPPORTED = ("Resize", "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip",
             "RandomPerspective", "ColorJitter", "ToDtype", "ToTensor", "RepeatChannels", "Normalize")


def steps_of(specs: Iterable[Any]) -> tuple[Step, ...]:
    """Steps from config ``TransformSpec`` objects (``name``, ``args``), mappings
    ``{"name": ..., **args}`` or ``(name, args)`` pairs."""
    out = []
    for s in specs:
        if hasattr(s, "name") and hasattr(s, "args"):
            out.append((s.name, dict(s.args)))
        elif isinstance(s, Mapping):
            args = dict(s)
            out.append((args.pop("name"), args))
        else:
            name, args = s
            out.append((name, dict(args)))
    return tuple(out)


def check_supported(steps: Iterable[Step], supported: Iterable[str] = SUPPORTED, who: str = "the baselines") -> None:
    """Raise ``ConfigError`` naming the first step ``who`` cannot run per sample."""
    allowed = tuple(supported)
    for i, (name, _) in enumerate(steps):
        if name not in allowed:
            raise ConfigError(f"augment[{i}]: {name} has no per-sample equivalent in {who}; "
                              f"supported: {', '.join(allowed)} (or leave that baseline out of --compare)")


def gpupipe_pipeline(steps: Iterable[Step]):
    """The ``gpupipe.transforms.Compose`` for ``steps`` (None when empty)."""
    import torch

    import gpupipe.transforms as T

    built = []
    for name, args in steps:
        kwargs = dict(args)
        if name == "ToDtype" and isinstance(kwargs.get("dtype"), str):
            kwargs["dtype"] = getattr(torch, kwargs["dtype"])
        cls = getattr(T, name, None)
        if cls is None or name not in T.__all__:
            raise ConfigError(f"augment: unknown transform {name!r}")
        built.append(cls(**kwargs) if name != "ToTensor" else T.ToTensor())
    return T.Compose(built) if built else None
