"""RandomIoUCrop against the real torchvision v2, and targets in the augment stage (issue 27).

RandomIoUCrop: for the crops gpupipe settles, torchvision's own ``RandomIoUCrop.transform``
(crop, boxes whose centre left the crop zeroed) then ``F.resize`` to the output size gives the
same pixels (exactly: the same ``F.interpolate``), boxes (within 1e-4 px) and masks (exactly);
the crops gpupipe draws follow torchvision's distribution (the rate of "leave it as it is" and
the mean crop size and place, within 5 standard errors of the difference, torchvision's own
``make_params`` run 400 times on the same image and boxes).
"""
from __future__ import annotations

import math

import pytest
import torch
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

import gpupipe.transforms as T
from gpupipe.augment.base import AugKey
from gpupipe.augment.registry import build_transform
from gpupipe.augment.stage import AugmentStage
from gpupipe.augment.targets import Targets, pack_targets, unpack_targets
from gpupipe.decode.base import DecodedBatch

B, H, W = 6, 60, 80
BOXES = torch.tensor([[5.0, 5.0, 30.0, 40.0], [40.0, 20.0, 75.0, 55.0], [10.0, 35.0, 25.0, 58.0]])
BOX_TOL = 1e-4


def _raw(n: int = B) -> list[dict[str, torch.Tensor]]:
    """Image i holds the first i % 4 of BOXES (none for i % 4 == 0), moved by i px, and a mask."""
    out = []
    for i in range(n):
        k = i % 4
        mask = torch.zeros((H, W), dtype=torch.uint8)
        mask[10 + i:40, 20:60 - i] = 1 + i % 3
        out.append({"boxes": (BOXES[:k] + i).clamp(max=W).clamp(max=torch.tensor([W, H, W, H])),
                    "labels": torch.arange(k, dtype=torch.int64) + 1, "masks": mask})
    return out


def _key(device, n: int = B) -> AugKey:
    return AugKey(3, 1, torch.arange(n, device=device))


def _sub(params, prefix: str, i: int) -> dict:
    return {k[len(prefix):]: v[i].cpu() for k, v in params.items() if k.startswith(prefix)}


def _theirs_crop(x, p: dict, boxes_in: torch.Tensor, size):
    """torchvision's RandomIoUCrop.transform with gpupipe's crop (its within-crop flags computed
    by its rule on the boxes that reached it), then F.resize to ``size``."""
    if bool(p["crop"]):
        top, left, h, w = (int(p[k]) for k in ("top", "left", "height", "width"))
        cx, cy = 0.5 * (boxes_in[:, 0] + boxes_in[:, 2]), 0.5 * (boxes_in[:, 1] + boxes_in[:, 3])
        within = (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)
        x = v2.RandomIoUCrop().transform(x, {"top": top, "left": left, "height": h, "width": w,
                                             "is_within_crop_area": within})
    return TF.resize(x, list(size)) if tuple(x.shape[-2:]) != tuple(size) else x


@pytest.mark.parametrize("size", [None, (36, 40)])
def test_ioucrop_in_a_chain_is_torchvisions_crop_then_resize(device, size):
    """hflip → RandomIoUCrop → SanitizeBoundingBoxes: the crop is settled by the flipped boxes;
    pixels, boxes, labels and masks are torchvision's for that crop."""
    raw = _raw()
    pipe = T.Compose([T.RandomHorizontalFlip(), T.RandomIoUCrop(size=size), T.SanitizeBoundingBoxes()])
    images = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device)
    key = _key(device)
    got_images, got = pipe(images, key, targets=pack_targets(raw, device=device))
    params, _ = pipe.resolve_targets(pack_targets(raw, device=device), pipe.make_params(images, key), (H, W))
    out_hw = size or (H, W)
    assert got_images.shape == (B, 3, *out_hw) and params["1.crop"].any() and not params["1.crop"].all()
    sanitize = v2.SanitizeBoundingBoxes()
    worst = 0.0
    for i, (t, d) in enumerate(zip(raw, unpack_targets(got))):
        flip, crop = _sub(params, "0.", i), _sub(params, "1.", i)
        boxes = tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W))
        boxes = TF.horizontal_flip(boxes) if bool(flip["flip"]) else boxes
        flipped = boxes.as_subclass(torch.Tensor).clone()
        # torchvision on the same device: its uint8 resize is another kernel on CUDA (float,
        # rounded) than on the CPU (fixed point), a grey level apart (seen on the H100)
        run = [TF.horizontal_flip(x) if bool(flip["flip"]) else x
               for x in (tv_tensors.Image(images[i]), tv_tensors.Mask(t["masks"][None].to(device)))]
        image, mask = (_theirs_crop(x, crop, flipped, out_hw) for x in run)
        want = sanitize({"boxes": _theirs_crop(boxes, crop, flipped, out_hw), "labels": t["labels"]})
        assert torch.equal(got_images[i].cpu(), image.as_subclass(torch.Tensor).cpu()), i
        assert torch.equal(d["masks"].cpu(), mask.as_subclass(torch.Tensor)[0].cpu()), i
        assert torch.equal(d["labels"].cpu(), want["labels"]) and d["boxes"].shape == want["boxes"].shape, i
        if len(d["boxes"]):
            worst = max(worst, (d["boxes"].cpu() - want["boxes"].as_subclass(torch.Tensor)).abs().max().item())
    assert worst <= BOX_TOL, worst
    print(f"RandomIoUCrop(size={size}): max |box diff| {worst:.2e} px; pixels and masks identical")


