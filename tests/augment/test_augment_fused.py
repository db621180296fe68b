"""The fused colour pass (gpupipe.augment.colorfuse) against the sequential reference.

Tolerance: the fused pass does the reference's arithmetic in another order (the
ToDtype and Normalize affines composed, the luma as a GEMV, hue in closed form), so
the two differ by float32 rounding only; every step is continuous (clamps included),
so nothing amplifies it. Measured max |fused - reference| ~1e-6 on [0, 1] values;
asserted 2e-5 there, and 2e-5 / min(std) = 1e-4 after an ImageNet Normalize.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from gpupipe.augment.base import AugKey
from gpupipe.augment.color import (
    ColorJitter,
    Normalize,
    RandomGrayscale,
    RepeatChannels,
    ToDtype,
    adjust_hue,
    fused_color,
)
from gpupipe.augment.colorfuse import hue_shift_, run_steps
from gpupipe.augment.compose import Compose
from gpupipe.augment.geometry import RandomAffine, RandomHorizontalFlip

_CUDA = torch.cuda.is_available()
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ATOL_UNIT, ATOL_NORMALIZED = 2e-5, 1e-4


def _key(n: int, device="cpu", seed: int = 3) -> AugKey:
    return AugKey(seed, 1, torch.arange(50, 50 + n, device=device))


def _uint8(n: int, device="cpu", c: int = 3, h: int = 12, w: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(n + c)
    return torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8).to(device)


def _both(ops, x, key):
    """(fused, sequential reference) of the pipeline ``ops`` with the same parameters."""
    fused, seq = Compose(ops), Compose(ops, fuse=False)
    params = fused.make_params(x, key)
    return fused.apply(x, params), seq.apply(x, params)


def test_hue_closed_form_matches_kornias_hsv_round_trip(device):
    g = torch.Generator().manual_seed(0)
    smooth = torch.rand(16, 3, 9, 7, generator=g)
    corners = torch.randint(0, 3, (16, 3, 9, 7), generator=g).float() / 2  # primaries, grays, ties
    shift = torch.linspace(-0.5, 0.5, 16)
    for x in (smooth, corners):
        x, s = x.to(device), shift.to(device)
        torch.testing.assert_close(hue_shift_(x.clone(), s), adjust_hue(x, s), atol=1e-5, rtol=0)


@pytest.mark.parametrize("jitter", [
    ColorJitter(brightness=0.5), ColorJitter(contrast=0.5), ColorJitter(saturation=0.5), ColorJitter(hue=0.3),
    ColorJitter(0.5, 0.5, 0.5, random_order=False), ColorJitter(0.5, 0.5, 0.5, 0.2, random_order=False),
    ColorJitter(0.5, 0.5, 0.5), ColorJitter(0.5, 0.5, 0.5, 0.2), ColorJitter(0.5, 0, 0, 0.2),
], ids=lambda j: "-".join(j.enabled) + ("" if j.random_order else "-fixed"))
def test_jitter_fused_matches_reference(jitter, device):
    x = torch.rand(24, 3, 11, 9, generator=torch.Generator().manual_seed(1)).to(device)
    params = jitter.make_params(x, _key(24, device))
    torch.testing.assert_close(jitter.apply(x, params), jitter.apply_reference(x, params), atol=ATOL_UNIT, rtol=0)


def test_grayscale_input_jitter_and_repeat(device):
    x = _uint8(8, device, c=1)
    ops = [ToDtype(torch.float32), ColorJitter(0.4, 0.4, 0.4, 0.2), RandomGrayscale(0.5), RepeatChannels(3),
           Normalize(MEAN, STD).to(device)]
    fused, seq = _both(ops, x, _key(8, device))
    assert fused.shape == seq.shape == (8, 3, 12, 10)
    torch.testing.assert_close(fused, seq, atol=ATOL_NORMALIZED, rtol=0)
    repeat_first = [ToDtype(torch.float32), RepeatChannels(3), ColorJitter(0.4, 0.4, 0.4, 0.2), RandomGrayscale(0.5),
                    Normalize(MEAN, STD).to(device)]
    fused, seq = _both(repeat_first, x, _key(8, device))
    torch.testing.assert_close(fused, seq, atol=ATOL_NORMALIZED, rtol=0)


def test_affine_before_blends_is_folded_exactly(device):
    """A Normalize before the jitter: its per-channel scale and shift are folded into
    the blends' coefficients and the luma weights (values stay in [0, 1])."""
    x = _uint8(10, device)
    ops = [ToDtype(torch.float32), Normalize((-0.1, -0.05, 0.0), (2.0, 1.5, 1.25)).to(device),
           ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.5)]
    fused, seq = _both(ops, x, _key(10, device))
    torch.testing.assert_close(fused, seq, atol=ATOL_UNIT, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_complex_colour_run_casts_once(dtype, device):
    """float16 / bfloat16 out: the float32 result rounded once (the sequential path
    rounds after every op instead, hue included: up to 0.26 off in bfloat16)."""
    x = _uint8(12, device)
    ops = [ToDtype(dtype), ColorJitter(0.2, 0.2, 0.2, 0.2), RepeatChannels(3), Normalize(MEAN, STD).to(device)]
    pipe = Compose(ops)
    params = pipe.make_params(x, _key(12, device))
    fused = pipe.apply(x, params)
    ref = Compose([ToDtype(torch.float32), *ops[1:]], fuse=False).apply(x, params)
    assert fused.dtype == dtype
    ulp = {torch.float32: 0.0, torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8}[dtype]
    torch.testing.assert_close(fused.float(), ref, atol=ATOL_NORMALIZED, rtol=ulp)


def test_after_a_warp_and_on_channels_last(device):
    x = _uint8(6, device, h=20, w=24).contiguous(memory_format=torch.channels_last)
    ops = [RandomAffine(15), RandomHorizontalFlip(), ToDtype(torch.float32),
           ColorJitter(0.3, 0.3, 0.3, 0.1), Normalize(MEAN, STD).to(device)]
    pipe = Compose(ops)
    params = pipe.make_params(x, _key(6, device))
    warped = Compose(ops[:2]).apply(x, params)
    tail = Compose(ops[2:], fuse=False)
    ref = tail.apply(warped, {k.replace(f"{i + 2}.", f"{i}.", 1): v for i in range(3) for k, v in params.items()
                              if k.startswith(f"{i + 2}.")})
    torch.testing.assert_close(pipe.apply(x, params), ref, atol=ATOL_NORMALIZED, rtol=0)


def test_luma_gemv_and_plane_paths_agree():
    from gpupipe.augment.colorfuse import LUMA, _weighted_channels

    x = torch.rand(2, 3, 512, 1024, generator=torch.Generator().manual_seed(5))  # 2^20 pixels: the GEMV path
    ref = (LUMA[0] * x[:, 0] + LUMA[1] * x[:, 1] + LUMA[2] * x[:, 2]).unsqueeze(1)
    for image in (x, x.contiguous(memory_format=torch.channels_last), x[:, :, :8]):  # GEMV, GEMV, planes
        for weights in (list(LUMA), torch.tensor(LUMA)):
            torch.testing.assert_close(_weighted_channels(image, weights), ref[:, :, :image.shape[2]],
                                       atol=1e-6, rtol=0)


def test_slices_change_nothing():
    jitter = ColorJitter(0.4, 0.4, 0.4, 0.2)
    x = torch.rand(10, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    steps, _ = jitter.steps(jitter.make_params(x, _key(10)), _spec(x))
    whole = run_steps(x, steps, torch.float32, slice_samples=10)
    torch.testing.assert_close(run_steps(x, steps, torch.float32, slice_samples=3), whole, atol=1e-6, rtol=0)
    with torch.inference_mode():
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)  # the default slicing of a single-threaded CPU run
            torch.testing.assert_close(run_steps(x, steps, torch.float32), whole, atol=1e-6, rtol=0)
        finally:
            torch.set_num_threads(threads)


def _spec(x):
    from gpupipe.augment.colorfuse import Spec
    return Spec(x.dtype, int(x.shape[1]), x.device)


def test_inputs_are_never_written(device):
    x = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(4)).to(device)
    before = x.clone()
    ColorJitter(0.4, 0.4, 0.4, 0.2)(x, _key(6, device))
    Compose([ColorJitter(0.4, 0.4, 0.4, 0.2), Normalize(MEAN, STD).to(device)])(x, _key(6, device))
    Compose([RandomGrayscale(1.0), Normalize(MEAN, STD).to(device)])(x, _key(6, device))
    assert torch.equal(x, before)


