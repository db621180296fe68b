"""DALI's GPU region decode on JPEG photos, bare (no gpupipe in the path), in its own process.

Run by tests/decode/test_gpu_region_decode.py, which turns a signal death into a failure naming it.
nvImageCodec 0.9.0's region decode is reported to kill the process with SIGSEGV on H100 and
B200 and to fail with INTERNAL_ERROR on A100 (NVIDIA/nvImageCodec#55). Usage:
``python gpu_region_script.py FOLDER`` -- every ``*.jpg`` in FOLDER, batches of 64 (repeated to
fill), ``decoders.image_slice`` with random in-bounds windows and ``decoders.image_random_crop``
on device ``mixed``. Prints the versions, then ``OK <batches>`` or the error DALI raised.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BATCH, ROUNDS = 64, 8


def main(folder: str) -> None:
    from nvidia.dali import __version__ as dali_version
    from nvidia.dali import fn, pipeline_def, types

    from gpupipe.decode.gate import nvimgcodec_version

    print(f"dali {dali_version}, nvimgcodec {nvimgcodec_version()}", flush=True)
    files = [np.frombuffer(p.read_bytes(), np.uint8) for p in sorted(Path(folder).glob("*.jpg"))]
    rng = np.random.default_rng(0)

    @pipeline_def(batch_size=BATCH, num_threads=4, device_id=0, prefetch_queue_depth=1, seed=0)
    def pipeline():
        enc = fn.external_source(name="enc", dtype=types.UINT8)
        start = fn.external_source(name="start", dtype=types.FLOAT)
        end = fn.external_source(name="end", dtype=types.FLOAT)
        sliced = fn.decoders.image_slice(enc, rel_start=start, rel_end=end, axis_names="HW", device="mixed",
                                         output_type=types.RGB)
        cropped = fn.decoders.image_random_crop(enc, device="mixed", output_type=types.RGB)
        return sliced, cropped

    pipe = pipeline()
    pipe.build()
    for rnd in range(ROUNDS):
        batch = [files[(rnd * BATCH + i) % len(files)] for i in range(BATCH)]
        size = rng.uniform(0.2, 0.9, (BATCH, 2)).astype(np.float32)
        start = (rng.uniform(0, 1, (BATCH, 2)) * (1 - size)).astype(np.float32)
        pipe.feed_input("enc", batch)
        pipe.feed_input("start", list(start))
        pipe.feed_input("end", list(start + size))
        try:
            pipe.run()
        except RuntimeError as exc:
            print(f"DALI raised in round {rnd}: {str(exc)[:500]}", flush=True)
            raise SystemExit(3) from None
        print(f"round {rnd} ok", flush=True)
    print("OK", ROUNDS, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