def _stats(rows: list[tuple[float, ...]]) -> tuple[float, list[tuple[float, float]]]:
    """(rate of 'leave it', [(mean, variance of the mean)] of top, left, height, width over the crops)."""
    crops = torch.tensor([r for r in rows if r], dtype=torch.float64).reshape(-1, 4)
    rate = 1 - len(crops) / len(rows)
    return rate, [(float(c.mean()), float(c.var()) / len(c)) for c in crops.unbind(1)]


def test_ioucrop_draws_crops_as_torchvision_does():
    n = 1500
    raw = [{"boxes": BOXES, "labels": torch.ones(3, dtype=torch.int64)}] * n
    t = T.RandomIoUCrop()
    params, _ = t.resolve_targets(pack_targets(raw), t.make_params(torch.zeros((n, 3, H, W)), _key("cpu", n)), (H, W))
    ours = [tuple(float(params[k][i]) for k in ("top", "left", "height", "width")) if params["crop"][i] else ()
            for i in range(n)]
    torch.manual_seed(0)
    theirs_t, image = v2.RandomIoUCrop(), tv_tensors.Image(torch.zeros((3, H, W), dtype=torch.uint8))
    boxes = tv_tensors.BoundingBoxes(BOXES, format="XYXY", canvas_size=(H, W))
    theirs = [tuple(float(p[k]) for k in ("top", "left", "height", "width")) if p else ()
              for p in (theirs_t.make_params([image, boxes]) for _ in range(400))]
    (r1, m1), (r2, m2) = _stats(ours), _stats(theirs)
    se = math.sqrt(max(r2 * (1 - r2), 1e-3) * (1 / n + 1 / len(theirs)))
    assert abs(r1 - r2) <= 5 * se, ("leave-it rate", r1, r2)
    for name, (a, va), (b, vb) in zip(("top", "left", "height", "width"), m1, m2):
        assert abs(a - b) <= 5 * math.sqrt(va + vb), (name, a, b)
    print(f"RandomIoUCrop draws: leave-it {r1:.3f} vs torchvision {r2:.3f}; means "
          + ", ".join(f"{k} {a:.1f}/{b:.1f}" for k, (a, _), (b, _) in zip(("top", "left", "h", "w"), m1, m2)))


def test_ioucrop_without_boxes_raises_and_an_image_without_boxes_is_left_as_it_is(device):
    t = T.RandomIoUCrop(trials=5)
    images = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device)
    with pytest.raises(TypeError, match=r"RandomIoUCrop\(\) requires input sample to contain"):
        t(images, _key(device))
    with pytest.raises(TypeError, match=r"RandomIoUCrop\(\) requires input sample to contain"):
        t(images, _key(device), targets=Targets(masks=torch.zeros((B, H, W), dtype=torch.uint8, device=device)))
    out, got = t(images, _key(device), targets=pack_targets(_raw(), device=device))
    for i in (0, 4):  # no box: torchvision ends at "leave it" (option 1.0)
        assert torch.equal(out[i], images[i])


def test_ioucrop_is_registered_and_converted_from_torchvision():
    built = build_transform("RandomIoUCrop", {"trials": 5, "sampler_options": [0.5, 1.0]})
    assert isinstance(built, T.RandomIoUCrop) and built.trials == 5 and built.options == [0.5, 1.0]
    assert isinstance(build_transform("SanitizeBoundingBoxes", {"min_size": 2}), T.SanitizeBoundingBoxes)
    pipe = T.from_torchvision(v2.Compose([v2.RandomIoUCrop(min_scale=0.5, trials=10), v2.SanitizeBoundingBoxes(3)]))
    crop, sanitize = pipe.transforms
    assert isinstance(crop, T.RandomIoUCrop) and (crop.min_scale, crop.trials) == (0.5, 10)
    assert isinstance(sanitize, T.SanitizeBoundingBoxes) and sanitize.min_size == 3.0


