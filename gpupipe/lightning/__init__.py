"""``GpuDataModule``: train / val / test / predict loaders from one config, for Lightning.

Rank, world size and device come from the trainer. Every rank gets the same exact
``len``. The training loader's position rides in the DataModule's ``state_dict``,
so ``trainer.fit(..., ckpt_path=...)`` continues with exactly the samples of the
epoch not yet trained on: a batch counts as delivered when it reaches
``on_after_batch_transfer`` in the training loop, not when Lightning fetches it
ahead. Validation uses its own loaders and never moves the training stream.

Augmentation runs where ``loader.augment_in`` says: ``loader`` (default; in the
loader's decode thread, one batch ahead, on a side CUDA stream) or
``on_after_batch_transfer`` (in the step's own stream: simpler to profile, no overlap).
"""
from __future__ import annotations

import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch

from gpupipe.config.keywords import python_transforms
from gpupipe.config.schema import SPLITS, AugmentPlace, BatchFormat, PipelineConfig, eval_transforms, load_config
from gpupipe.core.errors import ConfigError
from gpupipe.core.types import World
from gpupipe.loader.metrics import Meter, RankRow, Reading, gather_rows, rates, reading, spread
from gpupipe.plan import steps_per_rank
from gpupipe.sources.classes import agreed_classes, describe
from gpupipe.sources.splits import split_folders

if TYPE_CHECKING:
    from gpupipe.loader.gpu import GpuLoader

__all__ = ["GpuDataModule", "DataMetrics"]

log = logging.getLogger(__name__)
STATE_KEY = "gpupipe_train_loader"


