"""Models ``gpupipe fit`` may build: an allowlist of architectures by name, never a class path.

``ImageClassifier(arch=...)`` is a small LightningModule for trying a pipeline end to
end (``gpupipe fit --config configs/quickstart.yaml``), and ``MaskSegmenter`` its counterpart
for data with masks (``source.targets: masks``; ``gpupipe fit --config configs/segmentation.yaml``);
bring your own model for real work by using :class:`~gpupipe.lightning.GpuDataModule` from Python.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from gpupipe.core.errors import ConfigError
from gpupipe.sources.classes import describe

__all__ = ["ImageClassifier", "MaskSegmenter", "ARCHITECTURES", "small_cnn", "small_fcn"]


def small_cnn(num_classes: int, width: int = 32) -> nn.Module:
    """Four conv blocks and a linear head: enough to see loss fall on the sample data."""
    layers: list[nn.Module] = []
    channels = 3
    for i in range(4):
        out = width * 2 ** min(i, 2)
        layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out),
                   nn.ReLU(inplace=True)]
        channels = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))


def small_fcn(num_classes: int, width: int = 16) -> nn.Module:
    """Three stride-2 conv blocks, a 1x1 classifier per position, and a bilinear upsampling back
    to the input size: the smallest model whose per-pixel loss visibly falls on generated masks."""
    layers: list[nn.Module] = []
    channels = 3
    for i in range(3):
        out = width * 2 ** i
        layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out),
                   nn.ReLU(inplace=True)]
        channels = out
    return _Upsampled(nn.Sequential(*layers, nn.Conv2d(channels, num_classes, 1)))


class _Upsampled(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.body(images), size=images.shape[-2:], mode="bilinear", align_corners=False)


def _torchvision(name: str) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        try:
            import torchvision.models
        except ImportError as exc:
            raise ConfigError(f"model.arch: {name!r} needs torchvision (pip install torchvision)") from exc
        except RuntimeError as exc:  # installed, but built for another torch (its C operators do not load)
            raise ConfigError(f"model.arch: {name!r} needs a torchvision built for this torch "
                              f"({torch.__version__}): {exc}") from exc
        return getattr(torchvision.models, name)(num_classes=num_classes)
    return build


ARCHITECTURES: dict[str, Callable[[int], nn.Module]] = {
    "small_cnn": small_cnn,
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
}


class _SgdModel(pl.LightningModule):
    """What the models here share: one ``_step(batch, split_name) -> loss`` for every split, and
    SGD with the ``lr``, ``momentum`` and ``weight_decay`` hyper-parameters."""

    def _step(self, batch: Any, name: str) -> torch.Tensor:
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self):
        hp = self.hparams
        return torch.optim.SGD(self.parameters(), lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"])


class ImageClassifier(_SgdModel):
    """Cross-entropy classifier over ``(images, labels)`` batches (or dict batches with
    ``images``/``labels``/``valid``: padding and replaced images do not count).

    ``num_classes=None`` (the default) takes the class count from the datamodule's
    ``classes`` (:attr:`GpuDataModule.classes <gpupipe.lightning.GpuDataModule.classes>`,
    from the indexes) at ``setup``, before the first step; a number given that disagrees
    with the data raises :class:`ConfigError` naming both. When the data names no classes,
    each batch's labels are checked against the head instead.
    """

    def __init__(self, arch: str = "small_cnn", num_classes: int | None = None, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 5e-4) -> None:
        super().__init__()
        if arch not in ARCHITECTURES:
            raise ConfigError(f"model.arch: unknown {arch!r}; choose from {', '.join(ARCHITECTURES)}")
        if num_classes is not None and (isinstance(num_classes, bool) or num_classes < 1):
            raise ConfigError(f"model.num_classes: must be >= 1, got {num_classes!r}")
        self.save_hyperparameters()
        self.net = ARCHITECTURES[arch](num_classes) if num_classes is not None else None
        self._check_labels = True  # until setup() has matched the head against the data's classes

    def setup(self, stage: str) -> None:
        """Match the head to the data's class count (build it, when ``num_classes`` is None)."""
        classes = _data_classes(self._trainer)
        wanted = self.hparams["num_classes"]  # (an AttributeDict, typed by Lightning as a MutableMapping)
        if wanted is None and not classes:
            raise ConfigError("model.num_classes: not set, and the data names no classes (its index.json lists "
                              "none); set --model.num_classes N, or source.classes in the data config")
        if wanted is not None and classes and wanted != len(classes):
            raise ConfigError(f"model.num_classes is {wanted} but the data has {describe(classes)}: the head "
                              f"must have one output per class; leave num_classes unset to take {len(classes)} "
                              "from the data")
        if self.net is None:
            self.net = ARCHITECTURES[self.hparams["arch"]](len(classes))
            self.save_hyperparameters({**self.hparams, "num_classes": len(classes)})  # checkpoints say the number
        self._check_labels = not classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            raise ConfigError("ImageClassifier: num_classes is not known yet; give num_classes, or train it with a "
                              "datamodule whose data names its classes")
        return self.net(images.float() if not images.is_floating_point() else images)

    def _step(self, batch: Any, name: str) -> torch.Tensor:
        images, labels, valid = _unpack(batch)
        logits = self(images)
        if self._check_labels:
            _check_labels(labels, valid, logits.shape[1])
        loss = F.cross_entropy(logits[valid], labels[valid]) if valid is not None else F.cross_entropy(logits, labels)
        self.log(f"{name}_loss", loss, prog_bar=True, batch_size=len(labels), sync_dist=name != "train")
        return loss


