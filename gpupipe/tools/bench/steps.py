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
    """The ``gpupipe.transforms.Compose`` for ``steps`` (None when empty), each step built as a
    config builds it (:func:`~gpupipe.augment.registry.build_transform`)."""
    import gpupipe.transforms as T
    from gpupipe.augment.registry import build_transform

    built = []
    for name, args in steps:
        try:
            built.append(build_transform(name, args))
        except ValueError as exc:
            raise ConfigError(f"augment: {exc}") from None
    return T.Compose(built) if built else None
