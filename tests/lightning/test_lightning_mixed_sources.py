"""GpuDataModule with ``source.train`` a list of sources (issue 35): a fit takes exactly the
draws of ``draw_sizes`` from each source every epoch, and validation reads its own split."""
from __future__ import annotations

import pytest

pl = pytest.importorskip("lightning.pytorch")

from lightning_util import LedgerModel, pipeline, write_split  # noqa: E402

from gpupipe.lightning import GpuDataModule  # noqa: E402
from gpupipe.plan import draw_sizes  # noqa: E402


def test_fit_on_a_mix_draws_each_source_as_weighted(tmp_path):
    a = write_split(str(tmp_path / "a"), 24, shard_size=8)
    b = write_split(str(tmp_path / "b"), 16, shard_size=8, first_id=1000)
    val = write_split(str(tmp_path / "val"), 8, shard_size=8, first_id=2000)
    config = pipeline([{"url": a, "weight": 1}, {"url": b, "weight": 1}], val)
    model, dm = LedgerModel(), GpuDataModule(config)
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
               num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path)).fit(model, datamodule=dm)
    want = draw_sizes([24, 16], weight=[1, 1])
    for epoch in (0, 1):
        ids = [i for e, step in model.ledger if e == epoch for i in step]  # global ids: b's come after a's 24
        assert (sum(i < 24 for i in ids), sum(i >= 24 for i in ids)) == want, epoch
    assert dm.train_dataloader().gpu.per_source == list(want)
    assert sorted(set(model.val_ids)) == list(range(8))
