"""``gpupipe index`` for sources read in place: an image folder or Parquet files.

:func:`index_in_place` describes the source afresh (one listing, or one footer read
per file — never an old ``index.json``) and writes the manifest beside it: in the
folder, or in the folder of the Parquet files. With ``checksums`` it also reads every
byte the stream will read once and stores a CRC-32 per object or row group, which the
stream then checks exactly as it checks shards. Tar shards are left to
:func:`gpupipe.ingest.index` (it returns ``None`` for them).
"""
from __future__ import annotations

import logging
import posixpath
import sys
from typing import Any, Mapping, Sequence

from gpupipe.errors import ConfigError
from gpupipe.inplace import with_checksums
from gpupipe.manifest import MANIFEST_NAME, Manifest
from gpupipe.sources import Source, expand_pattern, resolve
from gpupipe.storage import FetchConfig, Fetcher, open_filesystem, refuse_commands

__all__ = ["index_in_place"]

log = logging.getLogger(__name__)


def index_in_place(url: str | list[str], *, storage_options: Mapping[str, Any] | None = None, workers: int = 8,
                   checksums: bool = False, image_column: str | None = None, label_column: str | None = None,
                   labels: str | None = None, classes: Sequence[str] | None = None,
                   progress: bool = True) -> Manifest | None:
    """Write ``index.json`` for the image folder or Parquet files at ``url``; returns the
    manifest, or ``None`` when ``url`` names tar shards (nothing is written then).

    ``workers``: requests in flight. ``image_column``, ``label_column``, ``labels`` and
    ``classes`` are as in :class:`~gpupipe.sources.Source`; the index remembers them.
    """
    if workers < 1:
        raise ConfigError(f"index: workers must be >= 1, got {workers}")
    refuse_commands(expand_pattern(url))
    fetch = FetchConfig(concurrency=workers)
    source = Source(url, dict(storage_options or {}), image_column=image_column, label_column=label_column,
                    labels=labels, classes=None if classes is None else tuple(classes))
    resolved = resolve(source, fetch, use_index=False)
    if resolved.kind == "tar":
        return None
    manifest = resolved.manifest
    root = resolved.shard_urls.root
    fs, folder = open_filesystem(root, storage_options)
    if checksums:
        from tqdm import tqdm

        fetcher = Fetcher(fs, fetch)
        try:
            with tqdm(total=manifest.total_bytes, disable=not progress, file=sys.stderr, unit="B", unit_scale=True,
                      desc="index") as bar:
                manifest = with_checksums(fetcher, manifest, resolved.shard_urls, bar.update)
        finally:
            fetcher.close()
    fs.pipe_file(posixpath.join(folder.rstrip("/"), MANIFEST_NAME), manifest.to_json().encode())
    log.info("indexed %d samples (%s, %d units) under %s", manifest.num_samples, manifest.kind, manifest.num_units,
             root)
    return manifest
