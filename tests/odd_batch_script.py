"""Decode the odd-file corpus (decode_corpus.odd_files) at batch 64 with one backend under
``on_error: skip`` and check that every delivered (pixels, label) pair is genuine.

Run in a subprocess by tests/decode/test_odd_images.py, so that a crash inside a decoder
library (a segfault in DALI) fails that test instead of killing the suite.
Usage: python odd_batch_script.py BACKEND; prints ``OK <skipped> <batches>`` on success.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import decode_corpus  # noqa: E402

from gpupipe.core.types import Sample  # noqa: E402
from gpupipe.decode import DecodeConfig, make_decoder  # noqa: E402
from gpupipe.decode.pil import decode_one  # noqa: E402
from gpupipe.stream.batch import pack  # noqa: E402

SIZE = (32, 32)


def sources() -> list[tuple[str, bytes]]:
    odd = list(decode_corpus.odd_files().items())
    natural = [(f"natural-{i}", d) for i, d in enumerate(decode_corpus.natural_jpegs(8, (64, 48)))]
    return odd + natural


def references(files: list[tuple[str, bytes]]) -> dict[int, np.ndarray]:
    """Label (index into files) -> what Pillow makes of it, for the ones Pillow decodes."""
    out = {}
    for label, (_, data) in enumerate(files):
        try:
            with_box = decode_one(data, (0, 0, 1, 1), None)
            out[label] = decode_one(data, (0, 0, *with_box.shape[:2]), SIZE).astype(np.float32)
        except Exception:  # noqa: BLE001 — the bad ones have no reference
            pass
    return out


def check_pairs(images: torch.Tensor, labels: torch.Tensor, refs: dict[int, np.ndarray], where: str) -> None:
    """Each slot's pixels must be nearest to the reference of its own label, and close to it."""
    keys = sorted(refs)
    stack = np.stack([refs[k] for k in keys])
    for i, (img, label) in enumerate(zip(images.permute(0, 2, 3, 1).cpu().numpy(), labels.tolist())):
        dist = np.abs(stack - img.astype(np.float32)).mean(axis=(1, 2, 3))
        nearest = keys[int(dist.argmin())]
        if nearest != label or dist.min() > 12:
            raise SystemExit(f"{where} slot {i}: label {label} but pixels match {nearest} (distance {dist.min():.1f})")


def main(backend: str) -> None:
    files = sources()
    refs = references(files)
    decoder = make_decoder(DecodeConfig(backend=backend, image_size=SIZE, on_error="skip"), torch.device("cpu"))
    batches = 3
    for b in range(batches):
        order = [(b * 7 + i) % len(files) for i in range(64)]
        samples = [Sample(key=files[j][0], fields={"jpg": files[j][1]}, sample_id=b * 64 + i, label=j)
                   for i, j in enumerate(order)]
        out = decoder.decode(pack(samples, [True] * 64, epoch=0))
        assert out.images.shape == (64, 3, *SIZE), out.images.shape
        lost = [order[i] for i in range(64) if not out.valid[i]]
        assert all(j not in refs or files[j][0].startswith("jpeg-") for j in lost), \
            f"Pillow-decodable files were replaced: {sorted({files[j][0] for j in lost})}"
        check_pairs(out.images, out.labels, refs, f"batch {b}")
    print("OK", decoder.stats.skipped, batches)


if __name__ == "__main__":
    main(sys.argv[1])
