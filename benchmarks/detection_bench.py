"""Images/s of a detection pipeline, boxes and masks, gpupipe against torchvision v2 (issue 27).

    PYTHONPATH=. .venv/bin/python benchmarks/detection_bench.py [--images 1024] [--rounds 3] [--workers 1]

The same shards for both: photo-like 320x240 JPEGs (dead leaves, q90), 0-8 boxes each (``.json``)
and a mask (``.mask.png``) whose rectangles are the boxes (class + 1, 0 background). The pipeline:
RandomResizedCrop(224) + RandomHorizontalFlip + SanitizeBoundingBoxes, images uint8, boxes
and masks moved with them.

* gpupipe: ``GpuLoader(shards, targets="boxes+masks", resize="random_resized_crop")`` — the crop in
  the decode (boxes and masks with it), the flip and the sanitize in the augment stage — on the CPU,
  with ``--workers`` worker processes reading bytes.
* torchvision: what its detection references write: a torch ``DataLoader`` with ``--workers``
  workers over the shards (``tarfile``, split by shard across workers), per sample Pillow decode,
  ``tv_tensors.Image``/``BoundingBoxes``/``Mask`` and ``v2.Compose([RandomResizedCrop(224),
  RandomHorizontalFlip(), SanitizeBoundingBoxes()])``, batches as (stacked images, list of dicts).

Rounds alternate which runs first; each run has a warm-up epoch, then ``--epochs`` timed epochs.
Printed: median images/s (min-max) per pipeline and the ratio. torchvision comes from the test
tree's shim (tests/tvshim.py): the library never imports it. Not a test.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from tvshim import import_torchvision  # noqa: E402

from gpupipe.formats.annotations import encode_boxes  # noqa: E402
from gpupipe.formats.writer import ShardSink  # noqa: E402
from gpupipe.tools.synth import dead_leaves_jpeg  # noqa: E402

SIZE = (320, 240)  # (width, height) of the stored images
OUT = 224
CLASSES = 5


def write_shards(root: str, n: int, per_shard: int = 128) -> None:
    from PIL import Image

    w, h = SIZE
    with ShardSink(root, shard_size=per_shard, classes=tuple(f"c{i}" for i in range(CLASSES))) as sink:
        for i in range(n):
            rng = np.random.default_rng([27, i])
            k = int(rng.integers(0, 9))
            x1, y1 = rng.uniform(0, w - 8, k), rng.uniform(0, h - 8, k)
            x2, y2 = x1 + rng.uniform(4, w / 2, k), y1 + rng.uniform(4, h / 2, k)
            boxes = np.stack([x1, y1, np.minimum(x2, w), np.minimum(y2, h)], 1).round()
            labels = rng.integers(0, CLASSES, k)
            mask = np.zeros((h, w), np.uint8)
            for (a, b, c, d), lab in zip(boxes.astype(int), labels):
                mask[b:d, a:c] = lab + 1
            png = io.BytesIO()
            Image.fromarray(mask, "L").save(png, format="PNG")
            sink.write(f"{i:07d}", {"jpg": dead_leaves_jpeg(27, i, SIZE), "json": encode_boxes(boxes, labels),
                                    "mask.png": png.getvalue()})


class TarDetection(torch.utils.data.IterableDataset):
    """The shards' samples as torchvision detection code reads them (shards split across workers)."""

    def __init__(self, root: str):
        self.shards = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))

    def __iter__(self):
        import json

        import torchvision.transforms.v2 as v2
        import torchvision.transforms.v2.functional as TF
        from PIL import Image
        from torchvision import tv_tensors

        pipe = v2.Compose([v2.RandomResizedCrop(OUT), v2.RandomHorizontalFlip(), v2.SanitizeBoundingBoxes()])
        info = torch.utils.data.get_worker_info()
        mine = self.shards[info.id::info.num_workers] if info else self.shards
        for shard in mine:
            with tarfile.open(shard) as tar:
                sample: dict = {}
                for member in tar:
                    key, _, ext = member.name.partition(".")
                    sample[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
                    if len(sample) < 3:
                        continue
                    image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
                    doc = json.loads(sample["json"])
                    canvas = (image.height, image.width)
                    target = {"boxes": tv_tensors.BoundingBoxes(torch.tensor(doc["boxes"], dtype=torch.float32).reshape(-1, 4),
                                                                format="XYXY", canvas_size=canvas),
                              "labels": torch.tensor(doc["labels"], dtype=torch.int64),
                              "masks": tv_tensors.Mask(torch.from_numpy(np.array(Image.open(io.BytesIO(sample["mask.png"])))))}
                    yield pipe(tv_tensors.Image(TF.pil_to_tensor(image)), target)  # (its per-sample path, as written)
                    sample = {}


def _collate(items):
    return torch.stack([i for i, _ in items]), [t for _, t in items]


def _run_torchvision(root: str, workers: int, batch: int, epochs: int) -> float:
    loader = torch.utils.data.DataLoader(TarDetection(root), batch_size=batch, num_workers=workers,
                                         collate_fn=_collate, persistent_workers=workers > 0)
    for _ in loader:
        pass
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for images, _ in loader:
            n += len(images)
    return n / (time.perf_counter() - t0)


def _run_gpupipe(root: str, workers: int, batch: int, epochs: int, device: str = "cpu") -> float:
    import gpupipe.transforms as T
    from gpupipe.loader.gpu import GpuLoader

    loader = GpuLoader(root, batch_size=batch, num_workers=workers, device=device, targets="boxes+masks",
                       image_size=OUT, resize="random_resized_crop", decode="auto",
                       augment=[T.RandomHorizontalFlip(), T.SanitizeBoundingBoxes()])
    for _ in loader:
        pass
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for batch_ in loader:
            n += len(batch_)
    if device != "cpu":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--root", default=None, help="shards to use (written there when absent)")
    p.add_argument("--device", default="cpu", help="where gpupipe decodes and augments (cuda on a GPU machine)")
    args = p.parse_args(argv)
    import_torchvision()
    import torchvision

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or os.path.join(tmp, "det")
        if not os.path.exists(os.path.join(root, "index.json")):
            write_shards(root, args.images)
        runs: dict[str, list[float]] = {"gpupipe": [], f"torchvision {torchvision.__version__}": []}
        order = list(runs)
        for r in range(args.rounds):
            for name in order[r % 2:] + order[:r % 2]:
                runs[name].append(_run_gpupipe(root, args.workers, args.batch, args.epochs, args.device) if name == "gpupipe"
                                  else _run_torchvision(root, args.workers, args.batch, args.epochs))
                print(f"round {r + 1}: {name}: {runs[name][-1]:.0f} img/s", flush=True)
        print(f"\n{args.images} images {SIZE[0]}x{SIZE[1]} -> {OUT}x{OUT}, boxes + masks, {args.workers} workers, "
              f"gpupipe on {args.device}, "
              f"batch {args.batch}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
        medians = {k: statistics.median(v) for k, v in runs.items()}
        for name, v in runs.items():
            print(f"{name:>24}: {medians[name]:7.0f} img/s (min {min(v):.0f}, max {max(v):.0f})")
        base = medians[order[1]]
        print(f"{'gpupipe / torchvision':>24}: {medians['gpupipe'] / base:.2f}x")


if __name__ == "__main__":
    main()
