"""The core of the geometric transforms: one homography per sample, applied with one
``grid_sample`` (the grid built here, as Kornia's ``warp_perspective`` would, in fewer
passes); the base class, the matrices of boxes, boxes and masks moved by a warp's matrices
(:func:`move_boxes`, :func:`move_masks`: :mod:`gpupipe.augment.targets` names them too), and
torchvision's argument checks.

Coordinates are pixel centres: pixel ``(x, y)`` sits at integer ``(x, y)`` and an
image of width ``W`` spans ``[-0.5, W - 0.5]`` (torchvision's / ``align_corners=False``
resampling convention). ``matrix(params, in_hw)`` takes INPUT pixel coordinates to
OUTPUT pixel coordinates (Kornia's convention). Because the matrices are already in
pixel-centre coordinates they are sampled with ``align_corners=True``,
which maps pixel ``0`` / ``W - 1`` to ``-1`` / ``1`` exactly, so a resize matches
``F.interpolate(mode="bilinear", align_corners=False, antialias=False)``, a flip or
integer crop samples pixels exactly, and ``grid_sample``'s "reflection" reflects
about the edge pixels' centres: torchvision's ``padding_mode="reflect"``.

Dtypes, as torchvision's: (B, C, H, W) uint8 in → uint8 out (the float32 warp rounded,
and clamped to [0, 255]: torchvision's integer path); float32 in → float32 out;
float16 / bfloat16 are warped in float32 and cast back. channels_last input is fine.
On the CPU a nearest affine warp of uint8 copies pixels in uint8, never going through float.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import replace

import torch

from gpupipe.core.targets import Boxes, Targets

from .base import AugKey, Transform

__all__ = ["HW", "GeometricTransform", "warp", "move_boxes", "move_masks", "sampling_grid", "to_integer", "check_sequence",
           "box_matrix", "check_interpolation", "check_fill", "INTERPOLATIONS", "RESIZE_INTERPOLATIONS", "affine_rows",
           "int_between", "batch_ones", "real_to_int", "setup_size", "setup_angle", "check_range"]

HW = tuple[int, int]
INTERPOLATIONS = ("bilinear", "nearest", "bicubic")  # what a warp does
RESIZE_INTERPOLATIONS = (*INTERPOLATIONS, "nearest-exact")  # and torchvision's resize besides
_PIL_CODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # Pillow's constants, which torchvision accepts


def warp(images: torch.Tensor, matrix: torch.Tensor, out_hw: HW, padding_mode: str = "zeros",
         interpolation: str = "bilinear", fill: tuple[float, ...] | None = None, affine: bool = False,
         keep_float: bool = False) -> torch.Tensor:
    """Warp each sample by its (B, 3, 3) input→output pixel homography.

    ``padding_mode``: Kornia's ("zeros", "border", "reflection", or "fill" with
    ``fill`` one value or one per channel, in the images' units: the input padded with
    it), or "blend": torchvision's affine / rotate / perspective with a ``fill``, which
    warp a plane of ones beside the image (zeros outside) and return
    ``(sampled - fill) * mask + fill``, so an edge pixel is darkened by the mask even for
    ``fill=0`` (and equal to "zeros" / "fill" under nearest). ``affine``: the
    matrices' last rows are (0, 0, 1), so the sampling grid needs no division.
    Shape: (B, C, H, W) → (B, C, *out_hw), the input's dtype: an integer batch is
    warped in float32, then rounded and clamped to its range (torchvision's integer
    path). ``keep_float``: return that rounded float32 batch instead of casting it back
    (``Compose`` hands it to a colour pass that would convert it to float32 again). A
    nearest affine warp of a CPU uint8 batch is done in uint8 (:func:`nearest_uint8`).

    The sampling grid is built here (:func:`sampling_grid`) and handed to
    ``grid_sample``, as Kornia's ``warp_affine`` / ``warp_perspective`` do; only the
    "fill" mode goes through Kornia (its fill blend).
    """
    # On the CPU grid_sample reads a contiguous (B, C, H, W) batch ~25% faster than a channels_last
    # one (DALI's layout): the conversion to float32 is the place to change the layout, nearly free.
    if _packs_to_words(images, padding_mode, interpolation, affine):
        out = nearest_uint8(images, matrix, out_hw, padding_mode)
        # one copy out of the packed words, into the (B, C, h, w) layout the float path gives (the
        # fastest of the layouts to write it in: 1.0 ms a 64 × 128² batch, channels_last 2.3-4.5)
        return out.to(torch.float32 if keep_float else torch.uint8, memory_format=torch.contiguous_format)
    layout = torch.contiguous_format if images.device.type == "cpu" else torch.preserve_format
    x = images.to(torch.float32, memory_format=layout)
    m = matrix.to(device=x.device, dtype=torch.float32)
    hw = (int(out_hw[0]), int(out_hw[1]))
    if padding_mode == "fill":
        out = _kornia_fill_warp(x, m, hw, interpolation, fill, affine)
    else:
        grid = sampling_grid(m, (int(x.shape[-2]), int(x.shape[-1])), hw, affine)
        if padding_mode == "blend":
            out = _blend_fill_warp(x, grid, interpolation, fill)
        else:
            out = torch.nn.functional.grid_sample(x, grid, mode=interpolation, padding_mode=padding_mode,
                                                  align_corners=True)
    if images.is_floating_point():
        return out.to(images.dtype)
    return to_integer(out, images.dtype, clamp=interpolation == "bicubic" or padding_mode in ("fill", "blend"),
                      keep_float=keep_float)


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float64 for the corner arithmetic, float32 where the device has no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _edge_frame(matrix: torch.Tensor) -> torch.Tensor:
    """The (B, 3, 3) pixel-centre homographies as maps of pixel-edge coordinates."""
    dtype = _exact_dtype(matrix.device)
    m = matrix.to(dtype)
    to_centres = torch.eye(3, dtype=dtype, device=m.device)
    to_centres[:2, 2] = -0.5
    to_edges = torch.eye(3, dtype=dtype, device=m.device)
    to_edges[:2, 2] = 0.5
    return to_edges @ m @ to_centres


def move_boxes(boxes: Boxes, matrix: torch.Tensor, out_hw: HW) -> Boxes:
    """``boxes`` through each image's (B, 3, 3) input→output pixel-centre homography: the
    box around the four moved corners, clamped to the ``out_hw`` canvas (torchvision's
    affine / perspective rule for boxes; exact for flips, crops and resizes, whose boxes stay
    boxes). Computed in float64 (float32 on MPS), returned in the boxes' dtype."""
    b = boxes.boxes
    if b.shape[0] == 0:
        return boxes
    m = _edge_frame(matrix.to(b.device))[boxes.image_index]  # (N, 3, 3)
    x1, y1, x2, y2 = b.to(m.dtype).unbind(-1)
    xs, ys = torch.stack([x1, x2, x2, x1], -1), torch.stack([y1, y1, y2, y2], -1)  # (N, 4) corners
    ones = torch.ones_like(xs)
    points = torch.stack([xs, ys, ones], -1) @ m.transpose(1, 2)  # (N, 4, 3)
    xy = points[..., :2] / points[..., 2:]
    low, high = xy.amin(dim=1), xy.amax(dim=1)
    h, w = out_hw
    limit = torch.tensor([w, h], dtype=m.dtype, device=b.device)
    out = torch.cat([low.clamp(min=0).minimum(limit), high.clamp(min=0).minimum(limit)], -1)
    return replace(boxes, boxes=out.to(b.dtype))


