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

from gpupipe.errors import ConfigError, ShardFormatError, StorageError
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
    from braceexpand import braceexpand

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


def resolve(source: Source, fetch: FetchConfig = FetchConfig()) -> ResolvedSource:
    """Expand the source and load the manifest beside the shards, if there is one."""
    urls = expand_pattern(source.url)
    fs, _ = open_filesystem(urls[0], source.storage_options)
    protocol = urls[0].split("://", 1)[0] + "://" if "://" in urls[0] else ""
    fetcher = Fetcher(fs, fetch)
    if len(urls) == 1 and (urls[0].endswith("/") or urls[0].endswith(MANIFEST_NAME) or _is_dir(fs, urls[0])):
        folder = urls[0][: -len(MANIFEST_NAME)] if urls[0].endswith(MANIFEST_NAME) else urls[0].rstrip("/") + "/"
        manifest = _load_manifest(fetcher, folder + MANIFEST_NAME, required=not _has_tars(fs, folder))
        if manifest is None:
            return _without_manifest(fs, protocol, [folder + "*.tar"], source)
        shard_urls = tuple(folder + s.name for s in manifest.shards)
        return ResolvedSource(shard_urls, manifest, source.storage_options)
    return _without_manifest(fs, protocol, urls, source, fetcher)


def _without_manifest(fs, protocol: str, urls: list[str], source: Source, fetcher: Fetcher | None = None) -> ResolvedSource:
    shard_urls: list[str] = []
    for u in urls:
        if _has_glob(u):
            found = sorted(fs.glob(u))
            if not found:
                raise StorageError("no shards match this pattern", url=u)
            shard_urls.extend(_with_protocol(protocol, p) for p in found)
        else:
            shard_urls.append(u)
    manifest = _manifest_for(fetcher or Fetcher(fs), shard_urls)
    if manifest is None:
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
    manifest = _load_manifest(fetcher, folder + MANIFEST_NAME, required=False)
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


def _load_manifest(fetcher: Fetcher, url: str, *, required: bool) -> Manifest | None:
    try:
        text = fetcher.read(ByteRange(url))
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError) and not required:
            return None
        if isinstance(exc.__cause__, FileNotFoundError):
            raise StorageError(f"no {MANIFEST_NAME} and no *.tar shards here", url=url) from None
        raise
    try:
        return Manifest.from_json(text, source=url)
    except ShardFormatError:
        raise


def _is_dir(fs, url: str) -> bool:
    if _has_glob(url) or url.endswith(".tar"):
        return False
    try:
        return fs.isdir(fs._strip_protocol(url))
    except (OSError, ValueError):
        return False


def _has_tars(fs, folder: str) -> bool:
    try:
        return bool(fs.glob(fs._strip_protocol(folder) + "/*.tar"))
    except (OSError, ValueError, NotImplementedError):
        return False


def _with_protocol(protocol: str, path: str) -> str:
    if not protocol or path.startswith(protocol):
        return path
    return protocol + path
