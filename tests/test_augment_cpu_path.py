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
    from gpupipe.stages import END, Stage, Stages

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
    from gpupipe.stages import Stage

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