def move_masks(masks: torch.Tensor, matrix: torch.Tensor, out_hw: HW, padding: str = "zeros",
               fill: tuple[float, ...] | None = None, affine: bool = True) -> torch.Tensor:
    """(B, H, W) label maps through the (B, 3, 3) homographies, nearest-neighbour (no label is
    blended), the area outside the input ``padding`` ("zeros", "border", "reflection") or
    ``fill``: one value, or "zeros" for a per-channel image fill. Shape: → (B, *out_hw)."""
    if padding in ("blend", "fill"):
        value = fill[0] if fill is not None and len(fill) == 1 else 0.0
        padding, fill = ("zeros", None) if value == 0 else ("fill", (value,))
    return warp(masks[:, None], matrix, out_hw, padding, "nearest", fill, affine)[:, 0]


def _packs_to_words(images: torch.Tensor, padding_mode: str, interpolation: str, affine: bool) -> bool:
    """Whether :func:`nearest_uint8` does this warp: a CPU uint8 batch of ≤ 4 channels,
    nearest, an affine map, zeros or border padding, an image under 4094² pixels."""
    return (images.device.type == "cpu" and images.dtype == torch.uint8 and images.shape[1] <= 4
            and interpolation == "nearest" and affine and padding_mode in ("zeros", "border")
            and (images.shape[-2] + 2) * (images.shape[-1] + 2) < 2 ** 24)


