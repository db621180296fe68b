"""Where the shards are: a URL pattern (braces, globs, a list) → shard URLs + manifest.

Accepted forms, on any fsspec filesystem (local paths, ``file://``, ``s3://``,
``gs://``, ``memory://``, ``http(s)://``):

* a folder (``s3://bucket/train/``) or its ``index.json``: the manifest lists the shards;
* ``shard-{000000..000127}.tar`` brace ranges and lists (``{a,b}``);
* globs (``train/*.tar``; not on http, which cannot list);
* a list of any of these.

When an ``index.json`` sits beside the shards, its entries describe them
(sizes, sample counts, offsets) and no listing or scanning happens at start.
Without one, shards are still readable — streamed whole — and a warning says
that splits across ranks are then by whole shard and not exact.
"""
from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from gpupipe.errors import ConfigError, StorageError
from gpupipe.manifest import MANIFEST_NAME, Manifest, ShardEntry
from gpupipe.storage import FetchConfig, Fetcher, open_filesystem
from gpupipe.types import ByteRange

__all__ = ["Source", "ResolvedSource", "expand_pattern", "resolve"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """A shard location and its storage options (which never appear in ``repr``)."""

    url: str | tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.url, list):
            object.__setattr__(self, "url", tuple(self.url))
        if not self.url:
            raise ConfigError("source.url: empty; give a folder, a pattern or a list of shard URLs")


@dataclass(frozen=True)
class ResolvedSource:
    """Shard URLs, and the manifest entries for them in the same order (or ``None``)."""

    shard_urls: tuple[str, ...]
    manifest: Manifest | None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_samples(self) -> int | None:
        return None if self.manifest is None else self.manifest.num_samples


def expand_pattern(pattern: str | Sequence[str]) -> list[str]:
    """Brace expansion (``{000..127}`` ranges, ``{a,b}`` lists) of one pattern or each of a list."""
    from braceexpand import braceexpand  # a core dependency

    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    out: list[str] = []
    for p in patterns:
        try:
            out.extend(braceexpand(p))
        except Exception as exc:  # braceexpand raises plain exceptions on malformed input
            raise ConfigError(f"source.url: cannot expand {p!r}: {exc}") from None
    return out


def _has_glob(s: str) -> bool:
    return any(ch in s for ch in "*?[")


def resolve(source: Source, fetch: FetchConfig | None = None) -> ResolvedSource:
    """Expand the source and load the manifest beside the shards, if there is one.

    Storage errors (missing bucket, 403) surface here, in the main process, as
    ``StorageError`` naming the URL — not later inside a DataLoader worker.
    """
    urls = expand_pattern(source.url)
    fs, _ = open_filesystem(urls[0], source.storage_options)
    protocol = urls[0].split("://", 1)[0] + "://" if "://" in urls[0] else ""
    fetcher = Fetcher(fs, fetch or FetchConfig())
    if len(urls) == 1 and _is_folder(fetcher, urls[0]):
        u = urls[0]
        folder = u[: -len(MANIFEST_NAME)] if u.endswith(MANIFEST_NAME) else u.rstrip("/") + "/"
        manifest = _load_manifest(fetcher, folder + MANIFEST_NAME)
        if manifest is not None:
            return ResolvedSource(tuple(folder + s.name for s in manifest.shards), manifest, source.storage_options)
        urls = [folder + "*.tar"]
    shard_urls: list[str] = []
    for u in urls:
        if _has_glob(u):
            found = sorted(fetcher.call(u, "glob"))
            if not found:
                raise StorageError("no shards match this pattern (and no index.json here)", url=u)
            shard_urls.extend(_with_protocol(protocol, p) for p in found)
        else:
            shard_urls.append(u)
    manifest = _manifest_for(fetcher, shard_urls)
    if manifest is None:
        fetcher.size(shard_urls[0])  # fail here, clearly, if the storage is not reachable
        log.warning(
            "no %s beside the shards: streaming %d shard(s) whole; splits across ranks and workers are "
            "by shard, so steps per rank may differ. Run `gpupipe index` to write one.",
            MANIFEST_NAME, len(shard_urls))
    return ResolvedSource(tuple(shard_urls), manifest, source.storage_options)


def _manifest_for(fetcher: Fetcher, shard_urls: list[str]) -> Manifest | None:
    """The manifest entries of these shards, if one manifest in their folder lists them all."""
    folders = {posixpath.dirname(u) for u in shard_urls}
    if len(folders) != 1:
        return None
    folder = folders.pop() + "/"
    manifest = _load_manifest(fetcher, folder + MANIFEST_NAME)
    if manifest is None:
        return None
    by_name = {s.name: s for s in manifest.shards}
    names = [u[len(folder):] for u in shard_urls]
    missing = [n for n in names if n not in by_name]
    if missing:
        log.warning("%s does not list %s; ignoring it", folder + MANIFEST_NAME, missing[:3])
        return None
    entries: list[ShardEntry] = [by_name[n] for n in names]
    return Manifest(shards=tuple(entries), classes=manifest.classes)


def _load_manifest(fetcher: Fetcher, url: str) -> Manifest | None:
    """The manifest at ``url``; ``None`` when there is none (other storage errors raise)."""
    try:
        text = fetcher.read(ByteRange(url))
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError) and "bucket" not in str(exc.__cause__).lower():
            return None
        raise
    return Manifest.from_json(text, source=url)


def _is_folder(fetcher: Fetcher, url: str) -> bool:
    if url.endswith("/") or url.endswith(MANIFEST_NAME):
        return True
    if _has_glob(url) or url.endswith((".tar", ".tgz", ".tar.gz")):
        return False
    return bool(fetcher.call(url, "isdir"))


def _with_protocol(protocol: str, path: str) -> str:
    if not protocol or path.startswith(protocol):
        return path
    return protocol + path
