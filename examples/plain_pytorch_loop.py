"""A plain PyTorch training loop on ``GpuLoader``, stopped mid-epoch and resumed exactly.

What it shows: no Lightning — ``for batch in loader`` gives decoded, augmented batches
(``images, labels = batch``; ``batch.sample_ids`` and ``batch.valid`` travel along), with the
augmentation a ``gpupipe.transforms`` pipeline whose random parameters are keyed by (seed,
epoch, sample id). Half way through the first epoch the loop "crashes" after saving
``{model, optimizer, loader.state_dict()}``; a new model, optimizer and loader load that
checkpoint and finish the epoch with exactly the samples not yet seen — checked here against
a ledger of sample ids — then train one more epoch.

Run::

    python examples/plain_pytorch_loop.py            # 512 images, 2 epochs
    python examples/plain_pytorch_loop.py --fast     # a few seconds
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from _shards import NUM_CLASSES, colour_shards
from torch import nn

import gpupipe.transforms as T
from gpupipe import GpuLoader


def make_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, NUM_CLASSES))


def make_loader(shards: str, workers: int) -> GpuLoader:
    augment = T.Compose([T.RandomResizedCrop(32, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
                         T.ToDtype(torch.float32), T.ColorJitter(0.2, 0.2),
                         T.Normalize(list(T.IMAGENET_MEAN), list(T.IMAGENET_STD))])
    return GpuLoader(shards, batch_size=32, image_size=40, augment=augment, seed=0, num_workers=workers,
                     rank=0, world_size=1, on_error="skip")


def train_steps(loader, model, optimizer, *, stop_after: int | None = None) -> tuple[list[int], float]:
    """Train on ``loader`` (at most ``stop_after`` steps); (sample ids trained on, last loss)."""
    seen, loss = [], float("nan")
    for step, batch in enumerate(loader):
        images, labels = batch
        logits = model(images)
        valid = batch.valid  # False for images replaced because they could not be decoded
        step_loss = F.cross_entropy(logits[valid], labels[valid])
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
        seen += batch.sample_ids[valid.cpu()].tolist()
        loss = step_loss.item()
        if stop_after is not None and step + 1 == stop_after:
            break
    return seen, loss


def fresh(shards: str, workers: int):
    torch.manual_seed(0)
    model = make_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), make_loader(shards, workers)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="small data, no worker processes")
    p.add_argument("--images", type=int, default=512)
    args = p.parse_args(argv)
    images, workers = (128, 0) if args.fast else (args.images, 2)
    with tempfile.TemporaryDirectory() as tmp:
        shards = colour_shards(os.path.join(tmp, "train"), images)
        model, optimizer, loader = fresh(shards, workers)
        loader.set_epoch(0)
        first, _ = train_steps(loader, model, optimizer, stop_after=len(loader) // 2)
        checkpoint = os.path.join(tmp, "mid-epoch.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict()}, checkpoint)
        print(f"epoch 0: {len(first)} samples trained, then stopped; saved {os.path.basename(checkpoint)}")

        model, optimizer, loader = fresh(shards, workers)  # a new process would start here
        state = torch.load(checkpoint, weights_only=True)  # the loader state is plain data
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        rest, loss = train_steps(loader, model, optimizer)
        both = first + rest
        if not len(set(both)) == len(both) == len(loader) * 32:
            raise SystemExit("a sample was lost or repeated on resume")
        print(f"epoch 0 resumed: {len(rest)} more samples, none repeated, none missing "
              f"({len(both)} = {len(loader)} steps x 32); loss {loss:.3f}")
        loader.set_epoch(1)
        seen, loss = train_steps(loader, model, optimizer)
        print(f"epoch 1: {len(seen)} samples; loss {loss:.3f}")


if __name__ == "__main__":
    main()
