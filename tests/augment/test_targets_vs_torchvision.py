"""Boxes and masks moved by gpupipe's geometric ops against the real torchvision v2's (issue 27).

Each op gets gpupipe's parameters (``make_params``); torchvision's functional op is run on each
image's ``tv_tensors.BoundingBoxes(format="XYXY")`` and ``tv_tensors.Mask`` with them (the same
call that moves the image: the functional ops dispatch on the tv_tensor type). Images carry 0 to
5 boxes (image 1 none), boxes on the edges, and after a crop boxes partly or wholly outside.

Tolerances, and why:

* boxes: ``BOX_TOL`` = 1e-4 px. Both move the four corners through the same matrix and clamp;
  gpupipe builds the matrix from float32 parameters and moves the corners in float64,
  torchvision builds it in float64 and moves them in float32: a few float32 ulps at coordinates
  up to ~130 px (ulp 7.6e-6 to 1.5e-5). Measured: 0 for flips and crops, at most 7.6e-6 for
  each op alone, 1.5e-5 for a chain (the largest is printed per case with ``-s``).
* masks: exact for flips, crops and resizes (integer gathers, or torchvision's own nearest
  ``F.interpolate``); for the warps (affine, rotation, perspective), nearest-neighbour ties:
  a sample within float error of a pixel boundary may take the other neighbour, so at most
  ``MASK_TIE_SHARE`` = 0.05% of pixels may differ (the images' ``TOL_NEAREST``, test_tv_pixels.py).
  Measured: 0 for affine and rotation, 0.005% for the perspective, 0.03% for a chain of a flip, an
  affine and a perspective (two warps' ties: allowed twice the share).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

import gpupipe.transforms as T
from gpupipe.augment.base import AugKey
from gpupipe.augment.targets import Boxes, Targets, pack_targets, unpack_targets

BOX_TOL = 1e-4
MASK_TIE_SHARE = 5e-4
B, H, W = 4, 60, 80


def _targets(seed: int = 27) -> list[dict[str, torch.Tensor]]:
    """torchvision-style targets for B images of H x W: 0-5 boxes (image 1 none; edge-touching and
    tiny ones included) and a label map of blobs (labels 0-5)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(B):
        n = 0 if i == 1 else int(rng.integers(1, 6))
        x1, y1 = rng.uniform(0, W - 2, n), rng.uniform(0, H - 2, n)
        x2, y2 = np.minimum(x1 + rng.uniform(0.5, W / 2, n), W), np.minimum(y1 + rng.uniform(0.5, H / 2, n), H)
        boxes = np.stack([x1, y1, x2, y2], -1).reshape(-1, 4)
        if n:
            boxes[0] = [0, 0, W, H] if i == 0 else [0, 3.5, 20.25, H]  # the whole frame / on the edges
        coarse = torch.from_numpy(rng.integers(0, 6, (6, 8))).to(torch.uint8)
        mask = torch.nn.functional.interpolate(coarse[None, None].float(), size=(H, W), mode="nearest")[0, 0]
        out.append({"boxes": torch.tensor(boxes, dtype=torch.float32),
                    "labels": torch.from_numpy(rng.integers(1, 10, n)).to(torch.int64), "masks": mask.to(torch.uint8)})
    return out


def _key(device, seed: int = 5) -> AugKey:
    return AugKey(seed, 0, torch.arange(B, device=device))


def _theirs(fn, targets: list[dict[str, torch.Tensor]], params: dict[str, torch.Tensor], device="cpu"):
    """torchvision's ``fn(tv_tensor, params of that image)`` on each image's boxes and mask, the
    mask on ``device``: (per-image boxes, (B, h, w) masks)."""
    boxes, masks = [], []
    for i, t in enumerate(targets):
        p = {k: v[i].cpu() for k, v in params.items()}
        b = tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W))
        boxes.append(fn(b, p).as_subclass(torch.Tensor))
        masks.append(fn(tv_tensors.Mask(t["masks"][None].to(device)), p).as_subclass(torch.Tensor)[0].cpu())
    return boxes, torch.stack(masks)


