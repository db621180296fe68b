"""GPU memory over many batches and the pinned hand-off, on the nvJPEG path (no DALI needed).

    python3 benchmarks/gpu/lite_probe.py SHARDS --out result.json

Runs GpuLoader(decode=decode, device="cuda") with the simple set for several passes, with 0 and
with 4 stream workers (the worker path hands chunk lists through pin_memory), and records
torch.cuda.max_memory_allocated after the first and the last pass (flat means no leak), images/s
per pass (synchronised before each clock read), and that labels and shapes are sane. Not a test.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def live_cuda_tensors() -> dict:
    """{shape/dtype: count} of the CUDA tensors Python still holds (what a leak would be)."""
    import gc
    seen: dict = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                k = f"{tuple(obj.shape)} {obj.dtype} {obj.untyped_storage().nbytes() >> 10} KiB"
                seen[k] = seen.get(k, 0) + 1
        except Exception:
            pass
    return dict(sorted(seen.items(), key=lambda kv: -kv[1])[:15])


def run(shards: str, workers: int, passes: int, batch: int, decode: str) -> dict:
    from gpupipe import GpuLoader
    from gpupipe.transforms import simple_set

    loader = GpuLoader(shards, device="cuda", batch_size=batch, num_workers=workers, decode=decode,
                       image_size=(224, 224), augment=simple_set(), seed=1)
    out: dict = {"workers": workers, "passes": []}
    torch.cuda.reset_peak_memory_stats()
    for _ in range(passes):
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        for images, _labels in loader:
            assert images.is_cuda and images.shape[1:] == (3, 224, 224), images.shape
            assert torch.isfinite(images).all()
            n += images.shape[0]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out["passes"].append({"images": n, "seconds": round(dt, 3), "images_per_s": round(n / dt, 1),
                              "max_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
                              "allocated_mb": round(torch.cuda.memory_allocated() / 2**20, 1)})
        print(workers, out["passes"][-1], flush=True)
    del images, _labels
    out["live_cuda_tensors"] = live_cuda_tensors()
    out["allocated_mb_after"] = round(torch.cuda.memory_allocated() / 2**20, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode", default="nvjpeg")
    a = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "decode": a.decode, "runs": []}
    for workers in (0, 4):
        try:
            res["runs"].append(run(a.shards, workers, a.passes, a.batch, a.decode))
        except Exception as e:  # record and go on: this is a probe
            res["runs"].append({"workers": workers, "error": f"{type(e).__name__}: {e}"})
            print(workers, "ERROR", type(e).__name__, e, flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
