"""torchvision v2's auto-augment policies — ``AutoAugment``, ``RandAugment``,
``TrivialAugmentWide``, ``AugMix`` — with each sample choosing its own ops and
magnitudes from the key (torchvision draws one choice per call, for the whole batch).

Same names, arguments, defaults (``interpolation`` nearest, AugMix's bilinear; ``fill``
None, i.e. 0), op spaces, magnitude bins and sign rule (a signed op is negated with
probability 1/2) as torchvision's; the ops are :mod:`gpupipe.augment.policyops`.
Parameters: ``op`` (B, S) int64 indices into :data:`~gpupipe.augment.policyops.OPS`
(Identity where an op is skipped) and ``magnitude`` (B, S) float32, for S op slots
applied in order; AugMix's are (B, width, depth) plus ``weights`` (B, 1 + width).

Shape: (B, C, H, W) uint8 → uint8, float in [0, 1] → the same float; C in (1, 3).

Targets: torchvision v2's policies refuse boxes and masks (``TypeError: Inputs of type
BoundingBoxes are not supported by RandAugment()``). ``AutoAugment``, ``RandAugment`` and
``TrivialAugmentWide`` move them: each sample's geometric ops (ShearX/Y, TranslateX/Y,
Rotate) move its boxes and masks as torchvision's own ``F.affine`` / ``F.rotate`` — the
calls the policy makes on the image — move ``tv_tensors`` (boxes re-enclosed and clamped
after each op, masks nearest with the policy's fill); the colour ops leave them. A pipeline
that runs under torchvision runs the same here; one that torchvision refuses gains a
definition it can check op by op. ``AugMix`` refuses them with torchvision's error: its
output blends several differently warped copies of the image, which no one box or label
map describes.
"""
from __future__ import annotations

import enum
import functools

import torch

from .base import AugKey, Transform
from .keys import draw, normal, uniform
from .policyops import OP_IDS, apply_ops, op_matrix
from .targets import Targets, move_boxes, move_masks
from .warp import check_fill, check_interpolation

__all__ = ["AutoAugmentPolicy", "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix"]


class AutoAugmentPolicy(str, enum.Enum):
    """torchvision's ``AutoAugmentPolicy``: the policies learned on these data sets."""
    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


# An op's magnitudes for ``n`` bins on an (h, w) image: ("linear", top(h, w)) is
# linspace(0, top, n); ("bits", start, span) is round(start - arange(n) / ((n - 1) / span));
# ("solarize",) is linspace(1, 0, n); None: no magnitude. The flag: signed.
def _linear(top):
    return ("linear", top if callable(top) else (lambda h, w, t=top: t))


_COLOUR = {name: (_linear(0.9), True) for name in ("Brightness", "Color", "Contrast", "Sharpness")}
_SHARED = {"Rotate": (_linear(30.0), True), "Solarize": (("solarize",), False),
           "AutoContrast": (None, False), "Equalize": (None, False)}
_IMAGENET_SPACE = {  # AutoAugment's and RandAugment's
    "ShearX": (_linear(0.3), True), "ShearY": (_linear(0.3), True),
    "TranslateX": (_linear(lambda h, w: 150.0 / 331.0 * w), True),
    "TranslateY": (_linear(lambda h, w: 150.0 / 331.0 * h), True),
    "Rotate": _SHARED["Rotate"], **_COLOUR, "Posterize": (("bits", 8, 4), False),
    "Solarize": _SHARED["Solarize"], "AutoContrast": _SHARED["AutoContrast"], "Equalize": _SHARED["Equalize"]}
SPACES = {
    "AutoAugment": {**_IMAGENET_SPACE, "Invert": (None, False)},
    "RandAugment": {"Identity": (None, False), **_IMAGENET_SPACE},
    "TrivialAugmentWide": {
        "Identity": (None, False), "ShearX": (_linear(0.99), True), "ShearY": (_linear(0.99), True),
        "TranslateX": (_linear(32.0), True), "TranslateY": (_linear(32.0), True), "Rotate": (_linear(135.0), True),
        **{name: (_linear(0.99), True) for name in _COLOUR}, "Posterize": (("bits", 8, 6), False),
        "Solarize": _SHARED["Solarize"], "AutoContrast": _SHARED["AutoContrast"], "Equalize": _SHARED["Equalize"]},
    "AugMix": {  # the first nine are all_ops=False's space
        "ShearX": (_linear(0.3), True), "ShearY": (_linear(0.3), True),
        "TranslateX": (_linear(lambda h, w: w / 3.0), True), "TranslateY": (_linear(lambda h, w: h / 3.0), True),
        "Rotate": _SHARED["Rotate"], "Posterize": (("bits", 4, 4), False), **_SHARED, **_COLOUR},
}

