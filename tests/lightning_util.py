"""Shared by the Lightning tests and the 2-process DDP script: tiny JPEG shards and a
model that records, per training step, which sample ids it was given (the ledger)."""
from __future__ import annotations

import numpy as np
import torch

from gpupipe.formats.writer import ShardSink
from gpupipe.lightning.models import ImageClassifier
from gpupipe.tools.synth import synthetic_jpeg


def write_split(root: str, n: int, *, shard_size: int, first_id: int = 0) -> str:
    """``n`` real 32x32 JPEGs (label = id % 4) in shards of ``shard_size`` under ``root``."""
    rng = np.random.default_rng(first_id)
    with ShardSink(root, shard_size=shard_size) as sink:
        for i in range(first_id, first_id + n):
            sink.write(f"s{i:05d}", {"jpg": synthetic_jpeg(rng, (32, 32)), "cls": str(i % 4).encode()})
    return root


def real_jpeg(sample_id: int) -> bytes:
    """A real 32x32 JPEG, the same for the same id."""
    return synthetic_jpeg(np.random.default_rng(sample_id), (32, 32))


def pipeline(train: str, val: str | None = None, **loader) -> dict:
    return {"source": {"train": train, "val": val}, "decode": {"image_size": [16, 16], "backend": "auto"},
            "augment": "simple", "loader": {"batch_size": 4, "batch_format": "dict", "num_workers": 0, **loader},
            "seed": 7}


class Interrupted(Exception):
    """Stands for a killed job."""


class LedgerModel(ImageClassifier):
    """Records (epoch, sorted sample ids) of every training step; can stop at a global step."""

    def __init__(self, stop_at_step: int | None = None) -> None:
        super().__init__(arch="small_cnn", num_classes=4, lr=0.01)
        self.ledger: list[tuple[int, list[int]]] = []
        self.val_ids: list[int] = []
        self.stop_at_step = stop_at_step

    def training_step(self, batch, batch_idx):
        if self.stop_at_step is not None and self.global_step == self.stop_at_step:
            raise Interrupted(f"stopped at step {self.global_step}")
        assert batch["images"].dtype == torch.float32 and batch["images"].shape[1:] == (3, 16, 16)
        self.ledger.append((self.current_epoch, batch["sample_ids"][batch["valid"]].tolist()))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_ids += batch["sample_ids"][batch["valid"]].tolist()
        return super().validation_step(batch, batch_idx)