def test_same_key_same_output_in_any_batch(device):
    pipe = Compose([RandomAffine(10), ToDtype(torch.float32), ColorJitter(0.3, 0.3, 0.3, 0.2),
                    RandomGrayscale(0.3), Normalize(MEAN, STD).to(device)])
    x, key = _uint8(9, device), _key(9, device)
    out = pipe(x, key)
    assert torch.equal(pipe(x, key), out)
    perm = torch.tensor([4, 0, 8, 2, 6, 1, 3, 7, 5], device=device)
    torch.testing.assert_close(pipe(x[perm], AugKey(key.seed, key.epoch, key.sample_ids[perm])), out[perm],
                               atol=1e-5, rtol=0)


def test_pipelines_pickle_and_keep_their_output():
    import pickle

    pipe = Compose([RandomAffine(10, interpolation="nearest", fill=(1, 2, 3)), ToDtype(torch.float32),
                    ColorJitter(0.3, 0.3, 0.3, 0.2), RandomGrayscale(0.3), Normalize(MEAN, STD)], compile=False)
    x, key = _uint8(5), _key(5)
    again = pickle.loads(pickle.dumps(pipe))
    assert torch.equal(again(x, key), pipe(x, key))


def test_fused_color_keeps_its_contract():
    x, key = _uint8(4), _key(4)
    ops = [ToDtype(torch.float16), ColorJitter(0.3, 0.3, 0.3, 0.1), Normalize(MEAN, STD)]
    assert fused_color(x, ops, key).dtype == torch.float16
    no_cast = fused_color(x.float() / 255, ops[1:], key)
    assert no_cast.dtype == torch.float32
    with pytest.raises(ValueError, match="casts to a float dtype"):
        fused_color(x, [ToDtype(torch.uint8)], key)
    with pytest.raises(TypeError, match="put ToDtype"):
        Compose([ColorJitter(0.3), Normalize(MEAN, STD)])(x, key)
    with pytest.raises(TypeError, match="Input tensor should be a float tensor"):
        Compose([Normalize(MEAN, STD), RepeatChannels(3)])(x, key)
    with pytest.raises(ValueError, match=r"RepeatChannels\(3\) needs 1 or 3 channels, got 2"):
        Compose([ToDtype(), RepeatChannels(3)])(x[:, :2], key)