def _compare(got: Targets, want_boxes, want_masks, tie_share: float, what: str) -> tuple[float, float]:
    """Assert within the tolerances; (largest box difference px, share of mask pixels that differ)."""
    per_image = unpack_targets(got)
    worst = 0.0
    for i, (d, want) in enumerate(zip(per_image, want_boxes)):
        assert d["boxes"].shape == want.shape, (what, i, d["boxes"].shape, want.shape)
        if want.numel():
            worst = max(worst, (d["boxes"].cpu().double() - want.double()).abs().max().item())
    assert got.masks is not None and got.masks.shape == want_masks.shape and got.masks.dtype == torch.uint8, what
    share = (got.masks.cpu() != want_masks).double().mean().item()
    assert worst <= BOX_TOL, f"{what}: boxes differ by up to {worst} px"
    assert share <= tie_share, f"{what}: {share:.5%} of mask pixels differ (allowed {tie_share:.5%})"
    print(f"{what}: max |box diff| {worst:.2e} px, mask pixels differing {share:.4%}")
    return worst, share


def _affine_args(p: dict[str, torch.Tensor]) -> dict:
    return {"angle": float(p["angle"]), "translate": [float(p["tx"]), float(p["ty"])], "scale": float(p["scale"]),
            "shear": [float(p["shear_x"]), float(p["shear_y"])]}


def _box(p: dict[str, torch.Tensor]) -> list[int]:
    return [int(p[k]) for k in ("top", "left", "height", "width")]


_START = [[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]]
_NEAREST = v2.InterpolationMode.NEAREST


def _flip(fn):
    return lambda x, p: fn(x) if bool(p["flip"]) else x


# name: (gpupipe op, torchvision's functional op on one tv_tensor with that image's params, mask tie share)
OPS = {
    "hflip": (lambda: T.RandomHorizontalFlip(), _flip(TF.horizontal_flip), 0.0),
    "vflip": (lambda: T.RandomVerticalFlip(), _flip(TF.vertical_flip), 0.0),
    "resize-down": (lambda: T.Resize(36), lambda x, p: TF.resize(x, [36, 48]), 0.0),
    "resize-up-hw": (lambda: T.Resize((90, 100)), lambda x, p: TF.resize(x, [90, 100]), 0.0),
    "resize-nearest-exact": (lambda: T.Resize(45, interpolation="nearest-exact"),
                             lambda x, p: TF.resize(x, [45, 60], v2.InterpolationMode.NEAREST_EXACT), 0.0),
    "centercrop": (lambda: T.CenterCrop((40, 50)), lambda x, p: TF.center_crop(x, [40, 50]), 0.0),
    "centercrop-padded": (lambda: T.CenterCrop((70, 96)), lambda x, p: TF.center_crop(x, [70, 96]), 0.0),
    "randomcrop-padded": (lambda: T.RandomCrop(48, padding=10),
                          lambda x, p: TF.crop(x, int(p["top"]), int(p["left"]), 48, 48), 0.0),
    "randomresizedcrop": (lambda: T.RandomResizedCrop(48), lambda x, p: TF.resized_crop(x, *_box(p), [48, 48]), 0.0),
    "affine": (lambda: T.RandomAffine(25, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=(-8, 8, -8, 8)),
               lambda x, p: TF.affine(x, **_affine_args(p), interpolation=_NEAREST, fill=0), MASK_TIE_SHARE),
    "rotation": (lambda: T.RandomRotation(30), lambda x, p: TF.rotate(x, float(p["angle"]), fill=0), MASK_TIE_SHARE),
    "rotation-bilinear-fill": (lambda: T.RandomRotation(30, interpolation="bilinear", fill=7),
                               lambda x, p: TF.rotate(x, float(p["angle"]), v2.InterpolationMode.BILINEAR, fill=7),
                               MASK_TIE_SHARE),
    "perspective": (lambda: T.RandomPerspective(0.5, p=1.0),
                    lambda x, p: TF.perspective(x, _START, p["end"].round().int().tolist(), fill=0), MASK_TIE_SHARE),
}


# torchvision 0.28 resizes a mask nearest-exact where the images are; 0.27 and older always plain
# nearest (seen on the H100 with 0.26: 10 % of mask pixels apart). gpupipe follows 0.28.
MASK_MODE_FOLLOWED = "interpolation" in inspect.signature(TF.resize_mask).parameters


