"""Run by tests/lightning/test_lightning.py: ``Trainer(devices=2, strategy="ddp")`` on the CPU (gloo).

Lightning's launcher starts rank 1 by running this script again. Writes each rank's
ledger of (epoch, sample ids) per step and what the test should expect.
"""
from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
from datagen import write_dataset
from lightning.pytorch.strategies import DDPStrategy
from lightning_util import LedgerModel, pipeline, real_jpeg

from gpupipe.lightning import GpuDataModule

COUNTS = (13, 0, 7, 9)  # uneven, one empty shard: 29 samples; batch 4, 2 ranks -> 3 steps each (24 samples)


def main(out: Path) -> None:
    if not (out / "index.json").exists():  # rank 0 writes; the launcher starts rank 1 after this point
        write_dataset(str(out), list(COUNTS), image=real_jpeg, num_classes=4)
    dm = GpuDataModule(pipeline(str(out / "part-{0000..0003}.tar")))
    model = LedgerModel()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=60)),
                         max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    (out / f"ledger-{trainer.global_rank}.json").write_text(json.dumps(model.ledger))
    if trainer.global_rank == 0:
        total = sum(COUNTS)
        steps = total // (4 * 2)
        (out / "expected.json").write_text(json.dumps({"steps": steps, "per_epoch": steps * 8, "total": total}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
