"""Targets through the containers and the auto-augment policies, against the real torchvision v2
(issue 27), and keyed randomness of boxes and masks.

Containers: each sample's boxes and masks follow the branch its image took; the reference runs
torchvision's functional ops on that sample's ``tv_tensors`` in that sample's branch (its own
draw of whether / which / in what order). Policies: torchvision v2's policies refuse boxes and
masks (``TypeError``); gpupipe's move them by the very method torchvision's policy calls for the
image (``_apply_image_or_video_transform``: ``F.affine`` / ``F.rotate``), which the reference
here calls on each sample's ``tv_tensors`` with that sample's ops and magnitudes. Tolerances are
test_targets_vs_torchvision.py's (boxes 1e-4 px; masks: nearest-neighbour ties after a warp, at
most 0.05% of the pixels per warp in the chain).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

import gpupipe.transforms as T
from gpupipe.augment.base import AugKey
from gpupipe.augment.policyops import OPS
from gpupipe.augment.targets import Targets, pack_targets, unpack_targets

BOX_TOL = 1e-4
MASK_TIE_SHARE = 5e-4
B, H, W = 8, 48, 64
NEAREST = v2.InterpolationMode.NEAREST


def _targets(n: int = B, seed: int = 27) -> list[dict[str, torch.Tensor]]:
    """0-4 boxes an image (image 1 none) and a label map of blobs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = 0 if i == 1 else int(rng.integers(1, 5))
        x1, y1 = rng.uniform(0, W - 8, k), rng.uniform(0, H - 8, k)
        x2, y2 = np.minimum(x1 + rng.uniform(4, W / 2, k), W), np.minimum(y1 + rng.uniform(4, H / 2, k), H)
        coarse = torch.from_numpy(rng.integers(0, 6, (6, 8))).to(torch.uint8)
        mask = torch.nn.functional.interpolate(coarse[None, None].float(), size=(H, W), mode="nearest")[0, 0]
        out.append({"boxes": torch.tensor(np.stack([x1, y1, x2, y2], -1).reshape(-1, 4), dtype=torch.float32),
                    "labels": torch.from_numpy(rng.integers(1, 10, k)).to(torch.int64), "masks": mask.to(torch.uint8)})
    return out


def _key(device, n: int = B, seed: int = 5) -> AugKey:
    return AugKey(seed, 0, torch.arange(n, device=device))


def _tv(t: dict[str, torch.Tensor]):
    return (tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(H, W)),
            tv_tensors.Mask(t["masks"][None]))


def _compare(got: Targets, want: list[tuple[torch.Tensor, torch.Tensor]], tie_share: float, what: str,
             labels: list[torch.Tensor] | None = None) -> None:
    """``got`` against per-image (boxes, mask) within the tolerances."""
    worst, differ = 0.0, 0.0
    for i, (d, (boxes, mask)) in enumerate(zip(unpack_targets(got), want)):
        boxes, mask = boxes.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor).reshape(d["masks"].shape)
        assert d["boxes"].shape == boxes.shape, (what, i, d["boxes"].shape, boxes.shape)
        if boxes.numel():
            worst = max(worst, (d["boxes"].cpu().double() - boxes.double()).abs().max().item())
        if labels is not None:
            assert torch.equal(d["labels"].cpu(), labels[i]), (what, i)
        differ = max(differ, (d["masks"].cpu() != mask).double().mean().item())
    assert worst <= BOX_TOL, f"{what}: boxes differ by up to {worst} px"
    assert differ <= tie_share, f"{what}: {differ:.4%} of an image's mask pixels differ (allowed {tie_share:.4%})"
    print(f"{what}: max |box diff| {worst:.2e} px, mask pixels differing {differ:.4%}")


def _sub(params: dict[str, torch.Tensor], prefix: str, i: int) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v[i].cpu() for k, v in params.items() if k.startswith(prefix)}


# one image's functional op for each gpupipe step below, with that image's params
def _rotate(x, p):
    return TF.rotate(x, float(p["angle"]), fill=0)


def _hflip(x, p):
    return TF.horizontal_flip(x) if bool(p["flip"]) else x


def _affine(x, p):
    return TF.affine(x, angle=float(p["angle"]), translate=[float(p["tx"]), float(p["ty"])], scale=float(p["scale"]),
                     shear=[float(p["shear_x"]), float(p["shear_y"])], interpolation=NEAREST, fill=0)


