"""Tiny generated datasets for tests: shards with chosen sample counts (empty ones too)."""
from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

import fsspec

from gpupipe.formats.manifest import MANIFEST_NAME, Manifest, ShardEntry
from gpupipe.formats.tar import TarShardWriter


def payload(sample_id: int) -> bytes:
    """Deterministic fake 'image' bytes that encode the sample id (JPEG magic first)."""
    return b"\xff\xd8\xff" + sample_id.to_bytes(4, "big") * (3 + sample_id % 7)


def write_dataset(url: str, counts: list[int], *, storage_options: dict | None = None, manifest: bool = True,
                  image: Callable[[int], bytes] = payload, num_classes: int = 10, checksums: bool = False) -> list[str]:
    """Write shards ``part-NNNN.tar`` with ``counts[i]`` samples each under ``url``; sample ids
    run 0..N-1 in shard order, label = id % num_classes, image bytes ``image(id)``; ``checksums``:
    the manifest holds each sample's CRC-32. Returns the shard URLs."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    entries, urls, sid = [], [], 0
    for i, n in enumerate(counts):
        buf = io.BytesIO()
        w = TarShardWriter(buf)
        for _ in range(n):
            w.write(f"k{sid:07d}", {"jpg": image(sid), "cls": str(sid % num_classes).encode()})
            sid += 1
        w.close()
        name = f"part-{i:04d}.tar"
        fs.pipe_file(f"{root}/{name}", buf.getvalue())
        entries.append(ShardEntry(name, n, len(buf.getvalue()), hashlib.sha256(buf.getvalue()).hexdigest(), tuple(w.offsets),
                                  tuple(w.crcs) if checksums else None))
        urls.append(f"{url.rstrip('/')}/{name}")
    if manifest:
        fs.pipe_file(f"{root}/{MANIFEST_NAME}", Manifest(tuple(entries)).to_json().encode())
    return urls


def ids_of(batch, *, with_manifest: bool = True) -> list[int]:
    """Valid sample ids of an EncodedBatch, read back from the bytes (not from metadata)."""
    out = []
    for i in range(len(batch)):
        if bool(batch.valid[i]):
            data = bytes(batch.image(i))
            sid = int.from_bytes(data[3:7], "big")
            assert data == payload(sid), "image bytes do not match their sample"
            assert int(batch.sample_ids[i]) == (sid if with_manifest else -1)
            assert int(batch.labels[i]) == sid % 10
            out.append(sid)
    return out


def write_detection(url: str, num: int, *, shard_size: int = 10, seed: int = 0, kinds=("boxes", "masks"),
                    manifest: bool = True, damage: dict | None = None, num_classes: int = 3) -> dict:
    """Write ``gpupipe.tools.synth.detection_sample`` 0..num-1 (keys ``det_NNNNNN``) as shards under
    ``url``; ``damage``: ``{index: fields -> fields}`` rewrites those samples' members (bad data);
    ``manifest=False`` leaves no ``index.json``. Returns the samples written, by key (the fields
    as written, damage included)."""
    from gpupipe.formats.writer import ShardSink
    from gpupipe.tools.synth import detection_sample

    written = {}
    with ShardSink(url, shard_size=shard_size, classes=tuple(f"class_{c}" for c in range(num_classes))) as sink:
        for i in range(num):
            s = detection_sample(seed, i, (32, 24), num_classes, kinds)
            fields = (damage or {}).get(i, lambda f: f)(dict(s.fields))
            sink.write(f"det_{i:06d}", fields)
            written[f"det_{i:06d}"] = (s, fields)
    if not manifest:
        fs, root = fsspec.core.url_to_fs(url)
        fs.rm(f"{root.rstrip('/')}/{MANIFEST_NAME}")
    return written