def _data_classes(trainer) -> tuple[str, ...]:
    """The class list the trainer's datamodule reports (``()``: none, or no datamodule)."""
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    return tuple(getattr(datamodule, "classes", None) or ())


def _check_labels(labels: torch.Tensor, valid: torch.Tensor | None, num_classes: int) -> None:
    """Class indices outside the head raise naming both (cross-entropy would say 'Target 5 is out
    of bounds', or assert on a GPU). Costs a device sync: used only when the data names no classes."""
    if labels.dim() != 1 or not labels.numel():
        return  # mixed labels are (B, C): their width is checked by the loss
    kept = labels[valid] if valid is not None else labels
    low, high = (int(kept.min()), int(kept.max())) if kept.numel() else (0, 0)
    if high >= num_classes:
        raise ConfigError(f"label {high} in a batch, but the model has {num_classes} classes (model.num_classes): "
                          f"set num_classes to the data's class count (more than {high})")
    if low < 0:
        raise ConfigError(f"label {low} in a batch: labels must be class numbers 0..{num_classes - 1}")


def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if isinstance(batch, dict):
        return batch["images"], batch["labels"], batch.get("valid")
    images, labels = batch[0], batch[1]
    return images, labels, None


SEGMENTERS: dict[str, Callable[[int], nn.Module]] = {"small_fcn": small_fcn}
IGNORE = 255  # a mask value the loss skips (VOC's "void" border)


class MaskSegmenter(_SgdModel):
    """Per-pixel cross-entropy over batches whose targets carry masks (``source.targets: masks``):
    ``(images, targets)`` with torchvision's per-image dicts, or dict batches with
    ``packed_targets``. Mask values are classes: 0 background, class ``c`` as ``c + 1``
    (docs/targets.md), 255 ignored. ``num_classes=None`` takes the data's class count + 1 (the
    background) at ``setup``. Padding and replaced images (``valid`` False) do not count."""

    def __init__(self, arch: str = "small_fcn", num_classes: int | None = None, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 5e-4) -> None:
        super().__init__()
        if arch not in SEGMENTERS:
            raise ConfigError(f"model.arch: unknown {arch!r} for masks; choose from {', '.join(SEGMENTERS)}")
        if num_classes is not None and (isinstance(num_classes, bool) or num_classes < 2):
            raise ConfigError(f"model.num_classes: must be >= 2 (the background and a class), got {num_classes!r}")
        self.save_hyperparameters()
        self.net = SEGMENTERS[arch](num_classes) if num_classes is not None else None

    def setup(self, stage: str) -> None:
        if self.net is not None:
            return
        classes = _data_classes(self._trainer)
        if not classes:
            raise ConfigError("model.num_classes: not set, and the data names no classes; set --model.num_classes "
                              "(the number of mask values, background included)")
        self.net = SEGMENTERS[self.hparams["arch"]](len(classes) + 1)
        self.save_hyperparameters({**self.hparams, "num_classes": len(classes) + 1})

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            raise ConfigError("MaskSegmenter: num_classes is not known yet; give num_classes")
        return self.net(images.float() if not images.is_floating_point() else images)

    def _step(self, batch: Any, name: str) -> torch.Tensor:
        images, masks, valid = _unpack_masks(batch)
        logits = self(images)
        masks = masks.long()
        if valid is not None:
            masks = masks.masked_fill(~valid.view(-1, 1, 1), IGNORE)
        high = int(masks[masks != IGNORE].max()) if (masks != IGNORE).any() else 0
        if high >= logits.shape[1]:
            raise ConfigError(f"mask value {high} in a batch, but the model has {logits.shape[1]} outputs "
                              "(model.num_classes): set it above the largest mask value")
        loss = F.cross_entropy(logits, masks, ignore_index=IGNORE)
        self.log(f"{name}_loss", loss, prog_bar=True, batch_size=len(images), sync_dist=name != "train")
        return loss


def _unpack_masks(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(images, (B, H, W) masks, valid or None) from a tuple or dict batch with masks."""
    if isinstance(batch, dict):
        packed = batch.get("packed_targets")
        masks = packed.masks if packed is not None else None
        images, valid = batch["images"], batch.get("valid")
    else:
        images, per_image = batch[0], batch[1]
        valid = None
        masks = torch.stack([t["masks"] for t in per_image]) if isinstance(per_image, list) and per_image and \
            "masks" in per_image[0] else None
    if masks is None:
        raise ConfigError("MaskSegmenter: the batches carry no masks; set source.targets: masks in the data config")
    return images, masks, valid
