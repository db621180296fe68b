"""Move a torchvision ``Compose`` to ``gpupipe.transforms``: the same names, on batches.

What it shows: the ImageNet training transforms people write with torchvision, and the
gpupipe pipeline that does the same to a whole (B, 3, H, W) uint8 batch on the GPU (or CPU)
with per-sample random parameters. With torchvision installed, ``from_torchvision(compose)``
builds it from the ``Compose`` itself; without torchvision this script builds the same
pipeline explicitly and prints the mapping, saying so. Either way it then runs the pipeline
on a batch and shows that the same (seed, epoch, sample ids) give the same result.

Notes on the mapping: every step keeps its place and meaning (``ColorJitter`` before
``ToTensor`` works on uint8, as torchvision's; ``ToTensor`` takes uint8 to float in [0, 1]);
geometric ops fuse into one warp, colour, cast and normalize into one pass; PIL-only steps
(``ToImage``, ``PILToTensor``) disappear, since the decoder already gives tensors.

Run::

    python examples/migrate_torchvision.py [--fast]
"""
from __future__ import annotations

import argparse

import torch

import gpupipe.transforms as G

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TORCHVISION = """T.Compose([
    T.RandomResizedCrop(224, scale=(0.08, 1.0)),
    T.RandomHorizontalFlip(),
    T.ColorJitter(0.4, 0.4, 0.4, 0.1),
    T.ToTensor(),
    T.Normalize(MEAN, STD),
])"""
MAPPING = (  # torchvision step -> the gpupipe step that replaces it
    ("T.RandomResizedCrop(224, scale=(0.08, 1.0))", "G.RandomResizedCrop(224, scale=(0.08, 1.0))"),
    ("T.RandomHorizontalFlip()", "G.RandomHorizontalFlip(0.5)"),
    ("T.ColorJitter(0.4, 0.4, 0.4, 0.1)", "G.ColorJitter(0.4, 0.4, 0.4, 0.1)"),
    ("T.ToTensor()", "G.ToTensor()"),
    ("T.Normalize(MEAN, STD)", "G.Normalize(MEAN, STD)"),
)


def from_torchvision_if_installed() -> G.Compose | None:
    """``from_torchvision`` on the real ``Compose``, or None when torchvision is missing."""
    try:
        import torchvision.transforms as T
    except ImportError:
        return None
    compose = T.Compose([T.RandomResizedCrop(224, scale=(0.08, 1.0)), T.RandomHorizontalFlip(),
                         T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(), T.Normalize(MEAN, STD)])  # = TORCHVISION
    return G.from_torchvision(compose)


def explicit() -> G.Compose:
    """The same pipeline written with gpupipe.transforms directly."""
    return G.Compose([G.RandomResizedCrop(224, scale=(0.08, 1.0)), G.RandomHorizontalFlip(0.5),
                      G.ColorJitter(0.4, 0.4, 0.4, 0.1), G.ToTensor(), G.Normalize(MEAN, STD)])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="a smaller batch")
    args = p.parse_args(argv)
    print("torchvision:\n" + TORCHVISION)
    pipeline = from_torchvision_if_installed()
    if pipeline is None:
        print("\ntorchvision is not installed here, so the gpupipe pipeline is built explicitly:")
        for tv, gp in MAPPING:
            print(f"  {tv:<46} -> {gp}")
        pipeline = explicit()
    else:
        print("\nbuilt with gpupipe.transforms.from_torchvision(compose)")
    print(f"\ngpupipe:\n{pipeline}")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pipeline = pipeline.to(device)
    b = 4 if args.fast else 16
    images = torch.randint(0, 256, (b, 3, 256, 320), dtype=torch.uint8, device=device)  # stands for a decoded batch
    key = G.AugKey(seed=0, epoch=0, sample_ids=torch.arange(b, device=device))
    out = pipeline(images, key)
    again = pipeline(images, key)
    print(f"\n{tuple(images.shape)} {images.dtype} -> {tuple(out.shape)} {out.dtype} on {device}; "
          f"same key, same output: {torch.equal(out, again)}")


if __name__ == "__main__":
    main()
