"""The CPU path's shortcuts (issue 16) give the same pixels: the warp's own sampling grid
against the per-pixel definition and against Kornia's warp, and the colour pass that
works in place on a buffer it owns."""
from __future__ import annotations

import pytest
import torch

from gpupipe.augment.colorfuse import Affine, run_steps
from gpupipe.augment.warp import sampling_grid, warp


def _matrices(batch: int, affine: bool, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.eye(3).repeat(batch, 1, 1) + 0.05 * torch.randn(batch, 3, 3, generator=g)
    m[:, :2, 2] += 3 * torch.randn(batch, 2, generator=g)
    if affine:
        m[:, 2] = torch.tensor([0.0, 0.0, 1.0])
    else:
        m[:, 2, :2] *= 0.02
    return m


def _grid_by_definition(m: torch.Tensor, in_hw, out_hw) -> torch.Tensor:
    """Each output pixel's input position, float64, in grid_sample's [-1, 1] (align_corners)."""
    (H, W), (h, w) = in_hw, out_hw
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                            indexing="ij")
    points = torch.stack([xs, ys, torch.ones_like(xs)], -1).reshape(-1, 3)  # (h*w, 3)
    src = points @ torch.linalg.inv(m.double()).transpose(1, 2)  # (B, h*w, 3)
    src = src[..., :2] / src[..., 2:]
    scale = torch.tensor([2.0 / max(W - 1, 1), 2.0 / max(H - 1, 1)], dtype=torch.float64)
    return (src * scale - 1).reshape(m.shape[0], h, w, 2)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("in_hw,out_hw", [((32, 32), (32, 32)), ((20, 30), (17, 41)), ((1, 6), (3, 4))])
def test_sampling_grid_is_each_output_pixels_input_position(affine, in_hw, out_hw):
    m = _matrices(5, affine)
    got = sampling_grid(m, in_hw, out_hw, affine)
    assert got.shape == (5, *out_hw, 2) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _grid_by_definition(m, in_hw, out_hw), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_warp_matches_kornias_warp(affine, padding):
    from kornia.geometry.transform import warp_affine, warp_perspective

    m = _matrices(4, affine, seed=1)
    x = torch.rand(4, 3, 24, 20, generator=torch.Generator().manual_seed(2)) * 255
    fn = warp_affine if affine else warp_perspective
    want = fn(x, m[:, :2] if affine else m, dsize=(18, 22), padding_mode=padding, align_corners=True)
    got = warp(x, m, (18, 22), padding, "bilinear", None, affine)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)  # float32 rounding on a 0-255 scale


def test_colour_pass_on_an_owned_buffer_writes_in_place():
    """ToDtype + Normalize on a float32 buffer the caller hands over, in slices: the result is
    that buffer (no second batch-sized buffer), with the values of a pass on a copy."""
    x = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(3)) * 255
    steps = [Affine(1 / 255), Affine(torch.tensor([2.0, 3.0, 4.0]).reshape(1, 3, 1, 1),
                                     torch.tensor([-1.0, -2.0, -3.0]).reshape(1, 3, 1, 1))]
    want = run_steps(x.clone(), steps, torch.float32, owned=False, slice_samples=4)
    owned = x.clone()
    got = run_steps(owned, steps, torch.float32, owned=True, slice_samples=4)
    assert got.data_ptr() == owned.data_ptr()
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    not_owned = x.clone()
    run_steps(not_owned, steps, torch.float32, owned=False, slice_samples=4)
    assert torch.equal(not_owned, x)  # a buffer not handed over is left as it was


def test_a_stage_thread_runs_torch_on_its_own_thread_count():
    """``Stage(threads=1)``: torch ops in that stage's thread run on 1 thread; the consumer's
    thread keeps its count (``torch.set_num_threads`` would have changed both)."""
    from gpupipe.loader.stages import END, Stage, Stages

    before = torch.get_num_threads()
    run = Stages(lambda: iter([0, 1]), [Stage("decode", lambda i: i),
                                        Stage("augment", lambda i: torch.get_num_threads(), threads=1)], prefetch=2)
    try:
        seen = [run.get() for _ in range(3)]
    finally:
        run.stop()
    assert seen == [1, 1, END]
    assert torch.get_num_threads() == before


def test_a_stage_thread_count_below_one_is_refused():
    from gpupipe.loader.stages import Stage

    with pytest.raises(ValueError, match="stage 'augment': threads=0; use 1 or more"):
        Stage("augment", lambda i: i, threads=0)


