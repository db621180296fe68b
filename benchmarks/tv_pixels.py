"""gpupipe's pixels against torchvision v2's, op by op, with the same random parameters (issue 26).

    PYTHONPATH=. .venv/bin/python benchmarks/tv_pixels.py          # all
    PYTHONPATH=. .venv/bin/python benchmarks/tv_pixels.py decode   # the decode's resize modes only

Photo-like uint8 images (dead leaves, 320x240 and other shapes, JPEG q90 decoded by Pillow); each
op's parameters are drawn by gpupipe, then handed to torchvision's functional op on each image;
the table gives |gpupipe - torchvision| on the 0..255 scale: max, mean, p99, and the share of
values that differ at all. torchvision is imported from the test tree's shim (tests/tvshim.py):
the library never imports it. Not a test.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]  # gpupipe from PYTHONPATH: compare two checkouts

from tvshim import import_torchvision  # noqa: E402

import_torchvision()
import torchvision.transforms.v2 as v2  # noqa: E402
import torchvision.transforms.v2.functional as TF  # noqa: E402
from PIL import Image  # noqa: E402

import gpupipe.transforms as T  # noqa: E402
from gpupipe.augment.base import AugKey  # noqa: E402
from gpupipe.tools.synth import dead_leaves_jpeg  # noqa: E402

SHAPES = ((320, 240), (240, 320), (333, 200), (256, 256))  # (width, height)


def photos(size=(320, 240), n: int = 8, seed: int = 26) -> tuple[list[bytes], torch.Tensor]:
    """``n`` JPEGs of ``size`` (w, h) and their Pillow decode as a (n, 3, h, w) uint8 batch."""
    jpegs = [dead_leaves_jpeg(seed, i, size) for i in range(n)]
    decoded = [torch.from_numpy(np.asarray(Image.open(io.BytesIO(j)).convert("RGB"))).permute(2, 0, 1) for j in jpegs]
    return jpegs, torch.stack(decoded)


def stats(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.to(torch.float64) - want.to(torch.float64)).abs().flatten()
    return (f"max {d.max().item():6.1f}  mean {d.mean().item():6.3f}  p99 {torch.quantile(d[:1 << 24], 0.99).item():5.1f}"
            f"  differ {100 * (d > 0).double().mean().item():5.2f}%")


def per_image(fn, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """torchvision's functional op on each image with that image's parameters."""
    return torch.stack([fn(images[i], {k: v[i] for k, v in params.items()}) for i in range(len(images))])


def _key(n: int, seed: int = 3) -> AugKey:
    return AugKey(seed, 0, torch.arange(n))


def _corners(h: int, w: int) -> list[list[int]]:
    return [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]


def _ops(H: int, W: int):
    """(name, gpupipe transform, torchvision per-image function of (image, params))."""
    def affine(p):
        return dict(angle=float(p["angle"]), translate=[float(p["tx"]), float(p["ty"])], scale=float(p["scale"]),
                    shear=[float(p["shear_x"]), float(p["shear_y"])])

    return [
        ("Resize(120) 2x down", T.Resize(120), lambda x, p: v2.Resize(120)(x)),
        ("Resize(80) 3x down", T.Resize(80), lambda x, p: v2.Resize(80)(x)),
        ("Resize((200, 150)) mixed", T.Resize((200, 150)), lambda x, p: v2.Resize((200, 150))(x)),
        ("Resize(360) up", T.Resize(360), lambda x, p: v2.Resize(360)(x)),
        ("Resize(120, antialias=False)", _maybe(T.Resize, 120, antialias=False),
         lambda x, p: v2.Resize(120, antialias=False)(x)),
        ("RandomResizedCrop(224)", T.RandomResizedCrop(224),
         lambda x, p: TF.resized_crop(x, int(p["top"]), int(p["left"]), int(p["height"]), int(p["width"]), [224, 224])),
        ("RandomResizedCrop(96)", T.RandomResizedCrop(96),
         lambda x, p: TF.resized_crop(x, int(p["top"]), int(p["left"]), int(p["height"]), int(p["width"]), [96, 96])),
        ("CenterCrop(200)", T.CenterCrop(200), lambda x, p: v2.CenterCrop(200)(x)),
        ("RandomRotation(30) default", T.RandomRotation(30), lambda x, p: TF.rotate(x, float(p["angle"]), fill=0)),
        ("RandomRotation(30, bilinear)", T.RandomRotation(30, interpolation="bilinear"),
         lambda x, p: TF.rotate(x, float(p["angle"]), interpolation=v2.InterpolationMode.BILINEAR, fill=0)),
        ("RandomRotation(30, bilinear, fill=(10,200,60))",
         T.RandomRotation(30, interpolation="bilinear", fill=(10, 200, 60)),
         lambda x, p: TF.rotate(x, float(p["angle"]), interpolation=v2.InterpolationMode.BILINEAR, fill=[10, 200, 60])),
        ("RandomRotation(30, fill=(10,200,60))", T.RandomRotation(30, fill=(10, 200, 60)),
         lambda x, p: TF.rotate(x, float(p["angle"]), fill=[10, 200, 60])),
        ("RandomAffine(20, .1, (.8,1.2), 10) default", T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10),
         lambda x, p: TF.affine(x, **affine(p), fill=0)),
        ("RandomAffine(... bilinear)", T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10, interpolation="bilinear"),
         lambda x, p: TF.affine(x, **affine(p), interpolation=v2.InterpolationMode.BILINEAR, fill=0)),
        ("RandomPerspective(0.5, p=1) default", T.RandomPerspective(0.5, p=1.0),
         lambda x, p: TF.perspective(x, _corners(H, W), p["end"].round().int().tolist(), fill=0)),
        ("RandomPerspective(0.5, p=1, fill=77)", T.RandomPerspective(0.5, p=1.0, fill=77),
         lambda x, p: TF.perspective(x, _corners(H, W), p["end"].round().int().tolist(), fill=[77])),
    ]


def _maybe(cls, *args, **kwargs):
    try:
        return cls(*args, **kwargs)
    except TypeError:
        return None


def transforms_table() -> None:
    _, images = photos()
    H, W = images.shape[-2:]
    print(f"op alone, uint8 {W}x{H} photos x{len(images)}, torch CPU {torch.backends.cpu.get_cpu_capability()}")
    for name, ours, theirs in _ops(H, W):
        if ours is None:
            print(f"  {name:48s} not supported")
            continue
        key = _key(len(images))
        params = ours.make_params(images, key)
        got = ours.apply(images, params)
        want = per_image(theirs, images, params)
        print(f"  {name:48s} {stats(got, want)}")


def _chains(H: int, W: int):
    flip = v2.RandomHorizontalFlip(1.0)
    return [
        ("Resize(256) + CenterCrop(224)", [T.Resize(256), T.CenterCrop(224)],
         lambda x, ps: v2.CenterCrop(224)(v2.Resize(256)(x))),
        ("Resize(120) + CenterCrop(112)", [T.Resize(120), T.CenterCrop(112)],
         lambda x, ps: v2.CenterCrop(112)(v2.Resize(120)(x))),
        ("RandomResizedCrop(224) + HFlip(p=1)", [T.RandomResizedCrop(224), T.RandomHorizontalFlip(1.0)],
         lambda x, ps: flip(TF.resized_crop(x, *(int(ps[0][k]) for k in ("top", "left", "height", "width")),
                                            [224, 224]))),
        ("RandomAffine(20) + HFlip(p=1)", [T.RandomAffine(20), T.RandomHorizontalFlip(1.0)],
         lambda x, ps: flip(TF.affine(x, float(ps[0]["angle"]), [0.0, 0.0], 1.0, [0.0, 0.0], fill=0))),
        ("RandomRotation(20, bilinear) + Perspective", [T.RandomRotation(20, interpolation="bilinear"),
                                                       T.RandomPerspective(0.3, p=1.0)],
         lambda x, ps: TF.perspective(TF.rotate(x, float(ps[0]["angle"]), v2.InterpolationMode.BILINEAR, fill=0),
                                      _corners(H, W), ps[1]["end"].round().int().tolist(), fill=0)),
        ("Resize(300) + RandomRotation(15, bilinear) + HFlip", [T.Resize(300), T.RandomRotation(15, interpolation="bilinear"),
                                                              T.RandomHorizontalFlip(1.0)],
         lambda x, ps: flip(TF.rotate(v2.Resize(300)(x), float(ps[1]["angle"]), v2.InterpolationMode.BILINEAR, fill=0))),
    ]


def chains_table() -> None:
    _, images = photos()
    H, W = images.shape[-2:]
    print("chains, Compose (fused) and Compose(fuse=False), same parameters")
    for name, steps, theirs in _chains(H, W):
        for fuse in (True, False):
            pipe = T.Compose(steps, fuse=fuse)
            params = pipe.make_params(images, _key(len(images)))
            got = pipe.apply(images, params)
            child = [pipe._child_params(params, i) for i in range(len(steps))]
            want = torch.stack([theirs(images[b], [{k: v[b] for k, v in c.items()} for c in child])
                                for b in range(len(images))])
            print(f"  {name + (' fused' if fuse else ' sequential'):48s} {stats(got, want)}")


def decode_table() -> None:
    from gpupipe.core.types import Sample
    from gpupipe.decode import DecodeConfig, make_decoder
    from gpupipe.stream.batch import pack

    print("decode resize: shorter at 224, 112, 56 against torchvision Resize(s) + CenterCrop(s) of Pillow's decode")
    for backend in ("pil", "dali"):
        rows = []
        for size in SHAPES:
            jpegs, images = photos(size, n=6)
            batch = pack([Sample(key=f"s{i}", fields={"jpg": j}, sample_id=i, label=0) for i, j in enumerate(jpegs)],
                         [True] * len(jpegs))
            for s in (224, 112, 56):
                decoder = make_decoder(DecodeConfig(backend=backend, image_size=(s, s), resize="shorter",
                                                    num_threads=2), "cpu")
                try:
                    got = decoder.decode(batch).images
                finally:
                    decoder.close()
                want = v2.CenterCrop(s)(v2.Resize(s)(images))
                print(f"  {backend:4s} {size[0]}x{size[1]} -> {s}  {stats(got, want)}")
                rows.append((got, want))
        got, want = (torch.cat([r[i].flatten() for r in rows]) for i in (0, 1))
        print(f"  {backend:4s} all shapes               {stats(got, want)}")


if __name__ == "__main__":
    what = sys.argv[1:] or ["transforms", "chains", "decode"]
    torch.set_num_threads(1)
    for part in what:
        {"transforms": transforms_table, "chains": chains_table, "decode": decode_table}[part]()
