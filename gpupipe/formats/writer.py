"""Write samples as numbered tar shards plus the manifest, on any fsspec URL."""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from typing import Any

from gpupipe.formats.manifest import MANIFEST_NAME, Manifest, ShardEntry, held_kinds
from gpupipe.formats.tar import TarShardWriter
from gpupipe.storage.fetch import Fetcher, is_plain_local, open_filesystem

__all__ = ["ShardSink"]


class ShardSink:
    """Collects samples into shards of ``shard_size`` samples under ``dst``.

    Each shard is built in memory and written with one ``pipe_file``-style put,
    so an object store never holds half a shard; on a local disk it is written under a hidden
    temporary name and renamed, so a process killed mid-write leaves no shard under its final
    name either. ``close()`` writes ``index.json`` last (the same way), which makes the dataset
    visible only when it is complete. The manifest records
    the target kinds the samples hold (:func:`~gpupipe.formats.manifest.held_kinds`).
    """

    def __init__(self, dst: str, *, shard_size: int = 1000, storage_options: Mapping[str, Any] | None = None,
                 prefix: str = "shard", classes: tuple[str, ...] = (), first_number: int = 0):
        """Shards are named ``<prefix>-<number>.tar``, numbered from ``first_number`` (an ingest task
        writes one shard, its number in the job's plan)."""
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.fs, self.root = open_filesystem(dst, storage_options)
        self.root, self.url = self.root.rstrip("/"), dst.rstrip("/")
        self._io = Fetcher(self.fs)  # writes retried, and their errors worded, as reads are
        self._local = is_plain_local(self.fs)
        self._io.call(self.url, "makedirs", True)
        self.shard_size, self.prefix, self.classes, self.first_number = shard_size, prefix, classes, first_number
        self.entries: list[ShardEntry] = []
        self._buf: io.BytesIO | None = None
        self._writer: TarShardWriter | None = None
        self._held: set[str] = set()

    def write(self, key: str, fields: dict[str, bytes]) -> None:
        if self._writer is None:
            self._buf = io.BytesIO()
            self._writer = TarShardWriter(self._buf)
        self._writer.write(key, fields)
        self._held |= held_kinds(fields)
        if len(self._writer.offsets) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """Write the shard being collected, if it holds a sample."""
        if self._writer is None or self._buf is None or not self._writer.offsets:  # (the two are set together)
            return
        self._writer.close()
        data = self._buf.getvalue()
        name = f"{self.prefix}-{self.first_number + len(self.entries):06d}.tar"
        self.put(name, data)
        offsets = tuple(self._writer.offsets)
        self.entries.append(ShardEntry(name=name, num_samples=len(offsets) - 1, size=len(data),
                                       sha256=hashlib.sha256(data).hexdigest(), offsets=offsets,
                                       crc32=self._writer.crcs, targets=self._held))
        self._buf, self._writer, self._held = None, None, set()

    def close(self, prepared: Mapping[str, Any] | None = None) -> Manifest:
        """Write the last shard, then ``index.json`` (``prepared``: what the writer's caller did to
        the samples, recorded there), which makes the dataset visible."""
        self.flush()
        manifest = Manifest(shards=tuple(self.entries), classes=tuple(self.classes), prepared=prepared)
        self.put(MANIFEST_NAME, manifest.to_json().encode())
        return manifest

    def put(self, name: str, data: bytes) -> None:
        """``data`` as ``name``: whole or not at all (a local file through a temporary name)."""
        if not self._local:
            self._io.call(f"{self.url}/{name}", "pipe_file", data)
            return
        partial = f"{self.root}/.{name}.partial-{os.getpid()}"
        try:
            self._io.call(partial, "pipe_file", data)
            os.replace(partial, f"{self.root}/{name}")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)

    def __enter__(self) -> ShardSink:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
