"""torchvision v2's contract for the transforms gpupipe reproduces, written down as data.

For each transform: the arguments of an example; what each input dtype gives (the
output dtype and the top of its value range, or the exception torchvision raises);
torchvision's argument defaults (and where gpupipe's differ on purpose, as
docs/migration.md says); how parameters are sampled (range of each draw for given
arguments); the probability that a sample is changed; what a pixel outside the
input shows (``fill``, in the image's units); and which bad arguments raise which
exception (at construction or at the first call).

tests/augment/test_tv_contract.py checks gpupipe against this table everywhere, and the table
against torchvision itself wherever ``torchvision.transforms.v2`` imports (the GPU
machine; not the CPU torch of CI), so the table is torchvision's behaviour, not only
our reading of its documentation.

Argument values that are callables ``f(ns)`` are built in the namespace under test
(``gpupipe.transforms`` or ``torchvision.transforms.v2``): the contents of containers.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

REQUIRED = inspect.Parameter.empty
U8, F32 = torch.uint8, torch.float32
SIZE = (32, 48)  # (H, W) of the test images

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Sampled:
    """With ``kwargs`` on a SIZE image, the draw ``gpupipe(params)`` / ``torchvision(params)``
    (of each one's ``make_params``) is uniform over [low, high] (integers if ``integer``)."""
    what: str
    kwargs: Params
    low: float
    high: float
    gpupipe: Callable[[Params], Any]
    torchvision: Callable[[Params], Any]
    integer: bool = False


@dataclass(frozen=True)
class Contract:
    name: str
    example: Params
    outputs: Mapping[torch.dtype, tuple[torch.dtype, float | None] | type[Exception]]
    defaults: Params = field(default_factory=dict)
    differs: Params = field(default_factory=dict)  # gpupipe's default where it differs on purpose
    sampling: tuple[Sampled, ...] = ()
    applied: tuple[Params, float] | None = None  # (kwargs, probability that a sample is changed)
    fill: tuple[Params, tuple[int, int]] | None = None  # (kwargs with fill=FILL, a pixel outside the input)
    invalid: tuple[tuple[Params, type[Exception]], ...] = ()
    tv_input: str = "batch"  # "hwc": torchvision's transform takes one HWC array (ToTensor)

    @property
    def id(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.example.items() if not callable(v))})"


FILL = {U8: (10, 20, 30), F32: (0.25, 0.5, 0.75)}  # the fill argument, per image dtype
KEEP = {U8: (U8, 255.0), F32: (F32, 1.0)}  # a transform that keeps dtype and range
_INTERP = "interpolation"


def _p(name):
    return lambda p: p[name]


