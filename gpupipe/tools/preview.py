"""``gpupipe preview``: look at what a config feeds the model, as a PNG grid.

The first ``--n`` samples of a split that can be read (in stored order: shuffling is off, so
the same samples come up for every ``--epoch`` and ``--seed-offset``; an unreadable one, skipped
under ``on_error: skip``, is made up for by the next) go through the config's whole pipeline: its decode (size, crop mode, backend) and its augmentation for that split, keyed
by (seed + seed offset, epoch, sample id) exactly as in training. Normalize is undone for
display with the mean/std of the config's last ``Normalize`` step; float images are taken to
be in [0, 1] after a scaling ``ToDtype``/``ToTensor`` step and in [0, 255] otherwise.
Each tile is captioned with the label and key; ``--compare`` puts the decoded image
without augmentation left of the augmented one. With targets (``source.targets``), each
tile shows its boxes (outlined, a colour per class, the class index at the corner) and its
mask (classes tinted over the image), as the augmentation moved them; the caption gives the
box count instead of the label. Tiles are enlarged (nearest neighbour) to at
least ``MIN_TILE`` pixels so small training sizes stay visible.

Stored order is class by class for an image folder, so the first samples are often of one
class: the command says so when every tile shows one, and ``--shuffle`` takes them in the
shuffled order of ``--epoch`` instead (other samples for each epoch and seed offset).
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = ["Layout", "layout", "preview", "add_arguments", "run", "MIN_TILE"]

MIN_TILE = 96  # smallest displayed side of one image, in pixels
_PAD = 4  # pixels between tiles and around the grid
_CAPTION = 14  # pixels of caption text under each tile
_BACKGROUND = (24, 24, 24)


@dataclass(frozen=True)
class Layout:
    """Where tiles go: ``cols`` x ``rows`` tiles of ``tile`` (w, h) pixels (caption excluded)."""

    cols: int
    rows: int
    tile: tuple[int, int]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the whole PNG."""
        w, h = self.tile
        return self.cols * (w + _PAD) + _PAD, self.rows * (h + _CAPTION + _PAD) + _PAD


def layout(n: int, image_hw: tuple[int, int], *, compare: bool = False) -> Layout:
    """The grid for ``n`` images of ``image_hw`` (h, w): about square, each image enlarged by
    an integer factor to at least :data:`MIN_TILE` on its longer side."""
    h, w = image_hw
    factor = max(1, math.ceil(MIN_TILE / max(h, w)))
    cols = max(1, math.ceil(math.sqrt(n)))
    rows = max(1, math.ceil(n / cols))
    return Layout(cols, rows, (w * factor * (2 if compare else 1), h * factor))


# ------------------------------------------------------------------------------------ pipeline

def _preview_config(config, n: int, seed_offset: int, shuffle: bool = False):
    """The config with shuffling off (or on: ``shuffle``), batches of ``n`` and the seed moved by
    ``seed_offset``."""
    stream = replace(config.stream, shuffle=shuffle, drop_last=False)
    loader = replace(config.loader, batch_size=n, eval_batch_size=n)
    return replace(config, stream=stream, loader=loader, seed=config.seed + seed_offset)


def _open(config, split: str, epoch: int, device):
    """``(loader, its pass)``: the decoded (not augmented) batches of ``split`` at ``epoch``, in
    order; closing the pass stops the decode thread."""
    from gpupipe.core.types import World
    from gpupipe.loader.gpu import GpuLoader

    settings = replace(config.split(split), augment=(), mix=None, num_workers=0)
    loader = GpuLoader(settings, world=World(), device=device)
    loader.set_epoch(epoch)
    return loader, iter(loader)


def _empty(split: str):
    from gpupipe.core.errors import GpupipeError

    return GpupipeError(f"the {split} split has no samples to preview")


def _display_params(specs: Sequence) -> tuple[list | None, list | None, float]:
    """(mean, std) of the last Normalize step (or None) and the value range of float images."""
    mean = std = None
    value_range = 255.0
    for spec in specs:
        if spec.name == "Normalize":
            mean, std = list(spec.args["mean"]), list(spec.args["std"])
        elif spec.name in ("ToDtype", "ToTensor") and spec.args.get("scale", True):
            value_range = 1.0
    return mean, std, value_range


