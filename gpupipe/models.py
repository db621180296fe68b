"""Models ``gpupipe fit`` may build: an allowlist of architectures by name, never a class path.

``ImageClassifier(arch=...)`` is a small LightningModule for trying a pipeline end to
end (``gpupipe fit --config configs/quickstart.yaml``); bring your own model for real
work by using :class:`~gpupipe.lightning.GpuDataModule` from Python.
"""
from __future__ import annotations

from typing import Any, Callable

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from gpupipe.errors import ConfigError

__all__ = ["ImageClassifier", "ARCHITECTURES", "small_cnn"]


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


def _torchvision(name: str) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        try:
            import torchvision.models
        except ImportError as exc:
            raise ConfigError(f"model.arch: {name!r} needs torchvision (pip install torchvision)") from exc
        return getattr(torchvision.models, name)(num_classes=num_classes)
    return build


ARCHITECTURES: dict[str, Callable[[int], nn.Module]] = {
    "small_cnn": small_cnn,
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
}


class ImageClassifier(pl.LightningModule):
    """Cross-entropy classifier over ``(images, labels)`` batches (or dict batches with
    ``images``/``labels``/``valid``: padding and replaced images do not count)."""

    def __init__(self, arch: str = "small_cnn", num_classes: int = 10, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 5e-4) -> None:
        super().__init__()
        if arch not in ARCHITECTURES:
            raise ConfigError(f"model.arch: unknown {arch!r}; choose from {', '.join(ARCHITECTURES)}")
        self.save_hyperparameters()
        self.net = ARCHITECTURES[arch](num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.float() if not images.is_floating_point() else images)

    def _step(self, batch: Any, name: str) -> torch.Tensor:
        images, labels, valid = _unpack(batch)
        logits = self(images)
        loss = F.cross_entropy(logits[valid], labels[valid]) if valid is not None else F.cross_entropy(logits, labels)
        self.log(f"{name}_loss", loss, prog_bar=True, batch_size=len(labels), sync_dist=name != "train")
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self):
        hp = self.hparams
        return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)


def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if isinstance(batch, dict):
        return batch["images"], batch["labels"], batch.get("valid")
    images, labels = batch[0], batch[1]
    return images, labels, None