CONTRACTS: tuple[Contract, ...] = (
    # ------------------------------------------------------------------ geometry
    Contract("Resize", {"size": 20}, KEEP,
             defaults={"size": REQUIRED, _INTERP: "bilinear"},
             invalid=(({"size": [1, 2, 3]}, ValueError),)),
    Contract("CenterCrop", {"size": 20}, KEEP, defaults={"size": REQUIRED},
             invalid=(({"size": [1, 2, 3]}, ValueError),)),
    Contract("RandomCrop", {"size": 16, "padding": 4}, KEEP,
             defaults={"size": REQUIRED, "padding": None, "pad_if_needed": False, "fill": 0,
                       "padding_mode": "constant"},
             sampling=(Sampled("top", {"size": 16, "padding": 4}, -4, SIZE[0] - 16 + 4, _p("top"),
                               lambda p: p["top"] - 4, integer=True),),
             fill=({"size": (SIZE[0] + 8, SIZE[1] + 8), "padding": 4}, (0, 0)),
             invalid=(({"size": 8, "padding": [1, 2, 3]}, ValueError), ({"size": 8, "padding": "4"}, TypeError),
                      ({"size": 8, "padding": 2, "padding_mode": "wrap"}, ValueError),
                      ({"size": 8, "padding": 2, "fill": "red"}, TypeError))),
    Contract("RandomResizedCrop", {"size": 16}, KEEP,
             defaults={"size": REQUIRED, "scale": (0.08, 1.0), "ratio": (3.0 / 4.0, 4.0 / 3.0), _INTERP: "bilinear"},
             sampling=(Sampled("height", {"size": 16, "scale": (0.25, 0.5), "ratio": (1.0, 1.0)}, 20, 28,
                               _p("height"), _p("height"), integer=True),),
             invalid=(({"size": 8, "scale": 0.5}, TypeError), ({"size": 8, "ratio": 2.0}, TypeError))),
    Contract("RandomAffine", {"degrees": 20}, KEEP,
             defaults={"degrees": REQUIRED, "translate": None, "scale": None, "shear": None, _INTERP: "nearest",
                       "fill": 0},
             differs={_INTERP: "bilinear"},
             sampling=(
                 Sampled("angle", {"degrees": 30}, -30, 30, _p("angle"), _p("angle")),
                 Sampled("tx", {"degrees": 0, "translate": (0.1, 0.2)}, -5, 5, _p("tx"),
                         lambda p: p["translate"][0], integer=True),
                 Sampled("ty", {"degrees": 0, "translate": (0.1, 0.2)}, -6, 6, _p("ty"),
                         lambda p: p["translate"][1], integer=True),
                 Sampled("scale", {"degrees": 0, "scale": (0.8, 1.2)}, 0.8, 1.2, _p("scale"), _p("scale")),
                 Sampled("shear_x", {"degrees": 0, "shear": (-5, 5, 10, 20)}, -5, 5, _p("shear_x"),
                         lambda p: p["shear"][0]),
                 Sampled("shear_y", {"degrees": 0, "shear": (-5, 5, 10, 20)}, 10, 20, _p("shear_y"),
                         lambda p: p["shear"][1])),
             fill=({"degrees": (45, 45)}, (0, 0)),
             invalid=(({"degrees": -5}, ValueError), ({"degrees": [1, 2, 3]}, ValueError),
                      ({"degrees": 5, "translate": 0.1}, TypeError), ({"degrees": 5, "translate": (0.1,)}, ValueError),
                      ({"degrees": 5, "translate": (0.5, 1.5)}, ValueError),
                      ({"degrees": 5, "scale": 1.0}, TypeError), ({"degrees": 5, "scale": (0.0, 1.0)}, ValueError),
                      ({"degrees": 5, "shear": -3}, ValueError), ({"degrees": 5, "shear": (1, 2, 3)}, ValueError),
                      ({"degrees": 5, "fill": "x"}, TypeError))),
    Contract("RandomRotation", {"degrees": 20}, KEEP,
             defaults={"degrees": REQUIRED, _INTERP: "nearest", "fill": 0},
             differs={_INTERP: "bilinear"},
             sampling=(Sampled("angle", {"degrees": (10, 20)}, 10, 20, _p("angle"), _p("angle")),),
             fill=({"degrees": (45, 45)}, (0, 0)),
             invalid=(({"degrees": -1}, ValueError), ({"degrees": [1, 2, 3]}, ValueError))),
    Contract("RandomHorizontalFlip", {"p": 0.5}, KEEP, defaults={"p": 0.5}, applied=({"p": 0.3}, 0.3),
             invalid=(({"p": 1.5}, ValueError),)),
    Contract("RandomVerticalFlip", {"p": 0.5}, KEEP, defaults={"p": 0.5}, applied=({"p": 0.7}, 0.7),
             invalid=(({"p": -0.1}, ValueError),)),
    Contract("RandomPerspective", {"p": 1.0}, KEEP,
             defaults={"distortion_scale": 0.5, "p": 0.5, _INTERP: "bilinear", "fill": 0},
             applied=({"p": 0.4}, 0.4),
             invalid=(({"distortion_scale": 1.5}, ValueError), ({"p": 2.0}, ValueError))),
    # ------------------------------------------------------------------ colour
    Contract("ColorJitter", {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}, KEEP,
             defaults={"brightness": None, "contrast": None, "saturation": None, "hue": None},
             sampling=(
                 Sampled("brightness", {"brightness": 0.4}, 0.6, 1.4, _p("brightness"), _p("brightness_factor")),
                 Sampled("brightness", {"brightness": 1.5}, 0.0, 2.5, _p("brightness"), _p("brightness_factor")),
                 Sampled("contrast", {"contrast": (0.5, 1.5)}, 0.5, 1.5, _p("contrast"), _p("contrast_factor")),
                 Sampled("saturation", {"saturation": 0.3}, 0.7, 1.3, _p("saturation"), _p("saturation_factor")),
                 Sampled("hue", {"hue": 0.1}, -0.1, 0.1, _p("hue"), _p("hue_factor"))),
             invalid=(({"brightness": -0.1}, ValueError), ({"hue": 0.6}, ValueError),
                      ({"contrast": (1.5, 0.5)}, ValueError), ({"saturation": (1, 2, 3)}, TypeError))),
    Contract("RandomGrayscale", {"p": 1.0}, KEEP, defaults={"p": 0.1}, applied=({"p": 0.3}, 0.3),
             invalid=(({"p": 1.1}, ValueError),)),
    Contract("Grayscale", {"num_output_channels": 3}, KEEP, defaults={"num_output_channels": 1},
             invalid=(({"num_output_channels": 2}, ValueError),)),
    Contract("GaussianBlur", {"kernel_size": 5}, KEEP, defaults={"kernel_size": REQUIRED, "sigma": (0.1, 2.0)},
             sampling=(Sampled("sigma", {"kernel_size": 5, "sigma": (0.1, 2.0)}, 0.1, 2.0, _p("sigma"),
                               lambda p: p["sigma"][0]),),
             invalid=(({"kernel_size": 4}, ValueError), ({"kernel_size": 3, "sigma": -1.0}, ValueError),
                      ({"kernel_size": 3, "sigma": (2.0, 1.0)}, ValueError))),
    Contract("RandomErasing", {"p": 1.0}, KEEP,
             defaults={"p": 0.5, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": 0, "inplace": False},
             applied=({"p": 0.6, "scale": (0.1, 0.3)}, 0.6),
             invalid=(({"p": 1.5}, ValueError), ({"scale": (0.1, 1.5)}, ValueError), ({"value": "noise"}, ValueError))),
    # ------------------------------------------------------------------ casts, normalize
    Contract("Normalize", {"mean": [0.5] * 3, "std": [0.25] * 3}, {U8: TypeError, F32: (F32, None)},
             defaults={"mean": REQUIRED, "std": REQUIRED, "inplace": False},
             invalid=(({"mean": [0.5] * 3, "std": [0.2, 0.0, 0.2]}, ValueError),)),
    Contract("ToDtype", {"dtype": F32, "scale": True}, {U8: (F32, 1.0), F32: (F32, 1.0)},
             defaults={"dtype": REQUIRED, "scale": False}, differs={"dtype": F32, "scale": True},
             invalid=(({"dtype": "float32"}, ValueError),)),
    Contract("ToDtype", {"dtype": F32, "scale": False}, {U8: (F32, 255.0), F32: (F32, 1.0)}),
    Contract("ToDtype", {"dtype": U8, "scale": True}, {U8: (U8, 255.0), F32: (U8, 255.0)}),
    Contract("ToTensor", {}, {U8: (F32, 1.0)}, tv_input="hwc"),
    # ------------------------------------------------------------------ containers
    Contract("RandomApply", {"transforms": lambda ns: [ns.ColorJitter(0.4, 0.4)], "p": 0.5}, KEEP,
             defaults={"transforms": REQUIRED, "p": 0.5},
             applied=({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": 0.3}, 0.3),
             invalid=(({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": 1.5}, ValueError),
                      ({"transforms": lambda ns: ns.RandomGrayscale(1.0)}, TypeError))),
    Contract("RandomChoice", {"transforms": lambda ns: [ns.RandomHorizontalFlip(1.0), ns.RandomGrayscale(1.0)]},
             KEEP, defaults={"transforms": REQUIRED, "p": None},
             applied=({"transforms": lambda ns: [ns.RandomGrayscale(1.0), ns.RandomGrayscale(0.0)],
                       "p": [1.0, 3.0]}, 0.25),
             invalid=(({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": [0.5, 0.5]}, ValueError),)),
    Contract("RandomOrder", {"transforms": lambda ns: [ns.RandomHorizontalFlip(1.0), ns.ColorJitter(0.4)]}, KEEP,
             defaults={"transforms": REQUIRED}),
)