class GpuDataModule(pl.LightningDataModule):
    """Loaders for every split named in ``source``, built from one :class:`PipelineConfig`.

    Pass a config (a ``PipelineConfig``, a YAML path or a mapping) or its sections as
    keyword arguments — the form LightningCLI fills from a file's ``data:`` section.

    ``augment`` (the training split) and ``eval_augment`` (val, test, predict) also take
    transforms given in Python, as ``GpuLoader(augment=...)`` does: a ``gpupipe.transforms``
    pipeline, ``gpupipe.transforms.from_torchvision(...)``'s result, a list of transforms, or any
    callable on the image batch — beside a config too, when it leaves that section unset.
    Without ``eval_augment`` the evaluation splits run the deterministic steps of a gpupipe
    ``augment`` (resize, crop, cast, normalize), as they do for a config's.

    ``source`` naming a dataset's root that holds ``train/`` and ``val/`` (``valid/``,
    ``validation/``; and ``test/``) folders, and no other split, reads each split from its
    folder (:func:`~gpupipe.sources.splits.split_folders`), instead of taking the split folders
    for classes.
    """

    def __init__(self, config: str | dict | None = None, *, source: str | dict | None = None,
                 stream: dict | None = None, decode: dict | None = None,
                 augment: str | list | Any | None = None, eval_augment: str | list | Any | None = None,
                 loader: dict | None = None, seed: int = 0) -> None:
        super().__init__()
        built = {"augment": python_transforms(augment), "eval_augment": python_transforms(eval_augment)}
        objects = {name: value for name, value in built.items() if value is not None}  # given in Python
        sections = {"source": source, "stream": stream, "decode": decode, "augment": augment,
                    "eval_augment": eval_augment, "loader": loader}
        given = {k: v for k, v in sections.items() if v is not None and k not in objects}
        if config is not None and given:
            raise ConfigError(f"GpuDataModule: pass a config or sections ({', '.join(given)}), not both")
        self.config: PipelineConfig
        if isinstance(config, PipelineConfig):  # (not in the signature: LightningCLI would parse it)
            self.config = config
        elif config is not None:
            self.config = load_config(config)
        else:
            self.config = load_config({**given, "seed": seed})
        self.config = _with_split_folders(self.config)
        self._transforms = _transform_objects(self.config, objects)
        self.save_hyperparameters(self.config.to_dict())  # storage option values redacted
        self._loaders: dict[str, _SplitLoader] = {}
        self._pending_state: Mapping | None = None
        self._classes: tuple[str, ...] | None = None  # known after setup()
        if self.config.source.val is None:  # a train-only dataset: Lightning skips validation
            # the instance's hook on purpose (see _Unset), which a type checker does not allow
            self.val_dataloader = _Unset(self.config, "val")  # type: ignore[method-assign, assignment]

    # -- loaders -------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        trainer = self._trainer_or_none()
        if stage == "fit" and self.config.loader.log_metrics and trainer is not None \
                and not any(isinstance(c, DataMetrics) for c in trainer.callbacks):
            trainer.callbacks.append(DataMetrics())  # loader.log_metrics: false turns it off
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}
        for split in wanted.get(stage, SPLITS):
            if split not in self._loaders and getattr(self.config.source, split) is not None:
                self._loaders[split] = _SplitLoader(self, split)
        self._classes = self._check_classes()

    @property
    def classes(self) -> tuple[str, ...]:
        """The dataset's class list (label order): ``source.classes``, else the one the splits'
        indexes agree on; ``()`` when neither names any. Reads the indexes if ``setup`` has not."""
        if self._classes is None:
            self.setup("fit" if self.config.source.train is not None else "validate")
        return self._classes or ()

    @property
    def num_classes(self) -> int | None:
        """``len(classes)``, or ``None`` when the data does not say."""
        return len(self.classes) or None

    def _check_classes(self) -> tuple[str, ...]:
        """One class list across the splits built so far; a mix must have as many classes."""
        found = {split: loader.gpu.classes for split, loader in self._loaders.items()}
        kinds = {split: loader.gpu.encoded.source.kind for split, loader in self._loaders.items()}
        classes = agreed_classes(found, self.config.source.classes, self.config.split_urls(), kinds)
        mix = self.config.mix
        if mix is not None and classes and mix.args.get("num_classes") != len(classes):
            raise ConfigError(f"mix.num_classes: {mix.args.get('num_classes')}, but the data has {describe(classes)}; "
                              f"set mix.num_classes: {len(classes)}")
        return classes

    def _loader(self, split: str) -> _SplitLoader:
        if split not in self._loaders:
            self.config.checked_split(split)  # raises naming source.<split> when it is not set
            self.setup({"train": "fit", "val": "validate"}.get(split, split))
        return self._loaders[split]

    def train_dataloader(self) -> _SplitLoader:
        return self._loader("train")

    def val_dataloader(self) -> _SplitLoader:
        return self._loader("val")

    def test_dataloader(self) -> _SplitLoader:
        return self._loader("test")

    def predict_dataloader(self) -> _SplitLoader:
        return self._loader("predict")

    # -- hooks -----------------------------------------------------------------------------------
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self._trainer_or_none()
        split = _split_of(trainer)
        if split is None or split not in self._loaders:
            return batch
        loader = self._loaders[split]
        if split == "train":
            loader.gpu.ledger.commit()  # this batch reaches a training step: it now counts
        return loader.augment_after_transfer(batch)

    # -- resume ----------------------------------------------------------------------------------
    # Lightning restores the DataModule before its loops: which epoch it resumes in is known
    # only when the training epoch starts. A checkpoint written at the end of an epoch cut
    # short (``limit_train_batches``, ``max_steps``) holds a position inside that epoch, and
    # Lightning goes on with the next: the saved position is then dropped, not checked
    # against the new plan (any change is allowed at an epoch boundary). So the state waits
    # here until the training loader's first pass (``_SplitLoader.__iter__``).
    def state_dict(self) -> dict:
        if self._pending_state is not None:  # restored, not yet resumed: the position is the saved one
            return {STATE_KEY: self._pending_state}
        if "train" in self._loaders:
            return {STATE_KEY: self._loaders["train"].gpu.state_dict()}
        return {}

    def load_state_dict(self, state_dict: Mapping) -> None:
        state = state_dict.get(STATE_KEY)
        if state is not None:
            self._pending_state = state  # applied when the training loader's next pass starts

    def _resume_into(self, loader: GpuLoader, epoch: int | None) -> None:
        """Give the training loader the restored state if its pass continues the saved one:
        ``epoch`` (the trainer's; None without a trainer) is the saved epoch, unfinished."""
        state, self._pending_state = self._pending_state, None
        if state is None:
            return
        try:
            continues = epoch is None or (int(state["epoch"]) == epoch and not state["complete"])
        except (KeyError, TypeError, ValueError):
            continues = True  # not a state this version reads: the loader says why
        if continues:
            loader.load_state_dict(state)

    def _trainer_or_none(self):
        try:
            return self.trainer
        except RuntimeError:
            return None


