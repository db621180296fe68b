"""YAML → one typed, frozen :class:`PipelineConfig` (source, stream, decode, augment, loader, seed).

The YAML maps one-to-one onto the stage dataclasses (``StreamConfig``,
``DecodeConfig``, ...). Loading is safe (``yaml.safe_load``: no python tags), every
unknown key, wrong type and unknown transform name raises :class:`ConfigError`
with the key path and, where one is close, a suggestion. ``${VAR}`` and
``${VAR:-default}`` in strings are read from the environment; storage option
values are kept in :class:`Secrets`, which never shows them (``repr``, logs,
``to_dict()`` — what goes into ``hparams.yaml`` and checkpoints).

A file may also be a LightningCLI file (``gpupipe fit --config``): then the
pipeline is its ``data:`` section and ``model:``/``trainer:``/... belong to Lightning.
"""
from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpupipe.augment.registry import MIXES
from gpupipe.config.augment import TransformSpec, parse_augment, parse_spec, preset
from gpupipe.config.sourcelist import SourceEntry, is_source_list, mixed_source, parse_sources
from gpupipe.config.split import SplitConfig
from gpupipe.config.values import build, check_keys, coerce, join_path, plain, suggest
from gpupipe.core.errors import ConfigError
from gpupipe.core.targetkinds import target_kinds
from gpupipe.decode import DecodeConfig, ResizeMode
from gpupipe.sources.classes import check_class_names
from gpupipe.stream.settings import StreamConfig

__all__ = ["PipelineConfig", "SourceConfig", "LoaderConfig", "TransformSpec", "Secrets", "BatchFormat",
           "AugmentPlace", "SPLITS", "LIGHTNING_SECTIONS", "load_config", "parse_config", "plain", "preset",
           "split_classes", "eval_transforms"]

