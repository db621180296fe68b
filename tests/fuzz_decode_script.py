"""One epoch of a shard folder through ``GpuLoader`` with DALI at batch 64, ``on_error: skip``.

Run in a subprocess by tests/decode/test_decoder_fuzz.py, so that a native decoder's crash fails
that test with its signal instead of killing the suite (stderr says how many batches got
through). Usage: ``python fuzz_decode_script.py ROOT OUT_JSON [RESIZE [DEVICE]]`` (``fixed``: whole images;
``random_resized_crop``: DALI decodes only the window around each crop box; DEVICE ``cpu``
or ``cuda``: DALI ``mixed``, nvJPEG); writes
``{"delivered": {key: label}, "seen": [keys], "skipped": n}`` to OUT_JSON and exits 0.
"""
from __future__ import annotations

import json
import sys

from gpupipe.loader.gpu import GpuLoader


def main(root: str, out: str, resize: str = "fixed", device: str = "cpu") -> None:
    loader = GpuLoader(root, batch_size=64, image_size=32, resize=resize, decode="dali", on_error="skip",
                       device=device, shuffle=False, drop_last=False, num_workers=0)
    delivered: dict[str, int] = {}
    seen: list[str] = []
    for n, batch in enumerate(loader):
        seen += batch.keys
        for key, label, valid in zip(batch.keys, batch.labels.tolist(), batch.valid.tolist()):
            if valid:
                delivered[key] = label
        print(f"batch {n} done", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump({"delivered": delivered, "seen": seen, "skipped": loader.stats.skipped}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