def to_display(images, specs: Sequence = ()):
    """(B, C, H, W) uint8 or float → (B, H, W, 3) uint8 numpy for viewing: Normalize undone,
    scaled to 0..255, one channel repeated, channels after the third dropped."""
    import torch

    x = images.detach().to("cpu", torch.float32)
    if images.is_floating_point():
        mean, std, value_range = _display_params(specs)
        if mean is not None:
            x = x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
        x = x * (255.0 / value_range)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x[:, :3].clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def preview(config, *, split: str = "train", n: int = 16, epoch: int = 0, seed_offset: int = 0,
            compare: bool = False, device=None, shuffle: bool = False):
    """A Pillow image: the grid of the first ``n`` readable samples of ``split`` (see the module
    doc); ``image.info`` holds ``samples`` (how many it shows: ``n`` unless the split has fewer),
    ``labels`` (theirs, -1 with targets) and ``classes`` (how many the split's index lists)."""
    from gpupipe.core.errors import ConfigError

    if n < 1:
        raise ConfigError(f"--n: must be >= 1, got {n}")
    cfg = _preview_config(config, n, seed_offset, shuffle)
    settings = cfg.split(split)
    stage = settings.augment_stage()
    tiles = _Tiles()
    loader, batches = _open(cfg, split, epoch, device)
    try:
        for batch in batches:
            original = batch.images
            out = stage.to(original.device)(batch) if stage is not None else batch
            keep = batch.valid.cpu().nonzero().flatten().tolist()[:n - len(tiles.captions)]
            tiles.add(out, original, keep, settings.augment, compare)
            if len(tiles.captions) >= n:
                break
    finally:
        batches.close()  # stops the decode thread now
    if not tiles.captions:
        raise _empty(split)
    image = tiles.grid()
    image.info.update(samples=len(tiles.captions), labels=tuple(tiles.labels), classes=len(loader.classes))
    return image


class _Tiles:
    """The tiles gathered so far (across batches: a skipped sample is made up for by the next)."""

    def __init__(self) -> None:
        self.shown: list = []
        self.before: list = []
        self.captions: list[str] = []
        self.labels: list[int] = []
        self.targets: list[dict] | None = None

    def add(self, out, original, keep: list[int], specs, compare: bool) -> None:
        if not keep:
            return
        shown = to_display(out.images, specs)[keep]
        if compare:
            self.before.append(to_display(original)[keep])
        targets = out.targets.per_image() if out.targets is not None else None
        if targets is not None:
            mine = [targets[i] for i in keep]
            self.shown.append(_overlay(shown, mine))
            self.targets = (self.targets or []) + mine
            self.captions += [f"{len(t['boxes'])} boxes {out.keys[i]}" if "boxes" in t else out.keys[i]
                              for t, i in zip(mine, keep)]
            self.labels += [-1] * len(keep)
        else:
            labels = out.labels.cpu()
            self.shown.append(shown)
            self.captions += [f"{_label(labels[i])} {out.keys[i]}" for i in keep]
            self.labels += [int(_label(labels[i])) for i in keep]

    def grid(self):
        import numpy as np

        before = np.concatenate(self.before) if self.before else None
        return _grid(np.concatenate(self.shown), self.captions, before, self.targets)