SPLITS = ("train", "val", "test", "predict")
LIGHTNING_SECTIONS = frozenset({"model", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"})
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_EVAL_SAFE = frozenset({"Resize", "CenterCrop", "ToDtype", "ToTensor", "Normalize", "RepeatChannels", "Grayscale",
                        "SanitizeBoundingBoxes", "ToImage", "PILToTensor", "ToPureTensor", "ConvertImageDtype",
                        "ClampBoundingBoxes", "ConvertBoundingBoxFormat"})


class Secrets(Mapping[str, Any]):
    """Storage options: a read-only mapping whose values never appear in ``repr``/``str``."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "Secrets({" + ", ".join(f"{k!r}: '***'" for k in self._values) + "})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._values) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values)))

    def __reduce__(self):  # pickles as plain data (workers receive storage options)
        return (Secrets, (self._values,))


class BatchFormat(str, enum.Enum):
    """What the DataModule's loaders yield: ``(images, labels)`` (``(images, targets)`` with targets:
    torchvision's per-image dicts), a dict (adds ``valid``,
    ``sample_ids``, ``keys``), or the :class:`~gpupipe.decode.DecodedBatch` itself."""

    TUPLE = "tuple"
    DICT = "dict"
    BATCH = "batch"


class AugmentPlace(str, enum.Enum):
    """Where the DataModule augments: in the loader's augment stage (overlapping decode, on a
    side CUDA stream), or in ``on_after_batch_transfer`` (in the training step's stream)."""

    LOADER = "loader"
    AFTER_TRANSFER = "on_after_batch_transfer"


@dataclass(frozen=True)
class SourceConfig:
    """Where each split's data is: a URL pattern (braces, globs), or a list of them (one source); or
    a list of sources, each a mapping with its ``url`` and one of ``weight``, ``repeat`` or ``samples``
    (:class:`~gpupipe.config.sourcelist.SourceEntry`): a mix, labels matched by class name.
    ``classes``: the dataset's class list, in label order (``None``: the one the splits'
    indexes agree on). ``image_column`` / ``label_column``: the Parquet columns (``None``:
    detected). ``targets``: what a sample brings beside its image for detection or segmentation
    — ``boxes``, ``masks`` or ``boxes+masks`` (docs/targets.md; ``none``: classification).
    ``annotations``: the COCO ``instances_*.json`` of an image folder (``None``: found beside
    it); with several splits, a mapping from split to file."""

    train: str | tuple[str, ...] | tuple[SourceEntry, ...] | None = None
    val: str | tuple[str, ...] | tuple[SourceEntry, ...] | None = None
    test: str | tuple[str, ...] | tuple[SourceEntry, ...] | None = None
    predict: str | tuple[str, ...] | tuple[SourceEntry, ...] | None = None
    classes: tuple[str, ...] | None = None
    image_column: str | None = None
    label_column: str | None = None
    targets: tuple[str, ...] | str = ()  # normalised to a tuple of TARGET_KINDS
    annotations: str | Mapping[str, str] | None = None
    storage_options: Secrets = field(default_factory=Secrets)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", target_kinds(self.targets, "source.targets"))
        if isinstance(self.annotations, Mapping):
            for split in self.annotations:
                _check_split(split, "source.annotations")
        if not isinstance(self.storage_options, Secrets):
            object.__setattr__(self, "storage_options", Secrets(self.storage_options))
        if self.classes is not None:
            object.__setattr__(self, "classes", check_class_names(self.classes, "source.classes"))


@dataclass(frozen=True)
class LoaderConfig:
    """Batches and where they go. ``num_workers: null`` lets gpupipe choose from the machine."""

    batch_size: int = 64
    eval_batch_size: int | None = None
    num_workers: int | None = None
    prefetch: int = 1
    device: str | None = None
    batch_format: BatchFormat = BatchFormat.TUPLE
    augment_in: AugmentPlace = AugmentPlace.LOADER
    log_metrics: bool = True  # GpuDataModule: the data path's numbers in the trainer's loggers, under data/

    def __post_init__(self) -> None:
        for name in ("batch_size", "eval_batch_size", "prefetch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"loader.{name}: must be >= 1, got {value}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"loader.num_workers: must be >= 0, got {self.num_workers}")


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline needs; :meth:`split` gives one split's loader settings
    (``GpuLoader(config.split("train"))``)."""

    source: SourceConfig = field(default_factory=SourceConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    augment: tuple[TransformSpec, ...] = ()
    eval_augment: tuple[TransformSpec, ...] | None = None
    mix: TransformSpec | None = None
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    seed: int = 0

    def split(self, name: str = "train") -> SplitConfig:
        """Everything ``name``'s loader needs, with the per-split decisions made: training
        shuffles, drops the last partial batch (``stream.shuffle`` / ``stream.drop_last``),
        crops as ``decode.resize`` says and runs ``augment`` and ``mix``; the other splits
        keep order and every sample (one process ends with a short batch, as torch's DataLoader;
        ranks pad their tails to equal steps, ``valid=False``), resize the shorter side and take the
        centre instead of a random crop, use ``eval_batch_size``, and run ``eval_augment``
        (by default the deterministic steps of ``augment``: resize, crop, cast, normalize)."""
        from gpupipe.config.split import SplitConfig
        from gpupipe.sources.mixed import MixedSource
        from gpupipe.sources.source import Source

        urls = getattr(self.source, self.checked_split(name))
        src = self.source
        source: Source | MixedSource
        if is_source_list(urls):
            source = mixed_source(urls, f"source.{name}", storage_options=src.storage_options, classes=src.classes,
                                  image_column=src.image_column, label_column=src.label_column, targets=src.targets)
        else:
            source = Source(url=urls, storage_options=src.storage_options, classes=src.classes,
                            image_column=src.image_column, label_column=src.label_column, targets=src.targets,
                            annotations=self.annotations_of(name))
        train = name == "train"
        decode = replace(self.decode, seed=self.seed)  # one seed: the top-level one
        if not train and decode.resize is ResizeMode.RANDOM_CROP:
            decode = replace(decode, resize=ResizeMode.SHORTER)
        if train:
            augment = self.augment
        else:
            augment = self.eval_augment if self.eval_augment is not None else \
                tuple(s for s in self.augment if s.name in _EVAL_SAFE)
        return SplitConfig(
            source=source, name=name,
            batch_size=self.loader.batch_size if train else (self.loader.eval_batch_size or self.loader.batch_size),
            stream=replace(self.stream, shuffle=self.stream.shuffle and train, drop_last=self.stream.drop_last and train),
            decode=decode, augment=augment, mix=self.mix if train else None, classes=self.source.classes,
            num_workers=self.loader.num_workers, prefetch=self.loader.prefetch, device=self.loader.device,
            seed=self.seed).with_decode_from_augment(self.augment)

    def annotations_of(self, split: str) -> str | None:
        """``split``'s COCO annotations file: ``source.annotations`` itself, its entry for ``split``
        when it is a mapping, ``None`` when neither names one (found beside the images)."""
        given = self.source.annotations
        if given is None or isinstance(given, str) and len(self.split_urls()) <= 1:
            return given
        if isinstance(given, str):
            raise ConfigError(f"source.annotations: one file ({given}) for the splits {', '.join(self.split_urls())}; "
                              "give one per split: {train: .../instances_train.json, val: .../instances_val.json}")
        return given.get(split)

    def split_urls(self) -> dict[str, str]:
        """Each configured split's URL (the first, for a list), for messages."""
        urls = {s: getattr(self.source, s) for s in SPLITS}
        first = {s: u if isinstance(u, str) else u[0] for s, u in urls.items() if u}
        return {s: u if isinstance(u, str) else (u.url if isinstance(u.url, str) else u.url[0]) for s, u in first.items()}

    def checked_split(self, split: str) -> str:
        _check_split(split)
        if getattr(self.source, split) is None:
            raise ConfigError(f"source.{split}: not set; add the URL of the {split} shards to the config")
        return split

    def to_dict(self) -> dict:
        """Plain data (YAML-able) with storage option values replaced by ``'***'``."""
        out = plain(self)
        del out["stream"]["on_error"], out["decode"]["seed"]  # derived from decode.on_error and seed
        out["source"]["storage_options"] = {k: "***" for k in self.source.storage_options}
        return out


def split_classes(loader) -> tuple[str, ...]:
    """The class list in a :class:`~gpupipe.loader.gpu.GpuLoader`'s index (``()``: none listed)."""
    return loader.classes


def eval_transforms(transforms: Any) -> Any:
    """What the evaluation splits run by default when ``augment`` is a transform given in Python,
    as :meth:`PipelineConfig.split` does for specs: the deterministic steps (resize, crop, cast,
    normalize) of a ``gpupipe.transforms`` pipeline (``from_torchvision``'s too); ``None`` when
    it has none. Other callables cannot be read: a ``ConfigError`` asks for ``eval_augment``."""
    from gpupipe.augment.base import Transform
    from gpupipe.augment.compose import Compose

    if isinstance(transforms, Compose):
        steps = [t for t in transforms.transforms if type(t).__name__ in _EVAL_SAFE]
        return Compose(steps, fuse=transforms.fuse) if steps else None
    if isinstance(transforms, Transform):
        return transforms if type(transforms).__name__ in _EVAL_SAFE else None
    raise ConfigError(f"eval_augment: not given, and augment ({type(transforms).__name__}) is not a gpupipe.transforms "
                      "pipeline whose deterministic steps could be taken for validation; give eval_augment too "
                      "(e.g. gpupipe.transforms.from_torchvision(your_val_transforms))")


def _check_split(split: str, setting: str = "split") -> None:
    if split not in SPLITS:
        raise ConfigError(f"{setting}: unknown split {split!r}; choose from {', '.join(SPLITS)}")


# ------------------------------------------------------------------------------------ loading

def load_config(config: str | os.PathLike | Mapping[str, Any], *,
                environ: Mapping[str, str] | None = None) -> PipelineConfig:
    """Read a YAML file (local path or fsspec URL) or take a mapping; return the typed config.

    Raises :class:`ConfigError` naming the key path for anything it cannot use.
    """
    if isinstance(config, Mapping):
        return parse_config(config, environ=environ)
    return parse_config(read_yaml(config), environ=environ, origin=str(config))


def read_yaml(path: str | os.PathLike) -> Any:
    """Safe-load one YAML document; errors name the file, line and column."""
    import fsspec
    import yaml

    try:
        with fsspec.open(str(path), "r", encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{at}: invalid YAML: {problem}") from None


def parse_config(data: Any, *, environ: Mapping[str, str] | None = None, origin: str = "config") -> PipelineConfig:
    """A mapping (as read from YAML) → :class:`PipelineConfig`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a mapping at the top level, got {type(data).__name__}")
    if "data" in data:  # a LightningCLI file: the pipeline is its data section
        unknown = sorted(set(data) - LIGHTNING_SECTIONS - {"data"})
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown top-level key beside 'data'{suggest(unknown[0], LIGHTNING_SECTIONS)}")
        data = data["data"] or {}
        if not isinstance(data, Mapping):
            raise ConfigError("data: expected a mapping of the pipeline sections")
    data = _interpolate(data, environ if environ is not None else os.environ, "")
    return _pipeline(data)


def _pipeline(data: Mapping[str, Any]) -> PipelineConfig:
    known = {f.name for f in fields(PipelineConfig)}
    check_keys(data, known, "")
    source = _source(data.get("source") or {})
    stream_data = dict(data.get("stream") or {})
    for moved, to in (("on_error", "decode.on_error"),):
        if moved in stream_data:
            raise ConfigError(f"stream.{moved}: set {to} (one policy for streaming and decoding)")
    stream = build(StreamConfig, stream_data, "stream")
    decode_data = data.get("decode") or {}
    if isinstance(decode_data, Mapping) and "seed" in decode_data:
        raise ConfigError("decode.seed: set the top-level 'seed' (it keys decode crops and augmentation alike)")
    seed = coerce(data.get("seed", 0), int, "seed")
    size = decode_data.get("image_size") if isinstance(decode_data, Mapping) else None
    if isinstance(size, int) and not isinstance(size, bool):  # a square, as GpuLoader(image_size=224) takes it
        decode_data = {**decode_data, "image_size": [size, size]}
    decode = replace(build(DecodeConfig, decode_data, "decode"), seed=seed)
    augment = parse_augment(data.get("augment"), "augment", decode.image_size)
    eval_augment = None if data.get("eval_augment") is None else parse_augment(data["eval_augment"], "eval_augment",
                                                                            decode.image_size)
    mix = None if data.get("mix") is None else parse_spec(data["mix"], "mix", MIXES)
    if mix is not None and mix.args.get("num_classes") is None:  # the loader's labels are class indices
        raise ConfigError(f"mix ({mix.name}): set num_classes (the loader's labels are class indices)")
    if mix is not None and not any(s.name in ("ToDtype", "ToTensor") for s in augment):
        raise ConfigError(f"mix ({mix.name}): needs float images; end augment with a ToDtype")
    loader = build(LoaderConfig, data.get("loader") or {}, "loader")
    stream = replace(stream, on_error=decode.on_error)
    return PipelineConfig(source=source, stream=stream, decode=decode, augment=augment, eval_augment=eval_augment,
                          mix=mix, loader=loader, seed=seed)


def _source(data: Any) -> SourceConfig:
    if isinstance(data, (str, list)):  # `source: URL` is the train split
        data = {"train": data}
    if not isinstance(data, Mapping):
        raise ConfigError(f"source: expected a URL or a mapping of splits, got {type(data).__name__}")
    options = data.get("storage_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError("source.storage_options: expected a mapping (values are kept secret)")
    rest = {k: v for k, v in data.items() if k != "storage_options"}
    mixes = {k: parse_sources(v, f"source.{k}") for k, v in rest.items() if k in SPLITS and is_source_list(v)}
    config = build(SourceConfig, {k: v for k, v in rest.items() if k not in mixes}, "source")
    return replace(config, storage_options=Secrets(options), **mixes)


def _interpolate(value: Any, environ: Mapping[str, str], path: str) -> Any:
    if isinstance(value, str):
        def substitute(m: re.Match) -> str:
            if m.group(1) in environ:
                return environ[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(f"{path or 'config'}: environment variable {m.group(1)} is not set "
                              f"(write ${{{m.group(1)}:-default}} for a default)")
        return _ENV.sub(substitute, value)
    if isinstance(value, Mapping):
        return {k: _interpolate(v, environ, join_path(path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    return value