def test_cpu_warp_samples_a_contiguous_batch_with_the_same_pixels(monkeypatch):
    """DALI hands channels_last uint8; on the CPU grid_sample reads (B, C, H, W) contiguous
    faster, so the float32 conversion changes the layout — and nothing else."""
    seen = []
    grid_sample = torch.nn.functional.grid_sample

    def spy(x, *args, **kwargs):
        seen.append(x.is_contiguous())
        return grid_sample(x, *args, **kwargs)

    hwc = torch.randint(0, 256, (3, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    channels_last = hwc.permute(0, 3, 1, 2)
    m = _matrices(3, affine=True, seed=5)
    want = warp(channels_last.contiguous(), m, (16, 16), "zeros", "bilinear", None, True)
    monkeypatch.setattr(torch.nn.functional, "grid_sample", spy)
    got = warp(channels_last, m, (16, 16), "zeros", "bilinear", None, True)
    assert seen == [True]
    assert torch.equal(got, want)


def _grid_sample_nearest(images: torch.Tensor, m: torch.Tensor, out_hw, padding: str) -> torch.Tensor:
    """The float path's nearest warp: grid_sample on float32, cast back (no rounding needed)."""
    grid = sampling_grid(m, tuple(images.shape[-2:]), out_hw, affine=True)
    out = torch.nn.functional.grid_sample(images.float(), grid, mode="nearest", padding_mode=padding,
                                          align_corners=True)
    return out.to(torch.uint8)


def _rotations(batch: int, seed: int) -> torch.Tensor:
    """Rotation, scale, shear and translation about (6, 5): pixels land off the grid and off the image."""
    g = torch.Generator().manual_seed(seed)
    angle = (torch.rand(batch, generator=g) - 0.5) * 1.5
    scale = 0.7 + 0.6 * torch.rand(batch, generator=g)
    m = torch.zeros(batch, 3, 3)
    m[:, 0, 0], m[:, 0, 1] = scale * angle.cos(), -scale * angle.sin() + 0.1
    m[:, 1, 0], m[:, 1, 1] = scale * angle.sin(), scale * angle.cos()
    m[:, :2, 2] = 4 * torch.randn(batch, 2, generator=g)
    m[:, 2, 2] = 1
    return m


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("in_hw,out_hw", [((24, 20), (24, 20)), ((24, 20), (13, 31))])
def test_nearest_uint8_warp_copies_the_pixels_grid_sample_picks(channels, padding, in_hw, out_hw):
    """The uint8 nearest warp picks grid_sample's input pixel for every output pixel but a
    half-pixel tie (float32 rounding): none in this batch of ~10k pixels per case."""
    g = torch.Generator().manual_seed(channels)
    hwc = torch.randint(1, 256, (6, *in_hw, channels), dtype=torch.uint8, generator=g)  # 0 only from padding
    images = hwc.permute(0, 3, 1, 2)  # DALI's channels_last
    m = _rotations(6, seed=len(padding))
    got = warp(images, m, out_hw, padding, "nearest", None, affine=True)
    want = _grid_sample_nearest(images, m, out_hw, padding)
    assert got.dtype == torch.uint8 and got.shape == want.shape == (6, channels, *out_hw)
    assert got.is_contiguous()  # dense, as the float path hands it on the CPU
    assert (got == 0).any() == (padding == "zeros")  # the ring of zeros was reached, and only for zeros
    assert torch.equal(got, want)


def test_nearest_uint8_warp_of_integer_moves_is_exact_and_keeps_each_sample_its_own():
    """Flips and whole-pixel shifts land on pixels exactly (no ties): the warp equals the
    moved input. The batch is large enough that its flat index passes 2**24, past what a
    float32 index would hold."""
    B, H, W = 300, 250, 250
    images = torch.arange(B, dtype=torch.uint8).view(B, 1, 1, 1).expand(B, 3, H, W).contiguous()
    images[:, 1] = torch.arange(W, dtype=torch.uint8)  # a column code in channel 1
    m = torch.eye(3).repeat(B, 1, 1)
    m[1::2, 0, 0], m[1::2, 0, 2] = -1.0, W - 1.0  # odd samples flipped left-right
    m[::2, 0, 2] = 3.0  # even samples shifted right by 3
    got = warp(images, m, (H, W), "zeros", "nearest", None, affine=True)
    want = images.clone()
    want[1::2] = images[1::2].flip(-1)
    want[::2, :, :, 3:] = images[::2, :, :, :-3]
    want[::2, :, :, :3] = 0
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["float input", "reflection", "fill", "perspective", "bilinear"])
def test_warps_the_uint8_shortcut_does_not_take_are_grid_samples(case):
    """What nearest_uint8 cannot do exactly goes through grid_sample as before."""
    from gpupipe.augment.warp import _packs_to_words

    images = torch.randint(0, 256, (2, 3, 12, 12), dtype=torch.uint8)
    args = {"images": images, "padding_mode": "zeros", "interpolation": "nearest", "affine": True}
    args.update({"float input": {"images": images.float()}, "reflection": {"padding_mode": "reflection"},
                 "fill": {"padding_mode": "fill"}, "perspective": {"affine": False},
                 "bilinear": {"interpolation": "bilinear"}}[case])
    assert not _packs_to_words(**args)
    assert _packs_to_words(images, "zeros", "nearest", True)


def test_composed_nearest_affine_then_colour_matches_the_sequential_reference():
    """RandomAffine(nearest) + flip + ToDtype + Normalize on a uint8 batch: the fused path
    (uint8 warp, then the colour pass) gives the one-transform-after-another result."""
    from gpupipe import transforms as T
    from gpupipe.augment.base import AugKey

    pipe = T.Compose([T.RandomAffine(degrees=25, translate=(0.1, 0.1), scale=(0.8, 1.2), interpolation="nearest"),
                      T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                      T.Normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.3, 0.4])])
    images = torch.randint(0, 256, (16, 32, 32, 3), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(9)).permute(0, 3, 1, 2)
    key = AugKey(seed=3, epoch=0, sample_ids=torch.arange(16))
    params = pipe.make_params(images, key)
    got, want = pipe.apply(images, params), pipe.apply_reference(images, params)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
