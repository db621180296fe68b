"""PNG copies of a bench image folder (issue 28's "data with PNGs"): the same pixels saved as
PNG (Pillow, compress_level 6, its default), in the same class folders, then ingested to shards.

    .venv/bin/python benchmarks/png_data.py /tmp/t28data/paper/images /tmp/t28data/png

writes DST/images (what the DataLoader baseline reads) and DST/shards (what gpupipe reads),
as ``gpupipe bench --make-data`` lays them out, so ``gpupipe bench DST/shards --compare baseline``
finds the folder beside the shards. Not a test.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main() -> None:
    from PIL import Image

    from gpupipe.prepare.ingest import ingest

    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    total = count = 0
    for f in sorted(src.rglob("*.jpg")):
        out = dst / "images" / f.parent.name / (f.stem + ".png")
        out.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(f) as im:
            im.convert("RGB").save(out, compress_level=6)
        total, count = total + out.stat().st_size, count + 1
    ingest(str(dst / "images"), str(dst / "shards"), shard_size=1000, seed=0, progress=False)
    print(f"{count} PNGs, mean {total / max(count, 1):,.0f} bytes; shards in {dst / 'shards'}")


if __name__ == "__main__":
    main()