def _with_split_folders(config: PipelineConfig) -> PipelineConfig:
    """``config`` reading each split from its folder when its one source is a dataset's root
    holding ``train/``, ``val/``, ... (:func:`~gpupipe.sources.splits.split_folders`)."""
    src = config.source
    if any(getattr(src, s) is not None for s in SPLITS if s != "train"):
        return config
    found: dict[str, Any] = dict(split_folders(src.train, src.storage_options))
    if not found:
        return config
    log.info("gpupipe: %s holds the splits %s; each is read from its folder", src.train, ", ".join(found))
    return replace(config, source=replace(src, **found))


def _transform_objects(config: PipelineConfig, objects: Mapping[str, Any]) -> dict[str, Any]:
    """Each split's transforms given in Python (``train``: ``augment``; the others: ``eval_augment``,
    else the deterministic steps of ``augment``); a section set in the config too raises."""
    for name in objects:
        if getattr(config, name):
            raise ConfigError(f"{name}: given twice, in the config and as a Python transform; give it once")
    out: dict[str, Any] = {}
    if "augment" in objects:
        out["train"] = objects["augment"]
    evaluation = objects.get("eval_augment")
    if evaluation is None and "augment" in objects and config.eval_augment is None and \
            any(getattr(config.source, s) is not None for s in SPLITS if s != "train"):
        evaluation = eval_transforms(objects["augment"])
        if evaluation is None:  # nothing deterministic in it: the evaluation splits run no transforms
            out.update({s: () for s in SPLITS if s != "train"})
    if evaluation is not None:
        out.update({s: evaluation for s in SPLITS if s != "train"})
    return out


class _Unset:
    """The loader hook of a split the config does not set. Lightning takes a hook it sees
    through ``__wrapped__`` as the base class's for "not defined", so it runs no loop for the
    split (no sanity check, no val loader warnings); called directly, it says what to set."""

    def __init__(self, config: PipelineConfig, split: str) -> None:
        self.config, self.split = config, split
        self.__wrapped__ = getattr(pl.LightningDataModule, f"{split}_dataloader")

    def __call__(self) -> None:
        self.config.checked_split(self.split)  # raises: source.<split> is not set


class DataMetrics(pl.Callback):
    """Logs the training loader's data-path numbers (:mod:`gpupipe.loader.metrics`) under ``data/``
    to every logger of the trainer, every ``log_every_n_steps`` steps, each the rate since the
    previous log: ``data/images_per_s``, ``data/wait_ms_per_step``, ``data/wait_share`` (the step's
    wait for data over the time: is data the bottleneck?), ``data/decode_busy``,
    ``data/augment_busy``, ``data/bytes_per_s``, ``data/read_bytes_per_s``, ``data/io_wait_share``, ``data/requests_per_s``,
    ``data/cache_hit_rate``, ``data/skipped``; at each
    epoch's end, on rank 0, the ranks' spread (:meth:`on_train_epoch_end`).

    ``GpuDataModule`` adds one itself (``loader.log_metrics``); give ``loader`` to use it with a
    ``GpuLoader`` in a DataModule of your own."""

    def __init__(self, loader: GpuLoader | None = None) -> None:
        self.loader = loader
        self._meter: Meter | None = None
        self._epoch: Reading | None = None  # the loader's counters when this epoch began

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = self.loader or _train_loader(trainer)
        if loader is not None and (self._meter is None or self._meter.loader is not loader):
            self._meter = Meter(loader)
        self._epoch = reading(loader) if loader is not None else None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every rank's wait for data this epoch, in one collective; rank 0 logs the spread
        (``data/wait_ms_max``, ``data/wait_ms_median``, ``data/slowest_rank``,
        ``data/images_per_s_min``) and warns when the slowest rank waited more than twice the
        median, naming it and its host."""
        if self._meter is None or self._epoch is None:
            return
        epoch = rates(self._epoch, reading(self._meter.loader))
        rows = gather_rows(RankRow(trainer.global_rank, socket.gethostname(), epoch["wait_ms_per_step"],
                                   epoch["images_per_s"]))
        if trainer.global_rank != 0:
            return
        numbers, warning = spread(rows)
        if warning is not None:
            log.warning("gpupipe: epoch %d: %s", trainer.current_epoch, warning)
        for logger in trainer.loggers:
            logger.log_metrics({f"data/{k}": v for k, v in numbers.items()}, step=trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._meter is None or trainer.global_step % max(1, getattr(trainer, "log_every_n_steps", 50)):
            return
        metrics = {f"data/{k}": v for k, v in self._meter.read().items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def _train_loader(trainer: pl.Trainer) -> GpuLoader | None:
    """A GpuDataModule's training GpuLoader (another loader is given to DataMetrics itself)."""
    dm = getattr(trainer, "datamodule", None)
    return dm._loaders["train"].gpu if isinstance(dm, GpuDataModule) and "train" in dm._loaders else None