# ----------------------------------------------------------------------------- the augment stage

def _batch(device, targets: Targets | None) -> DecodedBatch:
    return DecodedBatch(images=torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device),
                        labels=torch.zeros(B, dtype=torch.int64, device=device),
                        valid=torch.ones(B, dtype=torch.bool, device=device),
                        sample_ids=torch.arange(10, 10 + B, device=device), keys=tuple(map(str, range(B))), epoch=2,
                        targets=targets)


def test_the_stage_moves_the_batchs_targets(device):
    pipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((32, 40)), T.SanitizeBoundingBoxes()])
    batch = _batch(device, pack_targets(_raw(), device=device))
    images, targets = pipe(batch.images, AugKey.for_batch(batch, 9), targets=batch.targets)
    out = AugmentStage(pipe, None, seed=9)(batch)
    assert torch.equal(out.images, images) and out.targets is not None and out.images.shape[-2:] == (32, 40)
    for a, b in zip(unpack_targets(out.targets), unpack_targets(targets)):
        assert all(torch.equal(a[k], b[k]) for k in ("boxes", "labels", "masks"))
    assert out.targets.masks is not None and out.targets.masks.shape == (B, 32, 40)


def test_a_mix_with_targets_raises_torchvisions_error(device):
    message = r"MixUp\(\) does not support PIL images, bounding boxes, keypoints and masks"
    batch = _batch(device, pack_targets(_raw(), device=device))
    with pytest.raises(ValueError, match=message):
        AugmentStage(T.Compose([T.RandomHorizontalFlip()]), T.MixUp(num_classes=3), seed=0)(batch)
    with pytest.raises(ValueError, match=message.replace("MixUp", "CutMix")):
        AugmentStage(None, T.CutMix(num_classes=3), seed=0, targets=("boxes",))  # at construction
    with pytest.raises(ValueError, match=message):
        T.MixUp(num_classes=3)(batch.images.float(), batch.labels, _key(device), targets=batch.targets)
    with pytest.raises(ValueError, match=message):  # torchvision's words
        v2.MixUp(num_classes=3)(batch.images.cpu(), tv_tensors.BoundingBoxes(BOXES, format="XYXY", canvas_size=(H, W)),
                                torch.zeros(B, dtype=torch.int64))
    AugmentStage(None, T.MixUp(num_classes=3), seed=0, targets=())  # no targets: fine


def test_a_plain_callable_with_targets_must_take_them(device):
    batch = _batch(device, pack_targets(_raw(), device=device))
    with pytest.raises(TypeError, match="plain callable on the images and cannot move the batches' boxes, masks"):
        AugmentStage(lambda images: images, None, seed=0)(batch)
    with pytest.raises(TypeError, match="cannot move"):
        AugmentStage(lambda images, **kw: images, None, seed=0, targets=("masks",))
    seen = {}

    def flip(images, batch, targets):
        seen["ids"] = batch.sample_ids
        return images.flip(-1), Targets(targets.boxes, targets.masks.flip(-1))

    masks = batch.targets.masks
    out = AugmentStage(flip, None, seed=0)(batch)
    assert torch.equal(out.targets.masks, masks.flip(-1)) and torch.equal(seen["ids"], batch.sample_ids)
    with pytest.raises(TypeError, match=r"should return \(images, Targets\)"):
        AugmentStage(lambda images, targets=None: images, None, seed=0)(batch)
    plain = _batch(device, None)
    assert AugmentStage(lambda images: images + 1, None, seed=0)(plain).targets is None  # no targets: as before


def test_ioucrop_in_random_order_crops_images_and_targets_alike(device):
    """In RandomOrder the crop is settled at the slot each sample's order puts it (before or after
    its flip): the images, cut with the parameters kept, match the masks, moved slot by slot."""
    raw = _raw(16)
    masks = torch.stack([t["masks"] for t in raw]).to(device)
    pipe = T.RandomOrder([T.RandomIoUCrop(interpolation="nearest", trials=10), T.RandomHorizontalFlip()])
    key = _key(device, 16)
    out, got = pipe(masks[:, None].expand(-1, 3, -1, -1).contiguous(), key, targets=pack_targets(raw, device=device))
    params, _ = pipe.resolve_targets(pack_targets(raw, device=device), pipe.make_params(masks[:, None], key), (H, W))
    assert got.masks is not None and torch.equal(out[:, 0], got.masks)
    crop_first = params["order"][:, 0] == 0
    assert (crop_first & params["0.crop"]).any() and (~crop_first & params["0.crop"]).any()
