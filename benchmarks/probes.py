"""Small measurements that explain the benchmark figures in docs/benchmarks.md.

    .venv/bin/python benchmarks/probes.py ipc          # worker -> main hand-off of 5 MB batches
    .venv/bin/python benchmarks/probes.py fork  SHARDS  # DALI CPU decode with an idle DataLoader worker alive
    .venv/bin/python benchmarks/probes.py idct  SHARDS  # DALI CPU decode, exact vs fast IDCT
    .venv/bin/python benchmarks/probes.py augment       # geometry and colour: fused vs sequential; ColorJitter vs Kornia

SHARDS: a shard folder, e.g. .bench/decode-data-5000-250/shards/ (made by decode_bench.py). Not tests.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]


class _Tensors(torch.utils.data.IterableDataset):
    def __iter__(self):
        base = np.random.default_rng(0).integers(0, 255, 5_000_000, dtype=np.uint8)
        for _ in range(80):
            yield torch.from_numpy(base.copy())


def ipc() -> None:
    loader = torch.utils.data.DataLoader(_Tensors(), batch_size=None, num_workers=1)
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        sum(1 for _ in loader)
        runs.append(time.perf_counter() - t0)
    print(f"80 batches of 5 MB through 1 worker: median {np.median(runs):.3f} s ({np.median(runs) / 80 * 1e3:.1f} ms/batch)")


def _decode_rate(decoder, batches) -> tuple[float, float, int]:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for b in batches * 2:
        decoder.decode(b)
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return 2 * sum(len(b) for b in batches) / dt, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt


def _batches(shards: str, n: int = 15):
    from gpupipe.loader.encoded import EncodedLoader

    return list(EncodedLoader(shards, batch_size=128, num_workers=0, rank=0, world_size=1))[:n]


def fork(shards: str) -> None:
    from gpupipe.decode import DecodeConfig, make_decoder
    from gpupipe.loader.encoded import EncodedLoader

    batches = _batches(shards)
    decoder = make_decoder(DecodeConfig(backend="dali", image_size=(128, 128), num_threads=2), "cpu")
    decoder.decode(batches[0])
    rate, system, faults = _decode_rate(decoder, batches)
    print(f"alone:             {rate:6.0f} images/s, system {system:.2f} s, minor faults {faults}")
    it = iter(EncodedLoader(shards, batch_size=128, num_workers=1, rank=0, world_size=1))
    next(it)  # one worker forked and now idle (its prefetch is full)
    rate, system, faults = _decode_rate(decoder, batches)
    print(f"idle worker alive: {rate:6.0f} images/s, system {system:.2f} s, minor faults {faults}")
    del it


def idct(shards: str) -> None:
    from nvidia.dali import fn, pipeline_def, types

    inputs = [[np.frombuffer(b.image(i), np.uint8) for i in range(len(b))] for b in _batches(shards, 20)]
    outs = {}
    for fast in (False, True):
        @pipeline_def(batch_size=128, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            enc = fn.external_source(name="enc", dtype=types.UINT8)
            img = fn.decoders.image(enc, device="cpu", output_type=types.RGB, use_fast_idct=fast)
            return fn.resize(img, size=[128, 128], antialias=True)
        p = pipe()
        p.build()
        for _ in range(2):  # the second pass is timed
            t0 = time.perf_counter()
            for x in inputs:
                p.feed_input("enc", x)
                (o,) = p.run()
                outs[fast] = np.array(o.as_tensor())
            rate = len(inputs) * 128 / (time.perf_counter() - t0)
        print(f"use_fast_idct={fast}: {rate:.0f} images/s")
    print(f"mean |fast - exact| on the last batch: {np.abs(outs[True].astype(int) - outs[False].astype(int)).mean():.2f}")


def augment() -> None:
    import statistics

    import gpupipe.transforms as T

    b, s = 64, 256
    x = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8)
    xf = torch.rand(b, 3, s, s)
    key = T.AugKey(0, 0, torch.arange(b))

    def ms(fn, repeat: int = 3) -> float:  # median of ``repeat`` calls after a warm-up
        fn()
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) * 1e3

    geo = [T.RandomAffine(20), T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.RandomPerspective(0.5, p=0.5)]
    print(f"{b}x3x{s}x{s}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}; medians of 3 ms")
    print(f"4 geometric ops fused {ms(lambda: T.Compose(geo)(x, key)):.0f}, "
          f"sequential {ms(lambda: T.Compose(geo, fuse=False)(x, key)):.0f}")
    for ro in (True, False):
        cj = T.ColorJitter(0.2, 0.2, 0.2, 0.2, random_order=ro)
        print(f"ColorJitter(0.2 x4) random_order={ro}: fused {ms(lambda: cj(xf, key)):.0f}")
    cj = T.ColorJitter(0.2, 0.2, 0.2, 0.2)
    params = cj.make_params(xf, key)
    print(f"ColorJitter(0.2 x4) reference (op by op, 1 call): {ms(lambda: cj.apply_reference(xf, params), 1):.0f}")
    hue = T.ColorJitter(hue=0.2)
    print(f"hue alone: fused {ms(lambda: hue(xf, key)):.0f}, reference {ms(lambda: hue.apply_reference(xf, hue.make_params(xf, key))):.0f}")
    tail = [T.ToDtype(torch.float32), T.RepeatChannels(3), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]
    print(f"ToDtype+RepeatChannels+Normalize: fused {ms(lambda: T.Compose(tail)(x, key)):.0f}, "
          f"sequential {ms(lambda: T.Compose(tail, fuse=False)(x, key)):.0f}")
    import kornia.augmentation as K

    kj = K.ColorJitter(0.2, 0.2, 0.2, 0.2)
    print(f"Kornia ColorJitter(0.2 x4): {ms(lambda: kj(xf)):.0f}")
    _yiq_vs_hsv_hue()


def _yiq_vs_hsv_hue() -> None:
    """How far a hue shift done as a rotation in YIQ (one 3x3 matrix per sample, one pass)
    lands from torchvision's HSV definition (Kornia's adjust_hue), on [0, 1] values."""
    import math

    from gpupipe.augment.colorfn import adjust_hue

    to_yiq = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 3, 32, 32, generator=g)
    for bound in (0.05, 0.2):
        shift = (torch.rand(64, generator=g) * 2 - 1) * bound
        angle = -2 * math.pi * shift
        c, s, o, z = torch.cos(angle), torch.sin(angle), torch.ones(64), torch.zeros(64)
        rot = torch.stack([o, z, z, z, c, -s, z, s, c], -1).view(64, 3, 3)
        m = torch.linalg.inv(to_yiq) @ rot @ to_yiq
        err = (torch.einsum("bij,bjhw->bihw", m, x).clamp(0, 1) - adjust_hue(x, shift)).abs()
        print(f"YIQ rotation vs HSV hue, shifts within +-{bound}: max {err.max():.3f}, mean {err.mean():.4f}")


if __name__ == "__main__":
    name, *rest = sys.argv[1:] or ["--help"]
    probes = {"ipc": ipc, "fork": fork, "idct": idct, "augment": augment}
    if name not in probes:
        print(__doc__)
        raise SystemExit(0 if name == "--help" else 2)
    probes[name](*rest)