def _colour(c: int) -> tuple[int, int, int]:
    """A bright colour for class ``c``, the same in every tile."""
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((c * 0.618034) % 1.0, 0.85, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def _overlay(images, targets: Sequence[dict]):
    """(B, H, W, 3) uint8 with each image's mask tinted over it: 40% of the class colour where
    the mask is not 0 (the background)."""
    import numpy as np

    out = images.copy()
    for i, t in enumerate(targets):
        if "masks" not in t:
            continue
        mask = t["masks"].cpu().numpy()
        for value in np.unique(mask).tolist():
            if value == 0:
                continue
            where = mask == value
            out[i][where] = (0.6 * out[i][where] + 0.4 * np.array(_colour(value - 1))).astype(np.uint8)
    return out


def _label(label) -> str:
    return str(int(label)) if label.ndim == 0 else str(int(label.argmax()))  # mixed labels: the strongest


def _grid(images, captions: Sequence[str], before=None, targets: Sequence[dict] | None = None):
    """Tiles of ``images`` (B, H, W, 3) uint8 with captions; ``before`` (B, h, w, 3) left of each;
    ``targets``' boxes (image pixels) outlined on the tiles."""
    from PIL import Image, ImageDraw

    n, h, w, _ = images.shape
    grid = layout(n, (h, w), compare=before is not None)
    tile_w, tile_h = grid.tile
    canvas = Image.new("RGB", grid.size, _BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    half = tile_w // 2 if before is not None else tile_w
    for i in range(n):
        x = _PAD + (i % grid.cols) * (tile_w + _PAD)
        y = _PAD + (i // grid.cols) * (tile_h + _CAPTION + _PAD)
        canvas.paste(Image.fromarray(images[i]).resize((half, tile_h), Image.Resampling.NEAREST), (x + tile_w - half, y))
        if before is not None:
            canvas.paste(Image.fromarray(before[i]).resize((half, tile_h), Image.Resampling.BILINEAR), (x, y))
        if targets is not None and "boxes" in targets[i]:
            _boxes(draw, targets[i], (x + tile_w - half, y), (half / w, tile_h / h))
        draw.text((x + 1, y + tile_h + 1), _fit(draw, captions[i], tile_w), fill=(235, 235, 235))
    return canvas


def _boxes(draw, target: dict, at: tuple[int, int], scale: tuple[float, float]) -> None:
    """Outline each box of ``target`` (xyxy image pixels) on a tile placed ``at`` and enlarged by ``scale``."""
    for box, label in zip(target["boxes"].cpu().tolist(), target["labels"].cpu().tolist()):
        x1, y1, x2, y2 = (at[0] + box[0] * scale[0], at[1] + box[1] * scale[1],
                          at[0] + box[2] * scale[0] - 1, at[1] + box[3] * scale[1] - 1)
        colour = _colour(int(label))
        draw.rectangle((x1, y1, max(x1, x2), max(y1, y2)), outline=colour, width=2)
        draw.text((x1 + 2, y1 + 1), str(int(label)), fill=colour)


def _fit(draw, text: str, width: int) -> str:
    """``text`` shortened (with an ellipsis) to fit ``width`` pixels."""
    while len(text) > 1 and draw.textlength(text) > width - 2:
        text = text[:-2] + "…"
    return text


# ------------------------------------------------------------------------------------ command

def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpupipe.tools.cliargs import device_option

    p.add_argument("--config", required=True, metavar="FILE", help="pipeline config (YAML)")
    p.add_argument("--split", default="train", help="split to preview (default train)")
    p.add_argument("--n", type=int, default=16, metavar="N", help="samples to show (default 16)")
    p.add_argument("--out", default="preview.png", metavar="PNG", help="where to write the grid (default preview.png)")
    p.add_argument("--epoch", type=int, default=0, metavar="N", help="epoch whose augmentation to show (default 0)")
    p.add_argument("--seed-offset", type=int, default=0, metavar="N",
                   help="add N to the config's seed: other random draws, same samples (default 0)")
    p.add_argument("--compare", action="store_true", help="show each decoded image before augmentation beside it")
    p.add_argument("--shuffle", action="store_true",
                   help="take the samples in the shuffled order of --epoch, not the first ones stored (which in an "
                        "image folder are often all of one class)")
    p.add_argument("--device", default=None, type=device_option,
                   help="cpu or cuda[:N] (default: the config's loader.device, else auto)")


def run(args: argparse.Namespace) -> int:
    from gpupipe.config.schema import load_config

    config = load_config(args.config)
    image = preview(config, split=args.split, n=args.n, epoch=args.epoch, seed_offset=args.seed_offset,
                    compare=args.compare, device=args.device, shuffle=args.shuffle)
    samples, labels, classes = (image.info.pop(k) for k in ("samples", "labels", "classes"))
    image.save(args.out, format="PNG")
    which = "shuffled as in" if args.shuffle else "the first stored, not shuffled, at"
    print(f"gpupipe preview: wrote {args.out} ({image.width}x{image.height}, {samples} samples of {args.split}, "
          f"{which} epoch {args.epoch}, seed {config.seed + args.seed_offset})")
    if not args.shuffle and samples > 1 and classes > 1 and len(set(labels)) == 1 and labels[0] >= 0:
        print(f"  all {samples} are of class {labels[0]}: the split is stored class by class; --shuffle shows samples "
              "from across it")
    return 0
