"""Run by tests/lightning/test_lightning.py: train with a checkpoint after every step, appending each
step's (epoch, sample ids) to a ledger file as it happens, so the test can SIGKILL this
process at any point and resume from the last checkpoint in a fresh one.

    python lightning_kill_script.py DATA_DIR OUT_DIR LEDGER [CKPT]
"""
from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl
from lightning_util import LedgerModel, pipeline

from gpupipe.lightning import GpuDataModule


class FileLedger(LedgerModel):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = open(path, "a", buffering=1)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.file.write(json.dumps([self.global_step, *self.ledger[-1]]) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def main(data: str, out: str, ledger: str, ckpt: str | None = None) -> None:
    saver = pl.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, callbacks=[saver],
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(FileLedger(ledger), datamodule=GpuDataModule(pipeline(data)), ckpt_path=ckpt)


if __name__ == "__main__":
    main(*sys.argv[1:])