def nearest_uint8(images: torch.Tensor, matrix: torch.Tensor, out_hw: HW, padding_mode: str = "zeros") -> torch.Tensor:
    """The nearest-neighbour affine warp of a (B, C ≤ 4, H, W) uint8 batch, in uint8: each
    output pixel copies one input pixel, so there is nothing to compute in float but the
    index, and the result is ``grid_sample``'s (nearest, ``align_corners=True``) but for
    coordinates within float32 rounding of a half-pixel tie, which may go to the other
    neighbour.

    Each pixel is packed into one 32-bit word (a 4-byte gather is ~5× faster than gathering
    3-byte rows); the packed input has a ring of zero pixels around it, so "zeros" padding is
    a clamp of the coordinates onto the ring and "border" a clamp onto the image. Returns a
    (B, C, h, w) view of the packed (B, h, w, 4) result.
    """
    B, C, H, W = (int(v) for v in images.shape)
    h, w = int(out_hw[0]), int(out_hw[1])
    ring = 1 if padding_mode == "zeros" else 0
    Hp, Wp = H + 2 * ring, W + 2 * ring
    packed = torch.zeros((B, Hp, Wp, 4), dtype=torch.uint8)
    packed[:, ring:ring + H, ring:ring + W, :C].copy_(images.permute(0, 2, 3, 1))
    # output pixel → input pixel, one row per axis: a·x + b·y + c (rounded before the shift onto
    # the packed image, so that a half-pixel tie at the edge goes the way grid_sample's does)
    inverse = torch.linalg.inv_ex(matrix.to(torch.float64))[0][:, :2].to(torch.float32)
    xs, ys = torch.arange(w, dtype=torch.float32), torch.arange(h, dtype=torch.float32)
    coords = []  # x, then y
    for axis, size in enumerate((W, H)):
        along_x, along_y = _plane(inverse[:, axis], xs, ys)
        coords.append(torch.add(along_x, along_y).round_().clamp_(-ring, size - 1 + ring))
    index = coords[0].add_(coords[1], alpha=Wp)  # x + y·Wp
    # float32 holds the index within one image exactly (Hp·Wp < 2**24, see _packs_to_words); the
    # batch offset and the ring's shift are added in int32 where the batch's index fits it (the
    # conversion and the gather then move half the index bytes: -1.3-2 ms a 64 × 128² batch), else int64
    dtype = torch.int32 if B * Hp * Wp < 2 ** 31 else torch.int64
    offsets = torch.arange(0, B * Hp * Wp, Hp * Wp, dtype=dtype).add_(ring * (Wp + 1))
    index = index.to(dtype).add_(offsets[:, None, None])
    out = packed.view(torch.int32).view(-1).index_select(0, index.view(-1))
    return out.view(torch.uint8).view(B, h, w, 4)[..., :C].permute(0, 3, 1, 2)