@pytest.mark.parametrize("op", list(OPS))
def test_each_op_moves_boxes_and_masks_as_torchvision(device, op):
    if op == "resize-nearest-exact" and not MASK_MODE_FOLLOWED:
        pytest.skip("this torchvision resizes masks nearest whatever the mode (0.28 follows it, as gpupipe)")
    make, theirs, tie_share = OPS[op]
    t, raw = make(), _targets()
    images = torch.zeros((B, 3, H, W), dtype=torch.uint8, device=device)
    params = t.make_params(images, _key(device))
    got = t.apply_targets(pack_targets(raw, device=device), params, (H, W))
    want_boxes, want_masks = _theirs(theirs, raw, params, device)
    _compare(got, want_boxes, want_masks, tie_share, op)
    assert tuple(got.masks.shape[-2:]) == t.output_size((H, W))  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["symmetric", "reflect", "edge"])
def test_a_crop_padded_by_mirroring_moves_masks_and_refuses_boxes_as_torchvision(device, mode):
    t, raw = T.RandomCrop(48, padding=6, padding_mode=mode), _targets()
    params = t.make_params(torch.zeros((B, 3, H, W), device=device), _key(device))
    masks = t.apply_targets(pack_targets([{"masks": r["masks"]} for r in raw], device=device), params, (H, W)).masks
    want = torch.stack([TF.crop(TF.pad(tv_tensors.Mask(r["masks"][None]), [6], padding_mode=mode),
                                int(params["top"][i]) + 6, int(params["left"][i]) + 6, 48, 48)[0]
                        for i, r in enumerate(raw)]).as_subclass(torch.Tensor)
    assert masks is not None and torch.equal(masks.cpu(), want)
    with pytest.raises(ValueError, match="not supported with bounding boxes"):
        t.apply_targets(pack_targets(raw, device=device), params, (H, W))
    with pytest.raises(ValueError, match="not supported with bounding boxes"):
        TF.pad(tv_tensors.BoundingBoxes(raw[0]["boxes"], format="XYXY", canvas_size=(H, W)), [6], padding_mode=mode)


def test_a_crop_leaves_boxes_outside_degenerate_until_sanitized(device):
    """After a crop, a box wholly outside is clamped to a zero-width box on the edge (torchvision
    keeps it too); SanitizeBoundingBoxes then removes it with its label."""
    raw = [{"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [30.0, 20.0, 70.0, 50.0]]), "labels": torch.tensor([4, 5]),
            "masks": torch.zeros((H, W), dtype=torch.uint8)} for _ in range(B)]
    crop = T.CenterCrop((20, 20))  # rows 20-40, columns 30-50: the first box is outside
    got = crop.apply_targets(pack_targets(raw, device=device), crop.make_params(
        torch.zeros((B, 3, H, W), device=device), _key(device)), (H, W))
    assert got.boxes is not None
    torch.testing.assert_close(got.boxes.boxes[:2].cpu(), torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 20.0, 20.0]]))
    clean = T.SanitizeBoundingBoxes().apply_targets(got, {}, (20, 20))
    assert clean.boxes is not None
    assert clean.boxes.counts.tolist() == [1] * B and clean.boxes.labels.tolist() == [5] * B


def _chain_theirs(pipe, params, fns):
    child = [pipe._child_params(params, i) for i in range(len(fns))]

    def run(x, p_unused, image):
        for fn, p in zip(fns, child):
            x = fn(x, {k: v[image].cpu() for k, v in p.items()}) if fn is not None else x
        return x
    return run


# name: (gpupipe steps, torchvision per step (None: colour, leaves targets), mask tie share)
CHAINS = {
    "rrc+hflip+jitter": (lambda: [T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3)],
                         [OPS["randomresizedcrop"][1], OPS["hflip"][1], None], 0.0),
    "resize-up+centercrop+vflip": (lambda: [T.Resize(72), T.CenterCrop(64), T.RandomVerticalFlip()],
                                   [lambda x, p: TF.resize(x, [72, 96]), lambda x, p: TF.center_crop(x, [64, 64]),
                                    OPS["vflip"][1]], 0.0),
    "hflip+affine+perspective": (lambda: [T.RandomHorizontalFlip(), OPS["affine"][0](), T.RandomPerspective(0.3, p=1.0)],
                                 [OPS["hflip"][1], OPS["affine"][1],
                                  lambda x, p: TF.perspective(x, _START, p["end"].round().int().tolist(), fill=0)],
                                 2 * MASK_TIE_SHARE),
    "crop+rotation": (lambda: [T.RandomCrop(48), T.RandomRotation(20)],
                      [lambda x, p: TF.crop(x, int(p["top"]), int(p["left"]), 48, 48), OPS["rotation"][1]],
                      MASK_TIE_SHARE),
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_fused_compose_moves_targets_as_torchvision_in_sequence(device, chain):
    """The fused Compose (one warp for the images) moves targets as torchvision's ops one after
    another, and its images are those it returns without targets."""
    steps, fns, tie_share = CHAINS[chain]
    pipe, raw = T.Compose(steps()), _targets(seed=3)
    images = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device)
    key = _key(device)
    got_images, got = pipe(images, key, targets=pack_targets(raw, device=device))
    assert torch.equal(got_images, pipe(images, key))  # the image path is the same
    params = pipe.make_params(images, key)
    want_boxes, want_masks = [], []
    for i, t in enumerate(raw):
        run = _chain_theirs(pipe, params, fns)
        b = tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W))
        want_boxes.append(run(b, None, i).as_subclass(torch.Tensor))
        want_masks.append(run(tv_tensors.Mask(t["masks"][None]), None, i).as_subclass(torch.Tensor)[0])
    _compare(got, want_boxes, torch.stack(want_masks), tie_share, chain)


