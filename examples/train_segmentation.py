"""Train a small segmentation model on boxes-and-masks shards, with ``gpupipe fit``.

What it shows: generated detection data (``gpupipe synth --targets boxes,masks``: coloured
rectangles, a ``.json`` of boxes and a ``.mask.png`` label map per image), read with
``source.targets: boxes+masks`` (configs/segmentation.yaml): the decode's random crop, the flip and
the rotation move each image's boxes and mask with it, and ``gpupipe fit`` trains
``gpupipe.lightning.models.MaskSegmenter`` (per-pixel cross-entropy) on the masks. The example also
reads one batch in Python and checks what a detection model would receive.

Run::

    python examples/train_segmentation.py            # 2 epochs of 512 images
    python examples/train_segmentation.py --fast     # under a minute on a laptop CPU
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "segmentation.yaml"


def make_data(root: str, images: int) -> tuple[str, str]:
    from gpupipe.tools.synth import write_detection_shards

    train, val = os.path.join(root, "seg-train"), os.path.join(root, "seg-val")
    write_detection_shards(train, num_images=images, size=(96, 72), seed=0)
    write_detection_shards(val, num_images=max(64, images // 8), size=(96, 72), seed=1)
    return train, val


def config_for(train: str, val: str, root: str, workers: int | None) -> str:
    """configs/segmentation.yaml with this run's data and workers."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    config["source"].update(train=train, val=val)
    config["loader"]["num_workers"] = workers
    path = os.path.join(root, "segmentation.yaml")
    Path(path).write_text(yaml.safe_dump(config))
    return path


def first_batch(config: str) -> str:
    """One training batch as a detection model would take it."""
    from gpupipe.config.schema import load_config
    from gpupipe.loader.gpu import GpuLoader

    loader = GpuLoader(load_config(config).split("train"), device="cpu")
    batches = iter(loader)
    images, targets = next(batches)
    batches.close()
    t = targets[0]
    return (f"images {tuple(images.shape)}, {len(targets)} target dicts; the first: boxes {tuple(t['boxes'].shape)}, "
            f"labels {t['labels'].tolist()}, mask {tuple(t['masks'].shape)}")


def fit(config: str, root: str, epochs: int) -> tuple[float, float]:
    """``gpupipe fit`` on the config; (first, last) epoch's val loss from its CSV log."""
    run = subprocess.run([sys.executable, "-m", "gpupipe.tools.cli", "fit", "--config", config,
                          "--trainer.max_epochs", str(epochs), "--trainer.accelerator", "cpu",
                          "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", root,
                          "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                          "--trainer.logger.save_dir", root, "--trainer.num_sanity_val_steps", "0"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(run.stdout[-2000:] + run.stderr[-4000:])
    rows = list(csv.DictReader(open(sorted(glob.glob(os.path.join(root, "lightning_logs", "*", "metrics.csv")))[-1])))
    losses = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    return losses[0], losses[-1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="small data, no worker processes")
    p.add_argument("--root", default=None, help="where to write the shards (default: a temporary folder)")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    images, epochs = (128, 2) if args.fast else (args.images, args.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or tmp
        train, val = make_data(root, images)
        config = config_for(train, val, root, 0 if args.fast else None)
        print(first_batch(config))
        first, last = fit(config, root, epochs)
    print(f"gpupipe fit: {epochs} epoch(s) of {images} images with boxes and masks: val loss {first:.3f} -> {last:.3f}")


if __name__ == "__main__":
    main()
