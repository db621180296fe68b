"""torchvision v2's contract for the transforms gpupipe reproduces, written down as data.

For each transform: the arguments of an example; what each input dtype gives (the
output dtype and the top of its value range, or the exception torchvision raises);
torchvision's argument defaults (and where gpupipe's differ on purpose, as
docs/migration.md says); how parameters are sampled (range of each draw for given
arguments); the probability that a sample is changed; what a pixel outside the
input shows (``fill``, in the image's units); and which bad arguments raise which
exception (at construction or at the first call) with what message (:class:`Bad`).

tests/augment/test_tv_contract.py checks gpupipe against this table, and the table against
torchvision itself (the test venv installs the real torchvision, see tests/tvshim.py), so
the table is torchvision's behaviour, not only our reading of its documentation.

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
class Bad:
    """Arguments torchvision rejects: the exception type, a regular expression that both
    torchvision's message and gpupipe's match (torchvision's words; gpupipe may add the
    way out), and the dtype of the batch the first call gets (a check at the call may
    meet the input first: torchvision's Normalize on uint8 raises TypeError before it
    looks at ``std``)."""
    kwargs: Params
    error: type[Exception]
    match: str
    input: torch.dtype = torch.uint8


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
    invalid: tuple[Bad, ...] = ()
    tv_input: str = "batch"  # "hwc": torchvision's transform takes one HWC array (ToTensor)

    @property
    def id(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.example.items() if not callable(v))})"


FILL = {U8: (10, 20, 30), F32: (0.25, 0.5, 0.75)}  # the fill argument, per image dtype
KEEP = {U8: (U8, 255.0), F32: (F32, 1.0)}  # a transform that keeps dtype and range
_INTERP = "interpolation"
_P_RANGE = r"`p` should be a floating point value in the interval \[0\.0, 1\.0\]"
_FILL_ARG = "Got inappropriate fill arg, only Numbers, tuples"
_PADDING = r"Padding must be an int or a 1, 2, or 4 element of tuple or list, got "


def _p(name):
    return lambda p: p[name]


CONTRACTS: tuple[Contract, ...] = (
    # ------------------------------------------------------------------ geometry
    Contract("Resize", {"size": 20}, KEEP,
             defaults={"size": REQUIRED, _INTERP: "bilinear"},
             invalid=(Bad({"size": [1, 2, 3]}, ValueError,
                          r"size can be an integer.*a sequence of one or two integers.*but got \[1, 2, 3\]"),)),
    Contract("CenterCrop", {"size": 20}, KEEP, defaults={"size": REQUIRED},
             invalid=(Bad({"size": [1, 2, 3]}, ValueError, r"Please provide only two dimensions \(h, w\) for size"),)),
    Contract("RandomCrop", {"size": 16, "padding": 4}, KEEP,
             defaults={"size": REQUIRED, "padding": None, "pad_if_needed": False, "fill": 0,
                       "padding_mode": "constant"},
             sampling=(Sampled("top", {"size": 16, "padding": 4}, -4, SIZE[0] - 16 + 4, _p("top"),
                               lambda p: p["top"] - 4, integer=True),),
             fill=({"size": (SIZE[0] + 8, SIZE[1] + 8), "padding": 4}, (0, 0)),
             invalid=(Bad({"size": 8, "padding": [1, 2, 3]}, ValueError, _PADDING + r"\[1, 2, 3\]"),
                      Bad({"size": 8, "padding": "4"}, ValueError, _PADDING + "4"),
                      Bad({"size": 8, "padding": 2, "padding_mode": "wrap"}, ValueError,
                          "Padding mode should be either constant, edge, reflect or symmetric"),
                      Bad({"size": 8, "padding": 2, "fill": "red"}, TypeError, _FILL_ARG))),
    Contract("RandomResizedCrop", {"size": 16}, KEEP,
             defaults={"size": REQUIRED, "scale": (0.08, 1.0), "ratio": (3.0 / 4.0, 4.0 / 3.0), _INTERP: "bilinear"},
             sampling=(Sampled("height", {"size": 16, "scale": (0.25, 0.5), "ratio": (1.0, 1.0)}, 20, 28,
                               _p("height"), _p("height"), integer=True),),
             invalid=(Bad({"size": 8, "scale": 0.5}, TypeError, "(?i)scale should be a sequence"),
                      Bad({"size": 8, "ratio": 2.0}, TypeError, "(?i)ratio should be a sequence"))),
    Contract("RandomAffine", {"degrees": 20}, KEEP,
             defaults={"degrees": REQUIRED, "translate": None, "scale": None, "shear": None, _INTERP: "nearest",
                       "fill": 0},
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
             invalid=(Bad({"degrees": -5}, ValueError, "If degrees is a single number, it must be positive"),
                      Bad({"degrees": [1, 2, 3]}, ValueError, "degrees should be a sequence of length 2"),
                      Bad({"degrees": 5, "translate": 0.1}, TypeError, "translate should be a sequence of length 2"),
                      Bad({"degrees": 5, "translate": (0.1,)}, ValueError, "translate should be a sequence of length 2"),
                      Bad({"degrees": 5, "translate": (0.5, 1.5)}, ValueError,
                          "translation values should be between 0 and 1"),
                      Bad({"degrees": 5, "scale": 1.0}, TypeError, "scale should be a sequence of length 2"),
                      Bad({"degrees": 5, "scale": (0.0, 1.0)}, ValueError, "scale values should be positive"),
                      Bad({"degrees": 5, "shear": -3}, ValueError, "If shear is a single number, it must be positive"),
                      Bad({"degrees": 5, "shear": (1, 2, 3)}, ValueError, "shear should be a sequence of length 2 or 4"),
                      Bad({"degrees": 5, "fill": "x"}, TypeError, _FILL_ARG))),
    Contract("RandomRotation", {"degrees": 20}, KEEP,
             defaults={"degrees": REQUIRED, _INTERP: "nearest", "fill": 0},
             sampling=(Sampled("angle", {"degrees": (10, 20)}, 10, 20, _p("angle"), _p("angle")),),
             fill=({"degrees": (45, 45)}, (0, 0)),
             invalid=(Bad({"degrees": -1}, ValueError, "If degrees is a single number, it must be positive"),
                      Bad({"degrees": [1, 2, 3]}, ValueError, "degrees should be a sequence of length 2"))),
    Contract("RandomHorizontalFlip", {"p": 0.5}, KEEP, defaults={"p": 0.5}, applied=({"p": 0.3}, 0.3),
             invalid=(Bad({"p": 1.5}, ValueError, _P_RANGE),)),
    Contract("RandomVerticalFlip", {"p": 0.5}, KEEP, defaults={"p": 0.5}, applied=({"p": 0.7}, 0.7),
             invalid=(Bad({"p": -0.1}, ValueError, _P_RANGE),)),
    Contract("RandomPerspective", {"p": 1.0}, KEEP,
             defaults={"distortion_scale": 0.5, "p": 0.5, _INTERP: "bilinear", "fill": 0},
             applied=({"p": 0.4}, 0.4),
             invalid=(Bad({"distortion_scale": 1.5}, ValueError, "Argument distortion_scale value should be between 0 and 1"),
                      Bad({"p": 2.0}, ValueError, _P_RANGE))),
    # ------------------------------------------------------------------ colour
    Contract("ColorJitter", {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}, KEEP,
             defaults={"brightness": None, "contrast": None, "saturation": None, "hue": None},
             sampling=(
                 Sampled("brightness", {"brightness": 0.4}, 0.6, 1.4, _p("brightness"), _p("brightness_factor")),
                 Sampled("brightness", {"brightness": 1.5}, 0.0, 2.5, _p("brightness"), _p("brightness_factor")),
                 Sampled("contrast", {"contrast": (0.5, 1.5)}, 0.5, 1.5, _p("contrast"), _p("contrast_factor")),
                 Sampled("saturation", {"saturation": 0.3}, 0.7, 1.3, _p("saturation"), _p("saturation_factor")),
                 Sampled("hue", {"hue": 0.1}, -0.1, 0.1, _p("hue"), _p("hue_factor"))),
             invalid=(Bad({"brightness": -0.1}, ValueError, "If brightness is a single number, it must be non negative"),
                      Bad({"hue": 0.6}, ValueError, r"hue values should be between \(-0.5, 0.5\) and increasing"),
                      Bad({"contrast": (1.5, 0.5)}, ValueError, r"contrast values should be between \(0, inf\) and increasing"),
                      Bad({"saturation": (1, 2, 3)}, TypeError,
                          r"saturation=\(1, 2, 3\) should be a single number or a sequence with length 2"))),
    Contract("RandomGrayscale", {"p": 1.0}, KEEP, defaults={"p": 0.1}, applied=({"p": 0.3}, 0.3),
             invalid=(Bad({"p": 1.1}, ValueError, _P_RANGE),)),
    Contract("Grayscale", {"num_output_channels": 3}, KEEP, defaults={"num_output_channels": 1},
             invalid=(Bad({"num_output_channels": 2}, ValueError, "num_output_channels must be 1 or 3"),)),
    Contract("GaussianBlur", {"kernel_size": 5}, KEEP, defaults={"kernel_size": REQUIRED, "sigma": (0.1, 2.0)},
             sampling=(Sampled("sigma", {"kernel_size": 5, "sigma": (0.1, 2.0)}, 0.1, 2.0, _p("sigma"),
                               lambda p: p["sigma"][0]),),
             invalid=(Bad({"kernel_size": 4}, ValueError, "Kernel size value should be an odd and positive number"),
                      Bad({"kernel_size": 3, "sigma": -1.0}, ValueError,
                          r"sigma values should be positive and of the form \(min, max\)\. Got \[-1\.0, -1\.0\]"),
                      Bad({"kernel_size": 3, "sigma": (2.0, 1.0)}, ValueError,
                          r"sigma values should be positive and of the form \(min, max\)\. Got \[2\.0, 1\.0\]"),
                      Bad({"kernel_size": 3, "sigma": (1.0, 2.0, 3.0)}, ValueError,
                          "If sigma is a sequence its length should be 1 or 2. Got 3"),
                      Bad({"kernel_size": 3, "sigma": None}, TypeError, "sigma should be a number or a sequence of numbers"))),
    Contract("RandomErasing", {"p": 1.0}, KEEP,
             defaults={"p": 0.5, "scale": (0.02, 0.33), "ratio": (0.3, 3.3), "value": 0, "inplace": False},
             applied=({"p": 0.6, "scale": (0.1, 0.3)}, 0.6),
             invalid=(Bad({"p": 1.5}, ValueError, _P_RANGE), Bad({"scale": (0.1, 1.5)}, ValueError, "Scale should be between 0 and 1"),
                      Bad({"value": "noise"}, ValueError, "If value is str, it should be 'random'"))),
    # ------------------------------------------------------------------ casts, normalize
    Contract("Normalize", {"mean": [0.5] * 3, "std": [0.25] * 3}, {U8: TypeError, F32: (F32, None)},
             defaults={"mean": REQUIRED, "std": REQUIRED, "inplace": False},
             invalid=(Bad({"mean": [0.5] * 3, "std": [0.2, 0.0, 0.2]}, ValueError,
                          "std evaluated to zero.*leading to division by zero", F32),
                      Bad({"mean": [0.5] * 3, "std": [0.25] * 3}, TypeError,
                          "Input tensor should be a float tensor. Got torch.uint8"))),
    Contract("ToDtype", {"dtype": F32, "scale": True}, {U8: (F32, 1.0), F32: (F32, 1.0)},
             defaults={"dtype": REQUIRED, "scale": False}, differs={"dtype": F32, "scale": True},
             invalid=(Bad({"dtype": "float32"}, ValueError, r"dtype must be a (dict or a )?torch\.dtype"),)),
    Contract("ToDtype", {"dtype": F32, "scale": False}, {U8: (F32, 255.0), F32: (F32, 1.0)}),
    Contract("ToDtype", {"dtype": U8, "scale": True}, {U8: (U8, 255.0), F32: (U8, 255.0)}),
    Contract("ToTensor", {}, {U8: (F32, 1.0)}, tv_input="hwc"),
    # ------------------------------------------------------------------ targets
    # RandomIoUCrop needs boxes: images alone raise torchvision's TypeError (its pixels, boxes and
    # draws against torchvision: tests/augment/test_ioucrop.py); gpupipe's extra keyword `size`
    # (what the crop is resized to, default the input's size) is not in this table.
    Contract("RandomIoUCrop", {}, {U8: TypeError, F32: TypeError},
             defaults={"min_scale": 0.3, "max_scale": 1.0, "min_aspect_ratio": 0.5, "max_aspect_ratio": 2.0,
                       "sampler_options": None, "trials": 40},
             invalid=(Bad({}, TypeError, r"RandomIoUCrop\(\) requires input sample to contain tensor or PIL images "
                                         "and bounding boxes"),)),
    # ------------------------------------------------------------------ containers
    Contract("RandomApply", {"transforms": lambda ns: [ns.ColorJitter(0.4, 0.4)], "p": 0.5}, KEEP,
             defaults={"transforms": REQUIRED, "p": 0.5},
             applied=({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": 0.3}, 0.3),
             invalid=(Bad({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": 1.5}, ValueError, _P_RANGE),
                      Bad({"transforms": lambda ns: ns.RandomGrayscale(1.0)}, TypeError,
                          "(?i)argument transforms should be a sequence"))),
    Contract("RandomChoice", {"transforms": lambda ns: [ns.RandomHorizontalFlip(1.0), ns.RandomGrayscale(1.0)]},
             KEEP, defaults={"transforms": REQUIRED, "p": None},
             applied=({"transforms": lambda ns: [ns.RandomGrayscale(1.0), ns.RandomGrayscale(0.0)],
                       "p": [1.0, 3.0]}, 0.25),
             invalid=(Bad({"transforms": lambda ns: [ns.RandomGrayscale(1.0)], "p": [0.5, 0.5]}, ValueError,
                          "Length of p doesn't match the number of transforms: 2 != 1"),)),
    Contract("RandomOrder", {"transforms": lambda ns: [ns.RandomHorizontalFlip(1.0), ns.ColorJitter(0.4)]}, KEEP,
             defaults={"transforms": REQUIRED}),
)
