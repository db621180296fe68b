"""One split's loader settings as one frozen value, every per-split decision already made.

A loader is built from a :class:`SplitConfig` and nothing else: ``GpuLoader(split)``,
``EncodedLoader(split, world)``. Settings travel down inside it; nothing repacks them
on the way. There are two ways to make one, and they share one validator:

* from YAML or a mapping: ``load_config(...).split("val")`` — evaluation splits keep order,
  pad their tail, resize the shorter side instead of cropping at random, and run the
  deterministic steps of ``augment``;
* from keywords, the README's form: ``GpuLoader("s3://...", batch_size=256, image_size=224)``
  → :func:`split_from_options`, which writes the keywords into the same mapping a YAML
  file gives and parses it, so a bad value gets the same ``ConfigError`` either way. A
  setting given twice with two values (``image_size=32`` and a ``DecodeConfig`` with
  another size) raises naming both; a setting given once is the one used.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpupipe.config.augment import TransformSpec
from gpupipe.config.checks import decode_from_augment, warn_repeated_resizes
from gpupipe.core.errors import ConfigError
from gpupipe.decode import DecodeConfig
from gpupipe.sources.mixed import MixedSource
from gpupipe.sources.source import Source
from gpupipe.stream.settings import StreamConfig

__all__ = ["SplitConfig"]


@dataclass(frozen=True)
class SplitConfig:
    """Everything one split's loader needs (picklable when its transforms are).

    ``augment``: transform specs from a config, or a transform / callable given in Python
    (see :class:`~gpupipe.augment.stage.AugmentStage`). ``mix``: a spec or a built
    ``MixUp``/``CutMix`` (training only). ``on_error`` and ``seed`` are set once:
    ``stream.on_error`` is ``decode.on_error`` and ``decode.seed`` is ``seed``.
    """

    source: Source | MixedSource  # a list of sources, mixed: MixedSource
    batch_size: int = 64
    name: str = "train"
    stream: StreamConfig = field(default_factory=StreamConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    augment: Any = ()
    mix: Any = None
    classes: tuple[str, ...] | None = None
    num_workers: int | None = None
    prefetch: int = 1
    device: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.stream.on_error is not self.decode.on_error:
            raise ConfigError(f"on_error: stream.on_error={self.stream.on_error.value!r} and decode.on_error="
                              f"{self.decode.on_error.value!r} disagree; one policy covers both (decode.on_error)")
        if self.decode.seed != self.seed:
            raise ConfigError(f"seed: decode.seed={self.decode.seed} and seed={self.seed} disagree; "
                              "one seed keys the plan, the decode crops and the augmentation")
        for name in ("batch_size", "prefetch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"loader.{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"loader.num_workers: must be >= 0, got {self.num_workers}")

    def with_decode_from_augment(self, train_augment: Any = ()) -> SplitConfig:
        """This split with its decode size taken from its ``augment`` when it has none
        (:func:`~gpupipe.config.checks.decode_from_augment`: a leading ``RandomResizedCrop`` or ``Resize``
        moves into the decode), else from ``train_augment`` (an evaluation split whose own steps give
        none: the training crop's size, resized ``shorter``); unchanged when there is nothing to take."""
        train = self.name == "train"
        taken = decode_from_augment(self.augment, self.decode, train)
        if taken is not None:
            return replace(self, decode=taken[0], augment=() if taken[1] is None else taken[1])
        if not train and train_augment:
            taken = decode_from_augment(train_augment, self.decode, train=False)
            if taken is not None:
                return replace(self, decode=taken[0])
        return self

    def augment_stage(self):
        """The :class:`~gpupipe.augment.stage.AugmentStage` of this split, or None."""
        from gpupipe.augment.stage import AugmentStage

        transforms, mix = self.augment, self.mix
        if isinstance(transforms, tuple) and all(isinstance(s, TransformSpec) for s in transforms):
            from gpupipe.augment.compose import Compose

            transforms = Compose([s.build() for s in transforms]) if transforms else None
        if isinstance(mix, TransformSpec):
            mix = mix.build()
        if transforms is None and mix is None:
            return None
        warn_repeated_resizes(transforms, self.decode)  # once per loader: each builds its stage once
        return AugmentStage(transforms, mix, self.seed, targets=self.source.targets)