def sampling_grid(matrix: torch.Tensor, in_hw: HW, out_hw: HW, affine: bool = False) -> torch.Tensor:
    """``grid_sample``'s (B, h, w, 2) grid (``align_corners=True``) for the (B, 3, 3)
    input→output pixel homographies ``matrix``: each output pixel's input position.

    The inverse, with the input's pixel → [-1, 1] scaling folded in, is one small float64
    matrix per sample (``inv_ex``: no device sync); the grid is then written per axis as a
    row term plus a column term, (B, 1, w) + (B, h, 1), straight into its slot of the
    output — two passes over the grid where an affine map is all there is (Kornia builds
    it from six full-size products and a stack: a third of a 128² warp's CPU time), and
    a division by the projective denominator otherwise.
    """
    (H, W), (h, w) = in_hw, out_hw
    inverse = torch.linalg.inv_ex(matrix.to(torch.float64))[0]
    to_unit = torch.tensor([[2.0 / max(W - 1, 1), 0.0, -1.0], [0.0, 2.0 / max(H - 1, 1), -1.0], [0.0, 0.0, 1.0]],
                           dtype=torch.float64).to(matrix.device, non_blocking=True)
    t = (to_unit @ inverse).to(torch.float32)  # (B, 3, 3): output pixel → input in [-1, 1]
    xs = torch.arange(w, dtype=torch.float32, device=matrix.device)
    ys = torch.arange(h, dtype=torch.float32, device=matrix.device)
    grid = torch.empty((matrix.shape[0], h, w, 2), dtype=torch.float32, device=matrix.device)
    rows = [_plane(t[:, r], xs, ys) for r in range(2 if affine else 3)]
    if affine:
        for axis, (along_x, along_y) in enumerate(rows):
            torch.add(along_x, along_y, out=grid[..., axis])
        return grid
    denominator = rows[2][0] + rows[2][1]
    for axis, (along_x, along_y) in enumerate(rows[:2]):
        torch.div(along_x + along_y, denominator, out=grid[..., axis])
    return grid