_P = {  # AutoAugment's sub-policies: ((op, probability, magnitude bin), (op, probability, magnitude bin))
    AutoAugmentPolicy.IMAGENET: """
        Posterize .4 8 Rotate .6 9 | Solarize .6 5 AutoContrast .6 - | Equalize .8 - Equalize .6 - |
        Posterize .6 7 Posterize .6 6 | Equalize .4 - Solarize .2 4 | Equalize .4 - Rotate .8 8 |
        Solarize .6 3 Equalize .6 - | Posterize .8 5 Equalize 1 - | Rotate .2 3 Solarize .6 8 |
        Equalize .6 - Posterize .4 6 | Rotate .8 8 Color .4 0 | Rotate .4 9 Equalize .6 - |
        Equalize 0 - Equalize .8 - | Invert .6 - Equalize 1 - | Color .6 4 Contrast 1 8 | Rotate .8 8 Color 1 2 |
        Color .8 8 Solarize .8 7 | Sharpness .4 7 Invert .6 - | ShearX .6 5 Equalize 1 - | Color .4 0 Equalize .6 - |
        Equalize .4 - Solarize .2 4 | Solarize .6 5 AutoContrast .6 - | Invert .6 - Equalize 1 - |
        Color .6 4 Contrast 1 8 | Equalize .8 - Equalize .6 -""",
    AutoAugmentPolicy.CIFAR10: """
        Invert .1 - Contrast .2 6 | Rotate .7 2 TranslateX .3 9 | Sharpness .8 1 Sharpness .9 3 |
        ShearY .5 8 TranslateY .7 9 | AutoContrast .5 - Equalize .9 - | ShearY .2 7 Posterize .3 7 |
        Color .4 3 Brightness .6 7 | Sharpness .3 9 Brightness .7 9 | Equalize .6 - Equalize .5 - |
        Contrast .6 7 Sharpness .6 5 | Color .7 7 TranslateX .5 8 | Equalize .3 - AutoContrast .4 - |
        TranslateY .4 3 Sharpness .2 6 | Brightness .9 6 Color .2 8 | Solarize .5 2 Invert 0 - |
        Equalize .2 - AutoContrast .6 - | Equalize .2 - Equalize .6 - | Color .9 9 Equalize .6 - |
        AutoContrast .8 - Solarize .2 8 | Brightness .1 3 Color .7 0 | Solarize .4 5 AutoContrast .9 - |
        TranslateY .9 9 TranslateY .7 9 | AutoContrast .9 - Solarize .8 3 | Equalize .8 - Invert .1 - |
        TranslateY .7 9 AutoContrast .9 -""",
    AutoAugmentPolicy.SVHN: """
        ShearX .9 4 Invert .2 - | ShearY .9 8 Invert .7 - | Equalize .6 - Solarize .6 6 | Invert .9 - Equalize .6 - |
        Equalize .6 - Rotate .9 3 | ShearX .9 4 AutoContrast .8 - | ShearY .9 8 Invert .4 - |
        ShearY .9 5 Solarize .2 6 | Invert .9 - AutoContrast .8 - | Equalize .6 - Rotate .9 3 |
        ShearX .9 4 Solarize .3 3 | ShearY .8 8 Invert .7 - | Equalize .9 - TranslateY .6 6 |
        Invert .9 - Equalize .6 - | Contrast .3 3 Rotate .8 4 | Invert .8 - TranslateY 0 2 |
        ShearY .7 6 Solarize .4 8 | Invert .6 - Rotate .8 4 | ShearY .3 7 TranslateX .9 3 |
        ShearX .1 6 Invert .6 - | Solarize .7 2 TranslateY .6 7 | ShearY .8 4 Invert .8 - |
        ShearX .7 9 TranslateY .8 3 | ShearY .8 5 AutoContrast .7 - | ShearX .7 2 Invert .1 -""",
}


