"""Two sources mixed in one training stream, by weight, with their classes matched by name.

What it shows: ``GpuLoader([{"url": ..., "weight": 1}, {"url": ..., "weight": 1}], ...)`` — the
list form of ``source.train`` (docs/configuration.md, "Several sources"). The two sources number
their classes differently (one lists red, green, blue, yellow; the other the reverse): the loader
numbers the union by name and renumbers the second source's labels in its workers, so one model
learns from both. Every epoch takes exactly the samples ``gpupipe.plan.draw_sizes`` gives each
source (half of their joint size each here: the small source is repeated twice, the large one
sub-sampled, other samples each epoch), mixed at random in every batch; ``loader.per_source`` counts them.

Run::

    python examples/train_mixed_sources.py            # 768 + 256 images, 3 epochs
    python examples/train_mixed_sources.py --fast     # a few seconds
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from _shards import COLOURS, NUM_CLASSES, colour_shards
from torch import nn

import gpupipe.transforms as T
from gpupipe import GpuLoader
from gpupipe.plan import draw_sizes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="small data, no worker processes, 2 epochs")
    args = p.parse_args(argv)
    (big, small), workers, epochs = ((192, 64), 0, 2) if args.fast else ((768, 256), 2, 3)
    with tempfile.TemporaryDirectory() as tmp:
        photos = colour_shards(os.path.join(tmp, "photos"), big, classes=COLOURS)
        extra = colour_shards(os.path.join(tmp, "extra"), small, seed=1, classes=COLOURS[::-1])
        augment = T.Compose([T.RandomHorizontalFlip(), T.ToDtype(torch.float32),
                             T.Normalize(list(T.IMAGENET_MEAN), list(T.IMAGENET_STD))])
        loader = GpuLoader([{"url": photos, "weight": 1}, {"url": extra, "weight": 1}], batch_size=32,
                           image_size=32, augment=augment, num_workers=workers, rank=0, world_size=1)
        print(f"classes by name: {', '.join(loader.classes)}")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(16, NUM_CLASSES))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        want = list(draw_sizes([big, small], weight=[1, 1]))
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if loader.per_source != want:
                raise SystemExit(f"epoch {epoch}: drew {loader.per_source} per source, not {want}")
            print(f"epoch {epoch}: samples per source {loader.per_source} (photos, extra), exactly as weighted; "
                  f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