def test_compile_failure_falls_back_to_eager(monkeypatch, caplog):
    from gpupipe.augment import colorfuse

    def broken():
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(colorfuse, "_compiled_slice", broken)
    monkeypatch.setattr(colorfuse, "_compile_failed", [])
    x, key = _uint8(4), _key(4)
    ops = [ToDtype(), ColorJitter(0.3, 0.3, 0.3, 0.1), Normalize(MEAN, STD)]
    with caplog.at_level("WARNING", logger="gpupipe.augment.colorfuse"):
        out = Compose(ops, compile=True)(x, key)
        Compose(ops, compile=True)(x, key)
    assert torch.equal(out, Compose(ops)(x, key))
    assert [r.message for r in caplog.records if "running it eagerly" in r.message] != []
    assert len([r for r in caplog.records if "running it eagerly" in r.message]) == 1  # warned once


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="Inductor needs a C compiler")
def test_compiled_colour_pass_agrees():
    from gpupipe.augment import colorfuse

    if colorfuse._compile_failed:
        pytest.skip(f"torch.compile unavailable here: {colorfuse._compile_failed[0]}")
    x, key = _uint8(4, h=16, w=16), _key(4)
    ops = [ToDtype(), ColorJitter(0.3, 0.3, 0.3, 0.1), RepeatChannels(3), Normalize(MEAN, STD)]
    compiled = Compose(ops, compile=True)
    torch.testing.assert_close(compiled(x, key), Compose(ops)(x, key), atol=ATOL_NORMALIZED, rtol=0)
    assert not colorfuse._compile_failed


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_colour_run_has_no_host_sync_on_cuda():
    """The fused colour pass of the complex set queues kernels only (the warp is not
    checked: Kornia's perspective solve may synchronise, see test_augment_geometry)."""
    pipe = Compose([ToDtype(torch.float16), ColorJitter(0.2, 0.2, 0.2, 0.2), RandomGrayscale(0.2), RepeatChannels(3),
                    Normalize(MEAN, STD)]).cuda()
    x, key = _uint8(8, "cuda", h=64, w=64), _key(8, "cuda")
    pipe(x, key)  # warm up (lazy inits may sync once)
    torch.cuda.set_sync_debug_mode("error")
    try:
        pipe(x, key)
    finally:
        torch.cuda.set_sync_debug_mode("default")