def _split_of(trainer) -> str | None:
    if trainer is None:
        return None
    if trainer.training:
        return "train"
    if trainer.sanity_checking or trainer.validating:
        return "val"
    if trainer.testing:
        return "test"
    if trainer.predicting:
        return "predict"
    return None


class _SplitLoader:
    """One split's :class:`GpuLoader`, shaped for Lightning: the epoch comes from the trainer,
    batches come out in ``loader.batch_format``, and ``len`` is exact."""

    def __init__(self, dm: GpuDataModule, split: str) -> None:
        from gpupipe.loader.gpu import GpuLoader

        self.dm, self.split, cfg = dm, split, dm.config
        trainer = dm._trainer_or_none()
        world, device = None, None
        if trainer is not None:
            world = World(rank=trainer.global_rank, world_size=trainer.world_size, local_rank=trainer.local_rank)
            device = trainer.strategy.root_device
        settings = cfg.split(split)
        if split in dm._transforms:  # transforms given in Python (a leading torchvision crop: the decode's size)
            settings = replace(settings, augment=dm._transforms[split]).with_decode_from_augment(
                dm._transforms.get("train", ()))
        self.after_transfer = cfg.loader.augment_in is AugmentPlace.AFTER_TRANSFER
        self.stage = None
        if self.after_transfer:  # the loader decodes only; the stage runs in on_after_batch_transfer
            self.stage = settings.augment_stage()
            settings = replace(settings, augment=(), mix=None)
        self.gpu = GpuLoader(settings, world=world, device=device)
        if self.stage is not None:
            self.stage.to(self.gpu.device)
        if split == "train":
            self.gpu.ledger.defer()
        self.format = cfg.loader.batch_format

    def __len__(self) -> int:
        # Lightning reads len() once (after restoring a checkpoint) and takes it as every epoch's
        # length for the whole fit; an epoch ends earlier when the loader runs out. An epoch resumed
        # under another world size or batch size has a length of its own: the larger of the two.
        # A restored state waits in the DataModule until the first pass: count its epoch too.
        pending = self.dm._pending_state if self.split == "train" else None
        resumed = self.gpu.ledger.steps_if_loaded(pending) if pending is not None else 0
        return max(len(self.gpu), steps_per_rank(self.gpu.ledger.spec), resumed)

    # Lightning saves a loader's state_dict as of when *it* asks, which may be after it fetched
    # ahead; the exact position rides in GpuDataModule.state_dict instead. These two tell
    # Lightning the loader is resumable (no "not resumable" warning) and carry nothing.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        trainer = self.dm._trainer_or_none()
        if self.split == "train":
            self.dm._resume_into(self.gpu, trainer.current_epoch if trainer is not None else None)
            if trainer is not None:
                self.gpu.set_epoch(trainer.current_epoch)
        for batch in self.gpu:
            yield self._format(batch)

    def _format(self, batch) -> Any:
        """The batch as the training step sees it; with ``augment_in: on_after_batch_transfer``
        the DecodedBatch itself travels (Lightning moves its tensors) and is shaped later."""
        if self.after_transfer or self.format is BatchFormat.BATCH:
            return batch
        if self.format is BatchFormat.DICT:
            return _as_dict(batch)
        return tuple(batch)

    def augment_after_transfer(self, batch: Any) -> Any:
        """Apply the transforms in ``on_after_batch_transfer`` (``augment_in``) and shape the batch."""
        if not self.after_transfer:
            return batch
        if self.stage is not None:
            batch = self.stage(batch)
        if self.format is BatchFormat.BATCH:
            return batch
        return _as_dict(batch) if self.format is BatchFormat.DICT else tuple(batch)


def _as_dict(batch) -> dict[str, Any]:
    """``batch_format: dict``; with targets, ``targets`` is torchvision's list of per-image dicts
    and ``packed_targets`` the packed :class:`~gpupipe.core.targets.Targets`."""
    out = {"images": batch.images, "labels": batch.labels, "valid": batch.valid,
           "sample_ids": batch.sample_ids.to(batch.images.device), "epoch": torch.tensor(batch.epoch)}
    if batch.targets is not None:
        out["targets"], out["packed_targets"] = batch.targets.per_image(), batch.targets
    return out
