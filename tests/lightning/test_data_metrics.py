"""The data path's numbers in the trainer's logger (issue 38): GpuDataModule logs them under
``data/`` on its own, every ``log_every_n_steps``, to any logger (CSVLogger here), and they move
with load: a decode made slow raises the step's wait share; a slow model lowers it."""
from __future__ import annotations

import csv
import time

import pytest

pl = pytest.importorskip("lightning.pytorch")

from lightning_util import LedgerModel, write_split  # noqa: E402

from gpupipe.lightning import GpuDataModule  # noqa: E402


class SlowModel(LedgerModel):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s = sleep_s

    def training_step(self, batch, batch_idx):
        time.sleep(self.sleep_s)
        return super().training_step(batch, batch_idx)


def slow_augment(sleep_s: float):
    def augment(images):
        time.sleep(sleep_s)  # a decode/augment stage that cannot keep up
        return images.float() / 255
    return augment


def _fit(tmp_path, name: str, model, augment, log_metrics: bool = True) -> list[dict]:
    train = write_split(str(tmp_path / "train"), 48, shard_size=16) if not (tmp_path / "train").exists() \
        else str(tmp_path / "train")
    dm = GpuDataModule(source={"train": train}, decode={"image_size": [16, 16], "backend": "pil"}, augment=augment,
                       loader={"batch_size": 4, "batch_format": "dict", "num_workers": 0, "log_metrics": log_metrics})
    logger = pl.loggers.CSVLogger(str(tmp_path), name=name)
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=logger, log_every_n_steps=2,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               num_sanity_val_steps=0, default_root_dir=str(tmp_path)).fit(model, datamodule=dm)
    with open(f"{logger.log_dir}/metrics.csv") as f:
        return list(csv.DictReader(f))


def _column(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key)]


def test_the_data_module_logs_the_data_path_and_the_wait_share_follows_the_slow_side(tmp_path):
    fast_data = _fit(tmp_path, "slow_model", SlowModel(0.05), slow_augment(0.0))
    for key in ("images_per_s", "wait_ms_per_step", "wait_share", "decode_busy", "augment_busy", "bytes_per_s",
                "skipped"):
        assert _column(fast_data, f"data/{key}"), key  # a column, with values
    assert min(_column(fast_data, "data/images_per_s")) > 0 and max(_column(fast_data, "data/bytes_per_s")) > 0
    slow_data = _fit(tmp_path, "slow_data", SlowModel(0.0), slow_augment(0.05))
    share = {name: sum(v) / len(v) for name, v in (("fast", _column(fast_data, "data/wait_share")),
                                                   ("slow", _column(slow_data, "data/wait_share")))}
    print("wait share:", share)
    assert share["slow"] > share["fast"] + 0.3, share
    assert max(_column(slow_data, "data/augment_busy")) > 0.3


def test_log_metrics_false_turns_it_off(tmp_path):
    rows = _fit(tmp_path, "off", SlowModel(0.0), slow_augment(0.0), log_metrics=False)
    assert not any(k.startswith("data/") for r in rows for k in r if r[k])