def sub_policies(policy: AutoAugmentPolicy) -> list[tuple[tuple[str, float, int | None], ...]]:
    """AutoAugment's 25 sub-policies of ``policy``, as torchvision lists them."""
    out = []
    for text in _P[policy].split("|"):
        w = text.split()
        out.append(tuple((w[i], float(w[i + 1]), None if w[i + 2] == "-" else int(w[i + 2])) for i in (0, 3)))
    return out


def _magnitudes(spec, n: int, h: int, w: int) -> torch.Tensor:
    """(n,) float32 magnitudes of one op (zeros for an op without one), built as torchvision builds them."""
    if spec is None:
        return torch.zeros(n)
    if spec[0] == "linear":
        return torch.linspace(0.0, float(spec[1](h, w)), n)
    if spec[0] == "bits":
        return (spec[1] - (torch.arange(n) / ((n - 1) / spec[2]))).round().int().to(torch.float32)
    return torch.linspace(1.0, 0.0, n)


@functools.lru_cache(maxsize=64)
def space_table(space: str, num_bins: int, hw: tuple[int, int], device: torch.device, all_ops: bool = True):
    """(op ids (K,) int64, magnitudes (K, num_bins) float32, signed (K,) bool) of a
    policy's op space, on ``device`` (copied once, without a sync)."""
    items = list(SPACES[space].items())[: None if all_ops else 9]
    ids = torch.tensor([OP_IDS[name] for name, _ in items])
    mags = torch.stack([_magnitudes(spec, num_bins, *hw) for _, (spec, _) in items])
    signed = torch.tensor([s for _, (_, s) in items])
    return tuple(t.to(device, non_blocking=True) for t in (ids, mags, signed))


def _choose(u: torch.Tensor, k: int) -> torch.Tensor:
    """Integers uniform in [0, k) from uniforms ``u``."""
    return (u * k).floor().clamp_(max=k - 1).to(torch.int64)


