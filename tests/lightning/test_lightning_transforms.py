"""GpuDataModule as a torchvision user reaches for it (issue 26): transforms given in Python per
split (a ``from_torchvision`` result, a gpupipe Compose, a function), and a dataset root holding
``train/`` and ``val/`` read as splits, under a real Lightning Trainer on tiny image folders."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning_util import LedgerModel  # noqa: E402

import gpupipe.transforms as T  # noqa: E402
from gpupipe.core.errors import ConfigError  # noqa: E402
from gpupipe.lightning import GpuDataModule  # noqa: E402
from gpupipe.sources.splits import split_folders  # noqa: E402
from gpupipe.tools.synth import synthetic_jpeg  # noqa: E402

N_TRAIN, N_VAL = 16, 8


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    """``root/train/c<k>/`` and ``root/val/c<k>/``: real 20x20 JPEGs in 4 classes (LedgerModel's head)."""
    base = tmp_path_factory.mktemp("splits")
    rng = np.random.default_rng(0)
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        for i in range(n):
            folder = base / split / f"c{i % 4}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{split}{i:03d}.jpg").write_bytes(synthetic_jpeg(rng, (20, 20)))
    return str(base)


def module(root: str, **kw) -> GpuDataModule:
    return GpuDataModule(source=root, decode={"image_size": [16, 16]},
                         loader={"batch_size": 4, "batch_format": "dict", "num_workers": 0, "device": "cpu"}, **kw)


def fit(dm: GpuDataModule, tmp_path) -> LedgerModel:
    model = LedgerModel()
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
               num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path)).fit(model, datamodule=dm)
    return model


def test_a_from_torchvision_pipeline_trains_and_its_deterministic_steps_validate(root, tmp_path):
    from torchvision.transforms import v2

    train = T.from_torchvision(v2.Compose([v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                                           v2.Normalize([0.5] * 3, [0.25] * 3)]))
    dm = module(root, augment=train)
    model = fit(dm, tmp_path)  # LedgerModel checks float32 (B, 3, 16, 16) in every training step
    assert sorted(i for _, ids in model.ledger for i in ids) == list(range(N_TRAIN))
    assert sorted(model.val_ids) == list(range(N_VAL))  # validated: the cast and Normalize ran there too
    val = dm._loaders["val"].gpu.augment.transforms
    assert [type(t).__name__ for t in val.transforms] == ["ToDtype", "Normalize"]  # no flip in validation


def test_each_split_takes_its_own_python_transforms(root, tmp_path):
    seen: list[torch.dtype] = []

    def eval_fn(images):
        seen.append(images.dtype)
        return images.float() / 255

    dm = module(root, augment=[T.RandomHorizontalFlip(), T.ToDtype(torch.float32)], eval_augment=eval_fn)
    model = fit(dm, tmp_path)
    assert len(model.ledger) == N_TRAIN // 4 and seen == [torch.uint8] * 2  # 2 val batches, through eval_fn
    assert dm._loaders["train"].gpu.augment.transforms is not eval_fn


def test_python_transforms_and_a_config_that_sets_them_too_are_refused(root):
    with pytest.raises(ConfigError, match="augment: given twice, in the config and as a Python transform"):
        GpuDataModule({"source": {"train": f"{root}/train"}, "augment": "simple"}, augment=T.RandomHorizontalFlip())
    with pytest.raises(ConfigError, match="eval_augment: not given, and augment \\(function\\) is not a "
                                          "gpupipe.transforms pipeline"):
        module(root, augment=lambda images: images.float())  # a val split, and nothing to derive its transforms
    dm = GpuDataModule({"source": {"train": f"{root}/train"}, "decode": {"image_size": [16, 16]}},
                       augment=T.RandomHorizontalFlip())  # a config beside an object: fine when it leaves augment unset
    assert "train" in dm._transforms


def test_a_dataset_root_is_read_as_its_splits(root):
    assert split_folders(root) == {"train": f"{root}/train/", "val": f"{root}/val/"}
    assert split_folders(f"{root}/train") == {}  # class folders, not splits
    dm = module(root, augment=T.Compose([T.ToDtype(torch.float32)]))
    assert dm.config.source.train == f"{root}/train/" and dm.config.source.val == f"{root}/val/"
    assert dm.classes == ("c0", "c1", "c2", "c3")
