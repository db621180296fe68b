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
                  image: Callable[[int], bytes] = payload, num_classes: int = 10) -> list[str]:
    """Write shards ``part-NNNN.tar`` with ``counts[i]`` samples each under ``url``; sample ids
    run 0..N-1 in shard order, label = id % num_classes, image bytes ``image(id)``. Returns the shard URLs."""
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
        entries.append(ShardEntry(name, n, len(buf.getvalue()), hashlib.sha256(buf.getvalue()).hexdigest(), tuple(w.offsets)))
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