def _signed(mags: torch.Tensor, signed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Magnitudes negated where the op is signed and ``u <= 0.5`` (torchvision's rule)."""
    return torch.where(signed & (u <= 0.5), -mags, mags)


class _Policy(Transform):
    """What the policies share: torchvision's ``interpolation`` and ``fill`` for the
    geometric ops, and applying (B, S) op slots in order."""

    def __init__(self, interpolation, fill) -> None:
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        self.fill = None if fill is None else check_fill(fill)

    def _run(self, images: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
        for s in range(op.shape[1]):  # after the first slot the batch is this call's own
            images = apply_ops(images, op[:, s], magnitude[:, s], self.interpolation, self.fill, owned=s > 0)
        return images

    def transform(self, images, params):
        return self._run(images, params["op"], params["magnitude"])

    def apply_targets(self, targets: Targets, params, in_hw):
        """Each op slot in turn: the geometric ops' matrices move boxes and masks, the others
        leave them (an identity matrix; a box already inside the canvas stays as it is)."""
        op, magnitude = params["op"], params["magnitude"]
        padding = "zeros" if self.fill is None or all(v == 0 for v in self.fill) else "fill"
        for s in range(op.shape[1]):
            matrix = op_matrix(op[:, s], magnitude[:, s], in_hw)
            boxes = None if targets.boxes is None else move_boxes(targets.boxes, matrix, in_hw)
            masks = None if targets.masks is None else move_masks(targets.masks, matrix, in_hw, padding, self.fill)
            targets = Targets(boxes, masks)
        return targets


def _hw(images: torch.Tensor) -> tuple[int, int]:
    return int(images.shape[-2]), int(images.shape[-1])


def _check_bins(num_magnitude_bins) -> int:
    if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins should be an integer >= 2 (got {num_magnitude_bins!r})")
    return num_magnitude_bins


class TrivialAugmentWide(_Policy):
    """torchvision ``TrivialAugmentWide(num_magnitude_bins, interpolation, fill)``: one op
    of 14 per sample, uniformly, with a magnitude bin uniform in ``num_magnitude_bins``."""

    def __init__(self, num_magnitude_bins: int = 31, interpolation="nearest", fill=None) -> None:
        super().__init__(interpolation, fill)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)

    def make_params(self, images, key):
        ids, mags, signed = space_table(type(self).__name__, self.num_magnitude_bins, _hw(images),
                                        key.sample_ids.device)
        u = draw(key, 0, 3)
        local, bins = _choose(u[:, 0], ids.numel()), _choose(u[:, 1], self.num_magnitude_bins)
        magnitude = _signed(mags[local, bins], signed[local], u[:, 2])
        return {"op": ids[local][:, None], "magnitude": magnitude[:, None]}


class RandAugment(_Policy):
    """torchvision ``RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation,
    fill)``: ``num_ops`` ops of 14 in a row per sample, each uniformly, at bin ``magnitude``."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31, interpolation="nearest",
                 fill=None) -> None:
        super().__init__(interpolation, fill)
        if not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"num_ops should be a non-negative integer, but got {num_ops} instead.")
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)
        if not isinstance(magnitude, int) or not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"magnitude should be an integer bin in [0, num_magnitude_bins={num_magnitude_bins}) "
                             f"(got {magnitude!r})")
        self.num_ops, self.magnitude = num_ops, magnitude

    def make_params(self, images, key):
        ids, mags, signed = space_table(type(self).__name__, self.num_magnitude_bins, _hw(images),
                                        key.sample_ids.device)
        local = _choose(draw(key, 0, self.num_ops), ids.numel())
        magnitude = _signed(mags[local, self.magnitude], signed[local], draw(key, 1, self.num_ops))
        return {"op": ids[local], "magnitude": magnitude}


class AutoAugment(_Policy):
    """torchvision ``AutoAugment(policy, interpolation, fill)``: one of the policy's 25
    sub-policies per sample, uniformly; each of its two ops applied with its probability,
    at its bin of 10."""

    def __init__(self, policy=AutoAugmentPolicy.IMAGENET, interpolation="nearest", fill=None) -> None:
        super().__init__(interpolation, fill)
        value = str(getattr(policy, "value", policy)).lower()
        if value not in {p.value for p in AutoAugmentPolicy}:
            raise ValueError(f"The provided policy {policy} is not recognized; choose from "
                             f"{', '.join(p.value for p in AutoAugmentPolicy)}")
        self.policy = AutoAugmentPolicy(value)

    def make_params(self, images, key):
        ids, prob, mags, signed = _policy_table(self.policy, _hw(images), key.sample_ids.device)
        chosen = _choose(draw(key, 0)[:, 0], ids.shape[0])
        applied = draw(key, 1, 2) <= prob[chosen]
        magnitude = _signed(mags[chosen], signed[chosen], draw(key, 2, 2))
        return {"op": torch.where(applied, ids[chosen], OP_IDS["Identity"]), "magnitude": magnitude * applied}


@functools.lru_cache(maxsize=16)
def _policy_table(policy: AutoAugmentPolicy, hw: tuple[int, int], device: torch.device):
    """(ids, probabilities, magnitudes, signed), each (25, 2), of ``policy`` on ``device``."""
    space_ids, space_mags, space_signed = space_table("AutoAugment", 10, hw, torch.device("cpu"))
    names = list(SPACES["AutoAugment"])
    rows = [[(names.index(op), p, b) for op, p, b in sub] for sub in sub_policies(policy)]
    local = torch.tensor([[r[0] for r in row] for row in rows])
    bins = torch.tensor([[r[2] or 0 for r in row] for row in rows])
    tables = (space_ids[local], torch.tensor([[r[1] for r in row] for row in rows]),
              space_mags[local, bins], space_signed[local])
    return tuple(t.to(device, non_blocking=True) for t in tables)


class AugMix(_Policy):
    """torchvision ``AugMix(severity, mixture_width, chain_depth, alpha, all_ops,
    interpolation, fill)``: ``mixture_width`` chains of ``chain_depth`` ops (or 1 to 3
    per chain and sample when ``chain_depth`` <= 0), each op uniform in the space (13
    ops, 9 without ``all_ops``) at a bin uniform below ``severity`` (of 10); the chains
    mixed with Dirichlet(``alpha``) weights, then with the image by a Beta(``alpha``,
    ``alpha``) weight — all per sample. uint8 output is the mix truncated, as torchvision's."""

    def __init__(self, severity: int = 3, mixture_width: int = 3, chain_depth: int = -1, alpha: float = 1.0,
                 all_ops: bool = True, interpolation="bilinear", fill=None) -> None:
        super().__init__(interpolation, fill)
        if not isinstance(severity, int) or not 1 <= severity <= 10:
            raise ValueError(f"The severity must be between [1, 10]. Got {severity} instead.")
        if not isinstance(mixture_width, int) or mixture_width < 1:
            raise ValueError(f"mixture_width should be a positive integer (got {mixture_width!r})")
        if not isinstance(chain_depth, int):
            raise ValueError(f"chain_depth should be an integer (<= 0: 1 to 3 at random), got {chain_depth!r}")
        if not float(alpha) > 0:
            raise ValueError(f"alpha should be positive (got {alpha!r})")
        self.severity, self.mixture_width, self.chain_depth = severity, mixture_width, chain_depth
        self.alpha, self.all_ops = float(alpha), bool(all_ops)

    def make_params(self, images, key):
        ids, mags, signed = space_table(type(self).__name__, 10, _hw(images), key.sample_ids.device, self.all_ops)
        width, depth = self.mixture_width, self.chain_depth if self.chain_depth > 0 else 3
        if self.chain_depth > 0:
            depths = torch.full((key.sample_ids.shape[0], width, 1), depth, device=key.sample_ids.device)
        else:
            depths = 1 + _choose(draw(key, 0, width), 3)[..., None]
        local = _choose(draw(key, 1, width * depth), ids.numel()).reshape(-1, width, depth)
        bins = _choose(draw(key, 2, width * depth), self.severity).reshape(-1, width, depth)
        magnitude = _signed(mags[local, bins], signed[local], draw(key, 3, width * depth).reshape(-1, width, depth))
        used = torch.arange(depth, device=depths.device) < depths
        beta = _dirichlet(key.child(4), self.alpha, 2)
        weights = torch.cat([beta[:, :1], _dirichlet(key.child(5), self.alpha, width) * beta[:, 1:]], dim=1)
        return {"op": torch.where(used, ids[local], OP_IDS["Identity"]), "magnitude": magnitude * used,
                "weights": weights}

    def apply_targets(self, targets: Targets, params, in_hw):
        kind = "BoundingBoxes" if targets.boxes is not None else "Mask"
        raise TypeError(f"Inputs of type {kind} are not supported by AugMix() (as in torchvision: the mix of "
                        "differently warped copies has no one box or mask); use RandAugment, TrivialAugmentWide "
                        "or AutoAugment, which move them")

    def transform(self, images, params):
        weights = params["weights"].to(images.device, torch.float32).reshape(*params["weights"].shape, 1, 1, 1)
        mix = weights[:, 0] * images
        for i in range(self.mixture_width):
            mix += weights[:, 1 + i] * self._run(images, params["op"][:, i], params["magnitude"][:, i])
        return mix.to(images.dtype)


def _dirichlet(key: AugKey, alpha: float, k: int, tries: int = 8) -> torch.Tensor:
    """(B, k) float32 Dirichlet(alpha, …, alpha) per sample: k keyed Gamma(alpha)
    variates (Marsaglia and Tsang's method, the first of ``tries`` candidates accepted;
    for alpha < 1 a Gamma(alpha + 1) times U^(1/alpha)), normalised."""
    a = alpha if alpha >= 1 else alpha + 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    b = key.sample_ids.shape[0]
    kz, ku = key.child(0), key.child(1)
    z = normal(kz.seed, kz.epoch, kz.sample_ids, kz.tag, k * tries).reshape(b, k, tries)
    u = uniform(ku.seed, ku.epoch, ku.sample_ids, ku.tag, k * tries + k).clamp_min(1e-12)
    v = (1.0 + c * z) ** 3
    ok = (v > 0) & (torch.log(u[:, : k * tries].reshape(b, k, tries))
                    < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-12)))
    first = torch.where(ok.any(-1), ok.to(torch.int8).argmax(-1), tries - 1)
    gamma = d * v.clamp_min(1e-12).gather(-1, first[..., None])[..., 0]
    if alpha < 1:
        gamma = gamma * u[:, k * tries:] ** (1.0 / alpha)
    return gamma / gamma.sum(dim=1, keepdim=True)
