"""Train a small CNN with Lightning from local shards, through ``GpuDataModule``.

What it shows: one pipeline config (here a mapping; a YAML file works the same) gives the
DataModule its train and val loaders — decode to 32x32 (DALI on a GPU, DALI CPU or Pillow
without), the docs' simple augmentation set, batches of 32 — and ``trainer.fit`` trains
``gpupipe.lightning.models.ImageClassifier`` on them. The shards are tiny tinted JPEGs whose class is
their colour (``examples/_shards.py``), so the validation loss visibly falls.

Run::

    python examples/train_lightning_local.py            # 2 epochs of 512 images
    python examples/train_lightning_local.py --fast     # under a minute on a laptop CPU
    python examples/train_lightning_local.py --root data/ --epochs 5
"""
from __future__ import annotations

import argparse
import os
import tempfile

from _shards import NUM_CLASSES, colour_shards


def pipeline(train: str, val: str, *, workers: int | None, storage_options: dict | None = None) -> dict:
    """The pipeline config (the same keys as a YAML file; see configs/quickstart.yaml)."""
    return {"source": {"train": train, "val": val, "storage_options": storage_options or {}},
            "decode": {"image_size": [32, 32], "on_error": "skip"},
            "augment": "simple",  # RandomAffine(20), RandomHorizontalFlip, float32, Normalize(ImageNet)
            "loader": {"batch_size": 32, "num_workers": workers}, "seed": 0}


def train(config, *, epochs: int, root: str, fast: bool) -> tuple[float, float]:
    """Fit ``ImageClassifier`` on the config's splits; (val loss before, val loss after)."""
    import lightning.pytorch as pl

    from gpupipe.lightning import GpuDataModule
    from gpupipe.lightning.models import ImageClassifier

    pl.seed_everything(0, verbose=False)
    dm = GpuDataModule(config)
    model = ImageClassifier(arch="small_cnn", num_classes=NUM_CLASSES, lr=0.05)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=not fast, enable_model_summary=False, default_root_dir=root)
    before = trainer.validate(model, datamodule=dm, verbose=False)[0]["val_loss"]
    trainer.fit(model, datamodule=dm)
    return before, float(trainer.callback_metrics["val_loss"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="small data, one epoch, no worker processes")
    p.add_argument("--root", default=None, help="where to write the shards (default: a temporary folder)")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    images, epochs = (192, 1) if args.fast else (args.images, args.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or tmp
        train_dir = colour_shards(os.path.join(root, "train"), images, seed=0)
        val_dir = colour_shards(os.path.join(root, "val"), max(32, images // 8), seed=1)
        from gpupipe.config.schema import load_config

        config = load_config(pipeline(train_dir, val_dir, workers=0 if args.fast else None))
        before, after = train(config, epochs=epochs, root=root, fast=args.fast)
    print(f"trained {epochs} epoch(s) on {images} images from local shards: val loss {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
