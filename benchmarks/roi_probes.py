"""Why "decode only what is used" gains what it gains on the CPU (issue 16; docs/benchmarks.md).

    .venv/bin/python benchmarks/roi_probes.py windows IMAGES   # what DALI's CPU window decode saves, by window
    .venv/bin/python benchmarks/roi_probes.py split IMAGES     # decode vs resize; DALI's resize vs Pillow's
    .venv/bin/python benchmarks/roi_probes.py drift IMAGES     # Pillow DCT scale: pixels against a full decode
    .venv/bin/python benchmarks/roi_probes.py resize IMAGES    # DALI's CPU resize vs torch's uint8 resize, 3 ways

IMAGES: a folder of JPEGs, e.g. ``ROOT/images`` of ``python -m gpupipe.tools.bench.data imagenet
--images 1500 --root ROOT``. Interleaved rounds, medians of wall rate and of process CPU time
per image (user + system, all threads). Not tests.
"""
from __future__ import annotations

import io
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

BATCH, ROUNDS, THREADS = 64, 7, 2


def _jpegs(folder: str, n: int = 1024) -> list[bytes]:
    return [p.read_bytes() for p in sorted(Path(folder).rglob("*.jpg"))[:n]]


def _rounds(variants: dict, images: int) -> None:
    """Run each of ``variants`` (name -> callable) once a round, interleaved; print medians."""
    rate: dict = {k: [] for k in variants}
    cpu: dict = {k: [] for k in variants}
    for rnd in range(ROUNDS + 1):
        for name, run in variants.items():
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            if rnd:  # round 0 warms up
                rate[name].append(images / (time.perf_counter() - t0))
                cpu[name].append(1000 * (time.process_time() - c0) / images)
    base = next(iter(variants))
    for name in variants:
        r, c = statistics.median(rate[name]), statistics.median(cpu[name])
        print(f"{name:<28} {r:7.0f} images/s (x{r / statistics.median(rate[base]):.2f})   "
              f"CPU {c:.3f} ms/image (x{statistics.median(cpu[base]) / c:.2f})")


def _pipeline(window: bool, resize: tuple[int, int] | None, relative: bool = True, threads: int = THREADS):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, prefetch_queue_depth=1)
    def pipe():
        enc = fn.external_source(name="enc", dtype=types.UINT8)
        if window:
            img = fn.decoders.image_slice(enc, rel_start=fn.external_source(name="win_start", dtype=types.FLOAT),
                                          rel_end=fn.external_source(name="win_end", dtype=types.FLOAT),
                                          axis_names="HW")
        else:
            img = fn.decoders.image(enc)
        if resize:
            img = fn.resize(img, size=list(resize), roi_start=fn.external_source(name="roi_start", dtype=types.FLOAT),
                            roi_end=fn.external_source(name="roi_end", dtype=types.FLOAT), roi_relative=relative,
                            antialias=True, interp_type=types.INTERP_LINEAR)
        return img

    p = pipe()
    p.build()
    return p