def _plane(row: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``row`` (B, 3) · (x, y, 1) over the output pixels as two broadcastable terms:
    (B, 1, w) ``a·x`` and (B, h, 1) ``b·y + c``."""
    along_x = row[:, 0, None] * xs
    along_y = torch.addcmul(row[:, 2, None], row[:, 1, None], ys)
    return along_x[:, None, :], along_y[:, :, None]


def _kornia_fill_warp(x: torch.Tensor, m: torch.Tensor, hw: HW, interpolation: str,
                      fill: tuple[float, ...] | None, affine: bool) -> torch.Tensor:
    """The "fill" padding mode: Kornia's warp, which blends a warped mask with the fill."""
    from kornia.geometry.transform import warp_affine, warp_perspective

    fill_value = torch.tensor(fill or (0.0,), dtype=torch.float32).to(x.device, non_blocking=True)
    fn = warp_affine if affine else warp_perspective
    return fn(x, m[:, :2] if affine else m, dsize=hw, mode=interpolation, padding_mode="fill",
              align_corners=True, fill_value=fill_value)


def _blend_fill_warp(x: torch.Tensor, grid: torch.Tensor, interpolation: str,
                     fill: tuple[float, ...] | None) -> torch.Tensor:
    """torchvision's ``_apply_grid_transform`` with a fill: the image and a plane of ones
    sampled in one ``grid_sample`` (zeros outside), then ``(sampled - fill) * mask + fill``."""
    sampled = torch.nn.functional.grid_sample(torch.cat([x, torch.ones_like(x[:, :1])], dim=1), grid,
                                              mode=interpolation, padding_mode="zeros", align_corners=True)
    out, mask = sampled[:, :-1], sampled[:, -1:]
    fill_value = torch.tensor(fill or (0.0,), dtype=out.dtype).to(out.device, non_blocking=True).view(1, -1, 1, 1)
    return out.sub_(fill_value).mul_(mask).add_(fill_value)


def to_integer(x: torch.Tensor, dtype: torch.dtype, clamp: bool = True, keep_float: bool = False) -> torch.Tensor:
    """Float values on an integer ``dtype``'s scale → that dtype, as torchvision casts a
    resampled integer image: rounded, clamped to the dtype's range where values may leave
    it (bicubic overshoot, a fill outside it). ``x`` is overwritten. ``keep_float``: the
    rounded values, still float."""
    x = x.round_()
    if clamp:
        x = x.clamp_(0.0, float(torch.iinfo(dtype).max))
    return x if keep_float else x.to(dtype)


def box_matrix(top, left, box_h, box_w, out_hw: HW) -> torch.Tensor:
    """(B, 3, 3) taking the box (top, left, box_h, box_w) of the input onto an
    ``out_hw`` output (crop, then resize); all (B,) float tensors."""
    sy, sx = out_hw[0] / box_h, out_hw[1] / box_w
    zero = torch.zeros_like(sx)
    return affine_rows(sx, zero, (0.5 - left) * sx - 0.5, zero, sy, (0.5 - top) * sy - 0.5)


def affine_rows(a, b, c, d, e, f) -> torch.Tensor:
    """(B, 3, 3) [[a, b, c], [d, e, f], [0, 0, 1]] from (B,) tensors."""
    zero, one = torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([a, b, c, d, e, f, zero, zero, one], dim=-1).reshape(-1, 3, 3)


def int_between(u: torch.Tensor, low, high) -> torch.Tensor:
    """Integers uniform in [low, high) from uniforms ``u`` in [0, 1) (float32 result);
    ``high`` an int or a tensor on ``u``'s device (no host-to-device copy either way)."""
    v = torch.floor(low + u * (high - low))
    return torch.minimum(v, high - 1) if torch.is_tensor(high) else v.clamp(max=high - 1)


def batch_ones(key: AugKey) -> torch.Tensor:
    """(B,) float32 ones on the batch's device: a parameter that is 1 for every sample."""
    return torch.ones(key.sample_ids.shape[0], dtype=torch.float32, device=key.sample_ids.device)


# ---------------------------------------------------------------- argument checks

def real_to_int(x: numbers.Real) -> int:
    """``int(x)`` of a real number (numpy scalars too), through ``float``: the numbers ABCs
    declare no ``__int__`` to a type checker (python/mypy#3186)."""
    return int(float(x))


def setup_size(size, name: str = "size") -> HW:
    if isinstance(size, str):
        raise TypeError(f"{name} should be an int or a sequence of two ints (got {size!r})")
    if isinstance(size, numbers.Real):
        size = (real_to_int(size), real_to_int(size))
    elif isinstance(size, Sequence) and len(size) == 1:
        size = (int(size[0]), int(size[0]))
    elif not isinstance(size, Sequence) or len(size) != 2:
        raise ValueError("Please provide only two dimensions (h, w) for size.")
    if min(size) <= 0:
        raise ValueError(f"{name} should be positive (got {tuple(size)})")
    return int(size[0]), int(size[1])


def check_sequence(x, name: str, req_sizes: Sequence[int] = (2,)) -> None:
    """torchvision's ``_check_sequence_input``: not a sequence is a TypeError, a wrong length a ValueError."""
    msg = " or ".join(str(s) for s in req_sizes)
    if not isinstance(x, Sequence) or isinstance(x, str):
        raise TypeError(f"{name} should be a sequence of length {msg}.")
    if len(x) not in req_sizes:
        raise ValueError(f"{name} should be a sequence of length {msg}.")


def setup_angle(x, name: str, req_sizes: Sequence[int] = (2,)) -> list[float]:
    if isinstance(x, numbers.Real):
        if x < 0:
            raise ValueError(f"If {name} is a single number, it must be positive.")
        return [-float(x), float(x)]
    check_sequence(x, name, req_sizes)
    return [float(d) for d in x]


def check_range(x, name: str) -> tuple[float, float]:
    if not isinstance(x, Sequence) or len(x) != 2:
        raise TypeError(f"{name} should be a sequence of length 2 (got {x!r})")
    if x[0] > x[1]:
        raise ValueError(f"Scale and ratio should be of kind (min, max) (got {name}={tuple(x)})")
    return float(x[0]), float(x[1])


def check_interpolation(interpolation, modes: tuple[str, ...] = INTERPOLATIONS) -> str:
    """torchvision's ``interpolation`` argument (an ``InterpolationMode``, i.e. anything
    with a ``.value`` string, the string itself, or a Pillow integer constant) → the
    mode name, one of ``modes``: a warp does bilinear, nearest and bicubic; a resize
    (:data:`RESIZE_INTERPOLATIONS`) also nearest-exact, as torchvision's tensor ops."""
    value = getattr(interpolation, "value", interpolation)
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in _PIL_CODES:
            raise ValueError(f"Argument interpolation should be an InterpolationMode or a corresponding Pillow "
                             f"integer constant, but got {interpolation}.")
        value = _PIL_CODES[value]
    if not isinstance(value, str):
        raise TypeError(f"Argument interpolation should be an InterpolationMode or a string, got {interpolation!r}")
    if value.lower() == "nearest-exact" and value.lower() not in modes:  # torchvision's words
        raise ValueError("Interpolation mode 'nearest-exact' is unsupported with Tensor input")
    if value.lower() not in modes:
        raise ValueError(f"interpolation {value!r} is not supported by gpupipe's warp; "
                         f"choose from {', '.join(modes)}")
    return value.lower()


def check_fill(fill) -> tuple[float, ...]:
    """torchvision's ``fill``: a number or one per channel → a tuple of floats."""
    if isinstance(fill, bool) or not isinstance(fill, (numbers.Real, tuple, list)):
        raise TypeError("Got inappropriate fill arg, only Numbers, tuples and lists are allowed.")
    values = (float(fill),) if isinstance(fill, numbers.Real) else tuple(float(v) for v in fill)
    if not values:
        raise ValueError("fill should be a number or a non-empty sequence of numbers")
    return values


class GeometricTransform(Transform):
    """A transform that is one homography per sample. Subclasses implement
    ``make_params`` (from the input size only: ``Compose`` calls it on a placeholder
    of the right shape), ``output_size`` and ``matrix``.

    How it samples, which ``Compose`` reads to decide what fuses into one warp:
    ``samples_outside`` (does it read outside its input? :meth:`reads_outside` for a
    given size), and if so ``warp_padding`` (Kornia's padding mode, or "blend":
    torchvision's fill of a grid transform, see :func:`warp`) and ``fill``;
    ``interpolation`` (None: it samples exactly on pixel centres, flips and integer crops,
    so any mode gives the same); ``fusable`` (:meth:`fuses` for a given size);
    ``covers_frame`` (its whole input lands on its whole output, as a resize or a flip);
    ``warps_alone`` (alone, its ``transform`` is this warp: Resize and RandomResizedCrop
    are torchvision's ``F.interpolate`` instead); ``affine`` (a matrix without perspective).
    """

    samples_outside = True
    warp_padding = "zeros"
    fill: tuple[float, ...] | None = None
    interpolation: str | None = "bilinear"
    fusable = True
    covers_frame = False
    warps_alone = True
    affine = True  # the matrix's last row is (0, 0, 1)

    def output_size(self, in_hw: HW) -> HW:
        return in_hw

    def matrix(self, params: dict[str, torch.Tensor], in_hw: HW) -> torch.Tensor:
        raise NotImplementedError

    def fuses(self, in_hw: HW) -> bool:
        """Whether, on an ``in_hw`` input, this transform is its matrix warped (within
        interpolation rounding), so that ``Compose`` may fold it into a neighbour's warp."""
        return self.fusable

    def reads_outside(self, in_hw: HW) -> bool:
        """Whether, on an ``in_hw`` input, some output pixel is sampled outside the input."""
        return self.samples_outside

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        in_hw = (int(images.shape[-2]), int(images.shape[-1]))
        mode = self.warp_padding if self.samples_outside else "border"
        return warp(images, self.matrix(params, in_hw), self.output_size(in_hw), mode,
                    self.interpolation or "bilinear", self.fill, self.affine)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        """Boxes and masks through this sample's matrix (:func:`move_boxes`,
        :meth:`transform_masks`), to the output canvas."""
        matrix, out_hw = self.matrix(params, in_hw), self.output_size(in_hw)
        boxes = None if targets.boxes is None else move_boxes(targets.boxes, matrix, out_hw)
        masks = None if targets.masks is None else self.transform_masks(targets.masks, params, in_hw)
        return Targets(boxes, masks)

    def transform_masks(self, masks: torch.Tensor, params: dict[str, torch.Tensor], in_hw: HW) -> torch.Tensor:
        """(B, H, W) label maps warped nearest-neighbour with the images' matrix, padded as the
        images are (a fill: its value where it is one number, else 0). Shape: → (B, h, w)."""
        padding = self.warp_padding if self.samples_outside else "border"
        return move_masks(masks, self.matrix(params, in_hw), self.output_size(in_hw), padding, self.fill, self.affine)

    def set_fill(self, fill, blend: bool = False) -> None:
        """torchvision's ``fill`` for the area outside the input: 0 is Kornia's zeros.
        ``blend``: torchvision's grid transforms (affine, rotate, perspective), whose
        interpolating modes blend the fill in by a warped mask ("blend" in :func:`warp`);
        set ``interpolation`` first. Without it (a crop's padding) the fill is a border of
        padding around the input, interpolated as such."""
        self.fill = check_fill(fill)
        if blend and self.interpolation != "nearest":
            self.warp_padding = "blend"
        else:
            self.warp_padding = "zeros" if all(v == 0 for v in self.fill) else "fill"