@pytest.mark.parametrize("kwargs", [{}, {"min_size": 3.0, "min_area": 20.0}])
def test_sanitize_bounding_boxes_is_torchvisions(device, kwargs):
    raw = _targets(seed=11)
    raw[0]["boxes"] = torch.cat([raw[0]["boxes"], torch.tensor([[5.0, 5.0, 5.0, 9.0], [1.0, 1.0, 1.5, 30.0],
                                                                 [2.0, 2.0, 4.0, 2.9], [70.0, 50.0, 80.0, 60.0]])])
    raw[0]["labels"] = torch.cat([raw[0]["labels"], torch.tensor([7, 8, 9, 6])])
    got = T.SanitizeBoundingBoxes(**kwargs).apply_targets(pack_targets(raw, device=device), {}, (H, W))
    theirs = v2.SanitizeBoundingBoxes(**kwargs)
    assert got.boxes is not None
    for d, t in zip(unpack_targets(got), raw):
        want = theirs({"boxes": tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W)),
                       "labels": t["labels"]})
        assert torch.equal(d["boxes"].cpu(), want["boxes"].as_subclass(torch.Tensor))
        assert torch.equal(d["labels"].cpu(), want["labels"])


def test_pack_and_unpack_round_trip_with_tv_tensors():
    raw = _targets()
    tv = [{"boxes": tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W)),
           "labels": t["labels"], "masks": tv_tensors.Mask(t["masks"])} for t in raw]
    packed = pack_targets(tv)
    assert isinstance(packed.boxes, Boxes) and type(packed.boxes.boxes) is torch.Tensor
    assert packed.boxes.counts.tolist() == [len(t["boxes"]) for t in raw] and packed.boxes.counts[1] == 0
    for d, t in zip(unpack_targets(packed), raw):
        assert all(torch.equal(d[k], t[k]) for k in ("boxes", "labels", "masks"))
    with pytest.raises(ValueError, match="XYXY"):
        pack_targets([{"boxes": tv_tensors.BoundingBoxes(torch.zeros(1, 4), format="XYWH", canvas_size=(H, W))}])


def test_a_batch_without_any_box_goes_through(device):
    raw = [{"boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.int64)} for _ in range(B)]
    pipe = T.Compose([T.RandomResizedCrop(32), T.RandomRotation(20), T.SanitizeBoundingBoxes()])
    images, got = pipe(torch.zeros((B, 3, H, W), dtype=torch.uint8, device=device), _key(device),
                       targets=pack_targets(raw, device=device))
    assert got.boxes is not None and got.boxes.boxes.shape == (0, 4) and got.boxes.counts.tolist() == [0] * B
    assert got.masks is None and images.shape == (B, 3, 32, 32)


def test_ops_that_cannot_move_targets_say_so(device):
    images = torch.zeros((B, 3, H, W), dtype=torch.uint8, device=device)
    targets = pack_targets(_targets(), device=device)
    with pytest.raises(TypeError, match="not supported by AugMix"):
        T.AugMix()(images, _key(device), targets=targets)
    out, same = T.ColorJitter(0.2)(images, _key(device), targets=targets)
    assert same is targets
    with pytest.raises(ValueError, match="masks should be"):
        T.RandomHorizontalFlip()(images[:, :, :10], _key(device), targets=targets)