def _steps():
    return ([T.RandomRotation(25), T.RandomHorizontalFlip(), T.RandomAffine(10, translate=(0.3, 0.3))],
            [_rotate, _hflip, _affine])


def _run_container(kind: str, params, i: int, x):
    """torchvision's ops on one tv_tensor ``x`` in sample ``i``'s branch of container ``kind``."""
    _, fns = _steps()
    if kind == "apply":
        if not bool(params["apply"][i]):
            return x
        for j, fn in enumerate(fns):
            x = fn(x, _sub(params, f"t.{j}.", i))
        return x
    if kind == "choice":
        j = int(params["choice"][i])
        return fns[j](x, _sub(params, f"{j}.", i))
    for j in params["order"][i].tolist():
        x = fns[j](x, _sub(params, f"{j}.", i))
    return x


CONTAINERS = {"apply": lambda s: T.RandomApply(s, p=0.5), "choice": T.RandomChoice, "order": T.RandomOrder}


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("kind", list(CONTAINERS))
def test_targets_follow_each_samples_branch_through_a_container(device, kind, fuse):
    steps, _ = _steps()
    pipe, raw = T.Compose([CONTAINERS[kind](steps), T.ColorJitter(0.2)], fuse=fuse), _targets()
    images = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device)
    key = _key(device)
    got_images, got = pipe(images, key, targets=pack_targets(raw, device=device))
    assert torch.equal(got_images, pipe(images, key))  # the images are those it gives without targets
    params = pipe.make_params(images, key)
    inner = {k[2:]: v for k, v in params.items() if k.startswith("0.")}
    branches = inner[{"apply": "apply", "choice": "choice", "order": "order"}[kind]]
    assert len(set(map(str, branches.tolist()))) > 1  # the samples took different branches
    want = [tuple(_run_container(kind, inner, i, x) for x in _tv(t)) for i, t in enumerate(raw)]
    warps = {"apply": 2, "choice": 1, "order": 2}[kind]
    _compare(got, want, warps * MASK_TIE_SHARE, f"{kind} fuse={fuse}", [t["labels"] for t in raw])


def test_a_branch_that_drops_boxes_keeps_each_samples_own(device):
    """A branch with SanitizeBoundingBoxes changes the counts: each image takes its rows and
    labels from its own branch, in order (the gather path of select_targets)."""
    raw = _targets(seed=4)
    pipe = T.RandomApply([T.RandomAffine(0, translate=(0.45, 0.45)), T.SanitizeBoundingBoxes(min_size=6)], p=0.5)
    key = _key(device)
    params = pipe.make_params(torch.zeros((B, 3, H, W), device=device), key)
    got = pipe.apply_targets(pack_targets(raw, device=device), params, (H, W))
    sanitize = v2.SanitizeBoundingBoxes(min_size=6)
    want, labels = [], []
    for i, t in enumerate(raw):
        boxes, mask = _tv(t)
        if bool(params["apply"][i]):
            p = _sub(params, "t.0.", i)
            out = sanitize({"boxes": _affine(boxes, p), "labels": t["labels"]})
            want.append((out["boxes"], _affine(mask, p)))
            labels.append(out["labels"])
        else:
            want.append((boxes, mask))
            labels.append(t["labels"])
    assert params["apply"].any() and not params["apply"].all()
    assert sum(len(w[0]) for w in want) < sum(len(t["boxes"]) for t in raw)  # some boxes were dropped
    _compare(got, want, MASK_TIE_SHARE, "apply+sanitize", labels)


# ----------------------------------------------------------------------------- auto-augment policies

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
POLICIES = {
    "RandAugment": lambda: T.RandAugment(num_ops=3, magnitude=15),
    "TrivialAugmentWide": lambda: T.TrivialAugmentWide(fill=3),
    "AutoAugment-svhn": lambda: T.AutoAugment("svhn"),
    "every-geometric-op": lambda: T.RandAugment(num_ops=1),  # params replaced below
}


def _policy_params(name: str, policy, device):
    if name != "every-geometric-op":
        return policy.make_params(torch.zeros((B, 3, H, W), device=device), _key(device, seed=2))
    names = ["ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Rotate", "Brightness", "Identity"]
    magnitude = torch.tensor([0.3, -0.25, -17.7, 9.4, 30.0, -12.5, 0.5, 0.0], device=device)
    return {"op": torch.tensor([OPS.index(n) for n in names], device=device)[:, None], "magnitude": magnitude[:, None]}