def _epoch(pipe, jpegs: list[bytes], feeds: dict[str, np.ndarray], after=None) -> None:
    for i in range(0, len(jpegs) // BATCH * BATCH, BATCH):
        pipe.feed_input("enc", [np.frombuffer(d, np.uint8) for d in jpegs[i:i + BATCH]])
        for name, rows in feeds.items():
            pipe.feed_input(name, list(rows[i:i + BATCH]))
        (out,) = pipe.run()
        if after is not None:
            after(out, i)


def windows(folder: str) -> None:
    """One thread, the same relative window for every image: decode time against the window's place."""
    jpegs = _jpegs(folder, 512)
    cases = {"whole image (decoders.image)": None, "window: all": (0, 0, 1, 1), "window: top 50%": (0, 0, .5, 1),
             "window: bottom 50%": (.5, 0, 1, 1), "window: left 50%": (0, 0, 1, .5),
             "window: top-left 10%": (0, 0, .1, .1), "window: centre 10%": (.45, .45, .55, .55),
             "window: bottom-right 10%": (.9, .9, 1, 1)}
    whole, sliced = _pipeline(False, None, threads=1), _pipeline(True, None, threads=1)
    variants = {}
    for name, w in cases.items():
        feeds = {} if w is None else {"win_start": np.tile(np.float32(w[:2]), (len(jpegs), 1)),
                                      "win_end": np.tile(np.float32(w[2:]), (len(jpegs), 1))}
        variants[name] = lambda p=(whole if w is None else sliced), f=feeds: _epoch(p, jpegs, f)
    _rounds(variants, len(jpegs) // BATCH * BATCH)


def _rrc(jpegs: list[bytes], side: int):
    from gpupipe.decode import DecodeConfig
    from gpupipe.decode.common import crop_boxes_from_sizes, upright_sizes
    from gpupipe.formats.imageheader import probe

    upright_hw, exists = upright_sizes([probe(d) for d in jpegs])
    config = DecodeConfig(image_size=(side, side), resize="random_resized_crop")
    return crop_boxes_from_sizes(upright_hw, exists, list(range(len(jpegs))), 0, config), upright_hw, exists


def split(folder: str, side: int = 224) -> None:
    """random_resized_crop to side²: decode alone and decode + resize, whole image and window;
    and the window resized by Pillow on a 2-thread pool instead of DALI's fn.resize."""
    from PIL import Image

    from gpupipe.decode.roi import dali_slices, decode_windows

    jpegs = _jpegs(folder)
    boxes, upright_hw, exists = _rrc(jpegs, side)
    size = (side, side)
    sl = dali_slices(boxes, upright_hw, exists, size)
    win = {k: sl[k] for k in ("win_start", "win_end")}
    absolute = {"roi_start": boxes[:, :2].astype(np.float32), "roi_end": (boxes[:, :2] + boxes[:, 2:]).astype(np.float32)}
    rows = decode_windows(boxes, upright_hw, size)
    pool = ThreadPoolExecutor(THREADS)

    def pillow_resize(out, at: int) -> None:
        def one(j: int) -> np.ndarray:
            (top, left, h, w), (wt, wl, _, _) = boxes[at + j], rows[at + j]
            box = (left - wl, top - wt, left - wl + w, top - wt + h)
            return np.asarray(Image.fromarray(np.asarray(out[j])).resize(size[::-1], Image.BILINEAR, box=box))
        list(pool.map(one, range(len(out))))

    pipes = {k: _pipeline(*k) for k in ((False, None), (True, None), (False, size, False), (True, size))}
    _rounds({"whole + DALI resize (before)": lambda: _epoch(pipes[False, size, False], jpegs, absolute),
             "window + DALI resize (now)": lambda: _epoch(pipes[True, size], jpegs, sl),
             "whole, decode only": lambda: _epoch(pipes[False, None], jpegs, {}),
             "window, decode only": lambda: _epoch(pipes[True, None], jpegs, win),
             "window + Pillow resize": lambda: _epoch(pipes[True, None], jpegs, win, pillow_resize)},
            len(jpegs) // BATCH * BATCH)


def drift(folder: str) -> None:
    """|Pillow with DCT scale s - Pillow full decode|, random_resized_crop boxes, by how much
    reduction is left to the resize: why gpupipe scales only when at least 2x is left.
    (The bench data has no EXIF orientation; the contract suite covers orientations.)"""
    jpegs = _jpegs(folder, 200)
    for side in (32, 48, 64, 96):
        boxes, _, _ = _rrc(jpegs, side)
        diffs: dict = {}
        for data, box in zip(jpegs, boxes):
            ratio = min(box[2], box[3]) / side
            full = _pil(data, box, side, 1)
            for s in (2, 4, 8):
                if ratio >= s:
                    left = "2x or more" if ratio >= 2 * s else "under 2x"
                    diffs.setdefault((s, left), []).append(np.abs(_pil(data, box, side, s) - full))
        for (s, left), d in sorted(diffs.items()):
            d = np.concatenate([x.ravel() for x in d])
            print(f"{side:3d}²  DCT 1/{s}, {left:10} left to the resize: {len(diffs[s, left]):4d} images, "
                  f"mean |diff| {d.mean():.2f}, p99 {np.percentile(d, 99):.0f}")


def resize(folder: str) -> None:
    """Who resizes on the CPU: the kernels alone (64 random images a batch, 1 thread, CPU ms an
    image), then the DALI decoder on ``folder`` (random_resized_crop to 224² and fixed to 128²)
    with DALI's fn.resize against torch's uint8 resize run four ways: the rows cut into one run
    per decode thread (what gpupipe does), one row after another on 1 or 2 torch threads, or
    one pool task per row."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from PIL import Image

    import gpupipe.decode.dali as dali
    import gpupipe.decode.resize as rs
    from gpupipe.core.machine import this_threads_intraop
    from gpupipe.core.types import Sample
    from gpupipe.decode import DecodeConfig, make_decoder
    from gpupipe.stream.batch import pack

    with this_threads_intraop(1):
        for (h, w), out in (((250, 250), (128, 128)), ((300, 300), (224, 224)), ((375, 500), (224, 224))):
            x = torch.randint(0, 256, (BATCH, h, w, 3), dtype=torch.uint8)
            images = [Image.fromarray(x[i].numpy()) for i in range(BATCH)]
            dali_pipe = _resize_only_pipeline(out)
            arrays = [x[i].numpy() for i in range(BATCH)]

            def dali_resize():
                dali_pipe.feed_input("x", arrays)
                dali_pipe.run()

            kernels = {"DALI fn.resize": dali_resize,
                       "torch uint8": lambda: [F.interpolate(x[i:i + 1].permute(0, 3, 1, 2), size=out, mode="bilinear",
                                                             antialias=True) for i in range(BATCH)],
                       "Pillow": lambda: [im.resize(out[::-1], Image.BILINEAR) for im in images]}
            print(f"{h}x{w} -> {out[0]}x{out[1]}")
            _rounds(kernels, BATCH)

    sequential = rs.crop_and_resize

    def rows_on_pool(decoder):
        def crop_and_resize(images, start, end, relative, size, **_):
            out = torch.empty((len(images), *size, 3), dtype=torch.uint8)
            def one(i):  # crop_and_resize runs torch on one thread in the pool's thread too
                out[i] = sequential(images[i:i + 1], start[i:i + 1], end[i:i + 1], relative, size)[0]
            list(decoder._pool.map(one, range(len(images))))
            return out
        return crop_and_resize

    @contextlib.contextmanager
    def way(name, decoder):
        if name == "DALI fn.resize":
            dali.TORCH_RESIZES_ON_CPU = False
        elif name == "torch, 1 thread":
            dali.crop_and_resize = lambda *a, executor=None, parts=1, **k: sequential(*a, **k)
        elif name == "torch, 2 threads":
            dali.crop_and_resize = lambda *a, executor=None, parts=1, **k: _resize_rows_on(2, *a, **k)
        elif name == "torch, rows on the pool":
            dali.crop_and_resize = rows_on_pool(decoder)
        try:
            yield
        finally:
            dali.TORCH_RESIZES_ON_CPU, dali.crop_and_resize = True, sequential

    files = sorted(Path(folder).rglob("*.jpg"))[:1024]
    samples = [Sample(key=str(f), fields={"jpg": f.read_bytes()}, sample_id=i, label=0) for i, f in enumerate(files)]
    batches = [pack(samples[i:i + BATCH], [True] * BATCH) for i in range(0, len(samples) - BATCH + 1, BATCH)]
    for mode, side in (("random_resized_crop", 224), ("fixed", 128)):
        decoder = make_decoder(DecodeConfig(backend="dali", image_size=(side, side), resize=mode,
                                            num_threads=THREADS), "cpu")

        def epoch(name):
            with way(name, decoder):
                for b in batches:
                    decoder.decode(b)

        print(f"DALI decoder, {mode} to {side}²")
        _rounds({name: (lambda n=name: epoch(n)) for name in
                 ("DALI fn.resize", "torch, runs on the pool (now)", "torch, 1 thread", "torch, 2 threads",
                  "torch, rows on the pool")},
                len(batches) * BATCH)
        decoder.close()


def _resize_rows_on(threads: int, images, start, end, relative, size):
    """gpupipe.decode.resize.crop_and_resize' loop on ``threads`` torch threads instead of one."""
    import torch
    import torch.nn.functional as F

    from gpupipe.core.machine import this_threads_intraop

    out = torch.empty((len(images), *size, 3), dtype=torch.uint8)
    with this_threads_intraop(threads):
        for i, image in enumerate(images):
            extent = np.array(image.shape[:2], np.float64)
            scale = extent if relative else 1.0
            (top, left), (bottom, right) = (np.clip(np.rint(np.asarray(v, np.float64) * scale), 0, extent).astype(int)
                                            for v in (start[i], end[i]))
            box = torch.from_numpy(image).permute(2, 0, 1)[None, :, top:max(bottom, top + 1), left:max(right, left + 1)]
            out[i] = F.interpolate(box, size=size, mode="bilinear", antialias=True)[0].permute(1, 2, 0)
    return out


def _resize_only_pipeline(out: tuple[int, int]):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return fn.resize(fn.external_source(name="x", layout="HWC"), size=list(out), antialias=True,
                         interp_type=types.INTERP_LINEAR)

    p = pipe()
    p.build()
    return p


def _pil(data: bytes, box, side: int, scale: int) -> np.ndarray:
    from PIL import Image

    from gpupipe.decode.roi import drafted_box

    top, left, h, w = (int(v) for v in box)
    with Image.open(io.BytesIO(data)) as img:
        ltrb = (left, top, left + w, top + h)
        if scale > 1:
            stored = img.size
            drafted = img.draft(None, (stored[0] // scale, stored[1] // scale))
            ltrb = drafted_box(box, 1, stored, img.size, stored[0] / drafted[1][2])
        out = img.convert("RGB").resize((side, side), Image.BILINEAR, box=ltrb)
    return np.asarray(out).astype(np.int16)


if __name__ == "__main__":
    probes = {"windows": windows, "split": split, "drift": drift, "resize": resize}
    if len(sys.argv) != 3 or sys.argv[1] not in probes:
        sys.exit(__doc__)
    probes[sys.argv[1]](sys.argv[2])