@pytest.mark.parametrize("name", list(POLICIES))
def test_policies_move_targets_as_torchvisions_own_op_calls(device, name):
    """torchvision's policy refuses boxes and masks; each op it would apply to the image,
    applied by its own ``_apply_image_or_video_transform`` to the sample's boxes and mask, is
    what gpupipe's policy gives."""
    policy, raw = POLICIES[name](), _targets(seed=9)
    params = _policy_params(name, policy, device)
    got = policy.apply_targets(pack_targets(raw, device=device), params, (H, W))
    theirs = v2.RandAugment(fill=None if policy.fill is None else list(policy.fill))
    want, warps = [], 0
    for i, t in enumerate(raw):
        out = list(_tv(t))
        for op, m in zip(params["op"][i].tolist(), params["magnitude"][i].tolist()):
            if OPS[op] not in GEOMETRIC:  # a colour op: its functional takes no boxes, targets stay
                continue
            out = [theirs._apply_image_or_video_transform(x, OPS[op], m, interpolation=NEAREST, fill=theirs._fill)
                   for x in out]
        warps = max(warps, sum(OPS[op] in GEOMETRIC for op in params["op"][i].tolist()))
        want.append(tuple(out))
    assert any(OPS[o] in GEOMETRIC for o in params["op"].flatten().tolist()), "the draw should warp some sample"
    _compare(got, want, max(warps, 1) * MASK_TIE_SHARE, name, [t["labels"] for t in raw])
    with pytest.raises(TypeError, match="Inputs of type BoundingBoxes are not supported by"):
        v2.RandAugment()(torch.zeros((3, H, W), dtype=torch.uint8), _tv(raw[0])[0])


def test_augmix_refuses_targets_as_torchvision(device):
    images = torch.zeros((B, 3, H, W), dtype=torch.uint8, device=device)
    for keep in ("boxes", "masks"):
        targets = pack_targets([{keep: t[keep]} for t in _targets()], device=device)
        kind = "BoundingBoxes" if keep == "boxes" else "Mask"
        with pytest.raises(TypeError, match=f"Inputs of type {kind} are not supported by AugMix"):
            T.AugMix()(images, _key(device), targets=targets)
        with pytest.raises(TypeError, match=f"Inputs of type {kind} are not supported by AugMix"):
            v2.AugMix()(images[0].cpu(), _tv(_targets()[0])[0 if keep == "boxes" else 1])


# ----------------------------------------------------------------------------- keyed randomness

def _pipeline():
    return T.Compose([T.RandomIoUCrop(trials=8), T.RandomHorizontalFlip(), T.RandomRotation(10),
                      T.RandomChoice([T.RandAugment(), T.RandomAffine(5, translate=(0.1, 0.1))]),
                      T.RandomApply([T.RandomVerticalFlip(1.0)]), T.SanitizeBoundingBoxes()])


def test_the_same_samples_get_the_same_boxes_and_masks_in_any_batch(device):
    """(seed, epoch, sample id) decides each sample's boxes and masks, as its pixels: the batch
    reversed, or cut to a subset, gives every sample the same result."""
    raw = _targets(seed=12)
    images = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device=device)
    pipe = _pipeline()

    def run(order: list[int]):
        ids = torch.tensor(order, device=device)
        out, moved = pipe(images[ids], AugKey(7, 3, ids), targets=pack_targets([raw[i] for i in order], device=device))
        return {i: (out[n], d) for n, (i, d) in enumerate(zip(order, unpack_targets(moved)))}

    base = run(list(range(B)))
    for order in (list(reversed(range(B))), [6, 2, 5]):
        again = run(order)
        for i in order:
            assert torch.equal(again[i][0], base[i][0]), i
            assert all(torch.equal(again[i][1][k], base[i][1][k]) for k in ("boxes", "labels", "masks")), i
    other_epoch = pipe(images, AugKey(7, 4, torch.arange(B, device=device)), targets=pack_targets(raw, device=device))
    assert not all(torch.equal(a["masks"], base[i][1]["masks"]) for i, a in enumerate(unpack_targets(other_epoch[1])))
