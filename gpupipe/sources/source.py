"""Where the data is: a URL pattern (braces, globs, a list) → units + manifest.

Accepted forms, on any fsspec filesystem (local paths, ``file://``, ``s3://``,
``gs://``, ``memory://``, ``http(s)://``):

* a folder (``s3://bucket/train/``) or its ``index.json``: the manifest lists what is
  there. Without one the folder is listed once and holds tar shards (``*.tar`` at its
  top level), Parquet files (``**/*.parquet``), or images — in class sub-folders, or
  flat with a ``labels.csv`` / ``labels.json`` (:mod:`gpupipe.formats.folder`);
* ``shard-{000000..000127}.tar`` brace ranges and lists (``{a,b}``);
* globs (``train/*.tar``, ``table/*.parquet``; not on http, which cannot list);
* a list of any of these;
* a Delta Lake table folder (``_delta_log/`` in its listing), read as the Parquet files of
  its latest version, or ``table@v<N>`` for version ``N`` (:mod:`gpupipe.formats.delta`,
  the ``delta`` extra); its index is ``_gpupipe_index.json`` and names the version.

When an ``index.json`` sits beside the data, its entries describe it (sizes,
sample counts, offsets; row groups and their byte ranges; objects, labels) and no
listing or scanning happens at start. Without one, an image folder is listed and
Parquet footers are read at start, which gives the same exact plan (every rank
lists for itself: the folder must not change while they start). Tar shards
without one are still readable — streamed whole — and a warning says that splits
across ranks are then by whole shard and not exact.

To the plan every source is a list of *units* with sample counts: tar shards,
objects (one image each) or Parquet row groups. ``ResolvedSource.shard_urls[i]``
is the URL of unit ``i`` (for a Parquet row group, its file), and
``ResolvedSource.unit_version(i)`` what its bytes are known by in the block cache
(:mod:`gpupipe.storage.identity`): its checksum in the manifest, else the identity of
what described it — the ``index.json`` (its ETag or mtime, from the one ``info()`` its
read makes anyway) or, for a source listed at start, the listing.
"""
from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpupipe.core.errors import ConfigError, ShardFormatError, StorageError, StorageNotFoundError
from gpupipe.core.types import ErrorPolicy
from gpupipe.formats.containers import container, containers
from gpupipe.formats.delta import DELTA_INDEX, latest_version, parse_index, read_snapshot, split_version
from gpupipe.formats.folder import FolderListing, classify_listing
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest, ShardEntry
from gpupipe.sources.annotated import check_targets, first_url, with_targets
from gpupipe.sources.inplace import describe_parquet_files
from gpupipe.sources.resolved import ResolvedSource, Source, UnitURLs
from gpupipe.storage.fetch import FetchConfig, Fetcher, open_filesystem
from gpupipe.storage.identity import RACY_S, digest_of, identity_of
from gpupipe.storage.objects import read_whole, with_protocol

__all__ = ["Source", "ResolvedSource", "UnitURLs", "expand_pattern", "resolve"]

log = logging.getLogger(__name__)
_MISSING = ("does not exist; give a folder of tar shards, images or .parquet files (a local path, or a URL such "
            "as s3://bucket/train/), a shard pattern or an index.json")
_SAID: set[tuple[str, str]] = set()  # (source, warning) said in this process: each once (_warn_once)
_DELTA_FILES = "delta"  # a Delta table's data files are never rewritten under their names (the protocol)


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


def resolve(source: Source, fetch: FetchConfig | None = None, *, use_index: bool = True,
            on_error: ErrorPolicy | str | None = None) -> ResolvedSource:
    """Expand the source and load the manifest beside the data, if there is one.

    Storage errors (missing bucket, 403) surface here, in the main process, as
    ``StorageError`` naming the URL — not later inside a DataLoader worker; a path that
    does not exist says so (``StorageNotFoundError``). ``use_index=False`` ignores an
    ``index.json`` (``gpupipe index`` describes afresh).

    ``on_error``: the policy the loader will read with (None: not a loader, e.g. ``gpupipe
    validate``, which lists bad files itself). Images of an image folder that are empty (0 bytes:
    known from the listing or the index, before any read) raise ``ShardFormatError`` here under
    ``raise``, naming them and both ways out, rather than at the first batch that holds one; under
    ``skip`` a warning says so once per process (each is then a counted skip, every epoch).

    With ``source.targets``: an image folder's objects come from a COCO file — ``source.annotations``
    if given, else the one ``instances_*.json`` in the folder, else
    ``<parent>/annotations/instances_<folder name>.json`` (COCO's own layout: ``val2017/`` beside
    ``annotations/instances_val2017.json``). The folder is flat, every image in it must be listed in
    the file and every image the file lists must be in it (``ConfigError`` naming them); its labels
    are -1 and its classes the categories (:mod:`gpupipe.formats.coco`). Parquet files read the
    ``boxes`` / ``box_labels`` and ``mask`` columns too (:func:`~gpupipe.formats.rowgroups.with_target_columns`);
    tar shards carry their targets as members.
    """
    urls = expand_pattern(source.url)
    urls[0], pinned = split_version(urls[0]) if len(urls) == 1 else (urls[0], None)
    fs, _ = open_filesystem(urls[0], source.storage_options)
    fetcher = Fetcher(fs, fetch or FetchConfig())
    resolved = _resolve(fetcher, source, urls, pinned, use_index)
    if source.targets:
        check_targets(resolved, source)
    resolved = with_targets(fetcher, resolved, source,
                            resolved.shard_urls.root if isinstance(resolved.shard_urls, UnitURLs) else None)
    if on_error is not None:
        _empty_images(resolved, first_url(source.url), ErrorPolicy(on_error))
    m = resolved.manifest
    if fetcher.config.cache_dir and m is not None and not resolved.identity and m.table is not None and \
            m.table.crc32 is None:
        log.info("%s: its %s are read past stream.fetch.cache_dir: no checksums in the index, and no identity of "
                 "the index (or of the files listed) to vouch for them — the storage gives none, or something was "
                 "written less than %g s ago. `gpupipe index --checksums` makes them cacheable.",
                 first_url(source.url), m.container.units, RACY_S)
    return resolved


def _resolve(fetcher: Fetcher, source: Source, urls: list[str], pinned: int | None, use_index: bool) -> ResolvedSource:
    protocol = urls[0].split("://", 1)[0] + "://" if "://" in urls[0] else ""
    if pinned is not None:
        return _delta_source(fetcher, urls[0].rstrip("/") + "/", source, pinned, use_index)
    if len(urls) == 1 and _is_folder(fetcher, urls[0]):
        u = urls[0]
        folder = u[: -len(MANIFEST_NAME)] if u.endswith(MANIFEST_NAME) else u.rstrip("/") + "/"
        indexed = _load_manifest(fetcher, folder + MANIFEST_NAME) if use_index else None
        if indexed is not None:
            _check_classes(indexed[0], source, folder)
            return _with_manifest(folder, indexed[0], source, indexed[1])
        in_place = _listed_folder(fetcher, folder, source, warn=use_index)
        if in_place is not None:
            return in_place
        urls = [folder + "*.tar"]
    paths: list[str] = []
    for u in urls:
        if _has_glob(u):
            found = sorted(fetcher.call(u, "glob"))
            if not found:
                raise StorageError(_nothing_matches(fetcher, u), url=u)
            paths.extend(with_protocol(protocol, p) for p in found)
        else:
            paths.append(u)
    if paths and all(p.endswith(".parquet") for p in paths):
        return _parquet_source(fetcher, paths, source, use_index)
    listed, identity = _manifest_for(fetcher, paths) if use_index else (None, "")
    if listed is None and use_index:
        try:
            fetcher.size(paths[0])  # fail here, clearly, if the storage is not reachable
        except StorageNotFoundError:
            raise StorageNotFoundError(_MISSING, url=paths[0]) from None
        _warn_once(True, paths[0], "no %s beside the shards: streaming %d shard(s) whole; splits across ranks and "
                   "workers are by shard, so steps per rank may differ. Run `gpupipe index` to write one.",
                   MANIFEST_NAME, len(paths))
    return ResolvedSource(tuple(paths), listed, source.storage_options, identity=identity)


def _with_manifest(folder: str, manifest: Manifest, source: Source, identity: str) -> ResolvedSource:
    """``identity``: the version tag of what described the units (see :class:`ResolvedSource`).
    A container read in place names its units' URLs (its ``unit_urls`` hook)."""
    if manifest.table is not None:
        urls = manifest.container.needs("unit_urls", f"reading {folder}")(folder, manifest.table)
        return ResolvedSource(urls, manifest, source.storage_options, identity=identity)
    return ResolvedSource(tuple(folder + s.name for s in manifest.shards), manifest, source.storage_options,
                          identity=identity)


def _check_classes(manifest: Manifest, source: Source, where: str) -> None:
    """A source read in place whose index numbers classes otherwise than ``source.classes``
    asks for is refused (its labels would mean other classes)."""
    if manifest.table is not None and source.classes is not None and manifest.classes and \
            tuple(manifest.classes) != tuple(source.classes):
        raise ConfigError(f"source.classes: {where}{MANIFEST_NAME} numbers {len(manifest.classes)} classes "
                          f"{list(manifest.classes[:4])}..., not as the {len(source.classes)} given "
                          f"{list(source.classes[:4])}... (classes= / source.classes); rerun `gpupipe index` with this class "
                         "list, or give the index's")


def _listed_folder(fetcher: Fetcher, folder: str, source: Source, warn: bool = True) -> ResolvedSource | None:
    """An image folder or Parquet files, described from one listing (``None``: tar shards)."""
    listing, identity = _listing(fetcher, folder)
    version = latest_version(listing)
    if version is not None:  # a Delta table
        return _delta_source(fetcher, folder, source, version, warn)
    if listing.kind == "empty":
        if not listing.files and not fetcher.call(folder, "exists"):
            raise StorageNotFoundError(_MISSING, url=folder)
        kinds = [c.listed for c in containers() if c.recognise is not None]
        what = " or ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
        raise StorageError(f"no {what} here (and no {MANIFEST_NAME}); give the folder that holds them", url=folder)
    kind = container(listing.kind)
    if not kind.in_place:
        return None
    skipped: list[tuple[str, str]] = []
    manifest = kind.needs("describe", f"reading {folder} in place")(fetcher, folder, listing, source, skipped)
    _described_at_start(manifest, folder, warn)
    return replace(_with_manifest(folder, manifest, source, identity), skipped=tuple(skipped))


def _described_at_start(manifest: Manifest, where: str, warn: bool, index: str = MANIFEST_NAME) -> None:
    _warn_once(warn, where, "no %s for %s: described %d %s at start (every rank does, every time). `gpupipe index` "
               "writes one: a faster start, and CRC-32 checks with --checksums.", index, where, manifest.num_units,
               manifest.container.units)


def _warn_once(warn: bool, where: str, message: str, *args) -> None:
    """A warning about the source at ``where``, said once per process (a second loader of the same
    source, or a tool that resolves it twice, says it at debug level); ``warn=False``: debug only. The
    same words with other numbers (the source changed) are said again."""
    said = (where, message % args)
    if not warn or said in _SAID:
        log.debug(message, *args)
        return
    _SAID.add(said)
    log.warning(message, *args)


def _empty_images(resolved: ResolvedSource, url: str, on_error: ErrorPolicy) -> None:
    """Empty (0-byte) images of an image folder, from the sizes its manifest holds: raised under
    ``raise``, said once under ``skip`` (see :func:`resolve`)."""
    table = resolved.manifest.objects if resolved.manifest is not None else None
    empty = [] if table is None else np.flatnonzero(table.sizes == 0).tolist()
    if table is None or not empty:
        return
    names = ", ".join(table.names[i] for i in empty[:3]) + (", ..." if len(empty) > 3 else "")
    what = f"{len(empty)} of its {len(table)} images {'is' if len(empty) == 1 else 'are'} empty (0 bytes): {names}"
    validate = f"`gpupipe validate {url}` to list every bad file, then move them out or fix them"
    if on_error is ErrorPolicy.RAISE:
        raise ShardFormatError(f"{what}. Under on_error='raise' (the default) the first batch holding one would stop "
                               "the run: set on_error='skip' (decode.on_error: skip in YAML) to replace each and count "
                               f"it, or run {validate}", shard=url)
    _warn_once(True, url, "%s: %s; on_error='skip' replaces each in every epoch and counts it. Run %s", url, what,
               validate)


def _parquet_source(fetcher: Fetcher, paths: list[str], source: Source, use_index: bool) -> ResolvedSource:
    """Parquet files named one by one or by a glob: the index.json of their folder when it
    describes them all, else their footers."""
    folders = {posixpath.dirname(p) for p in paths}
    folder = folders.pop() + "/" if len(folders) == 1 else ""
    found = _load_manifest(fetcher, folder + MANIFEST_NAME) if folder and use_index else None
    if found is not None and found[0].parquet is not None and \
            {folder + n for n in found[0].parquet.files} == set(paths):
        _check_classes(found[0], source, folder)
        return _with_manifest(folder, found[0], source, found[1])
    root = _common_folder(paths)
    infos = [fetcher.call(p, "info") for p in paths]  # the size, and with it the identity (as the glob listed it)
    sizes = [int(info["size"]) for info in infos]
    manifest = describe_parquet_files(fetcher, root, [p[len(root):] for p in paths], sizes, source.image_column,
                                      source.label_column, source.classes)
    _described_at_start(manifest, root, use_index)
    return _with_manifest(root, manifest, source, digest_of((p, identity_of(i)) for p, i in zip(paths, infos)))


def _delta_source(fetcher: Fetcher, folder: str, source: Source, version: int, use_index: bool) -> ResolvedSource:
    """The Parquet files of version ``version`` of the Delta table at ``folder``: from its
    ``_gpupipe_index.json`` when that describes this version, else from the log and footers."""
    got = read_whole(fetcher, folder + DELTA_INDEX) if use_index else None
    text = None if got is None else got[0]
    indexed = None if text is None else parse_index(text, folder + DELTA_INDEX)
    if indexed is not None and indexed != version:
        log.warning("%s describes version %d of the table, not version %d: ignored (its file list is stale), the "
                    "files described afresh. Rerun `gpupipe index %s`, or pin its version: %s@v%d", folder +
                    DELTA_INDEX, indexed, version, folder, folder.rstrip("/"), indexed)
        text = None
    if text is not None:
        manifest = Manifest.from_json(text, source=folder + DELTA_INDEX)
        _check_classes(manifest, source, folder)
    else:
        snap = read_snapshot(folder, source.storage_options, version, source.label_column)
        manifest = describe_parquet_files(fetcher, folder, snap.names, snap.sizes, source.image_column,
                                          source.label_column, source.classes)
        _described_at_start(manifest, folder, use_index, DELTA_INDEX)
    return replace(_with_manifest(folder, manifest, source, _DELTA_FILES), delta_version=version)


def _listing(fetcher: Fetcher, folder: str) -> tuple[FolderListing, str]:
    """One recursive listing of ``folder``, classified, and the digest of every listed file's
    identity (``""`` when one has none: then nothing it describes is cached). The
    filesystem's own listing cache is dropped after it: a later ``index.json`` (or any
    change) must be seen."""
    found = fetcher.call(folder, "find", None, False, True)
    fetcher.fs.invalidate_cache(fetcher.fs._strip_protocol(folder))
    files = {p: info for p, info in found.items() if info.get("type", "file") != "directory"}
    return classify_listing(fetcher.fs._strip_protocol(folder), found), \
        digest_of((p, identity_of(info)) for p, info in files.items())


def _common_folder(paths: list[str]) -> str:
    """The deepest folder holding all ``paths`` (same protocol), with a trailing ``/``."""
    protocol = paths[0].split("://", 1)[0] + "://" if "://" in paths[0] else ""
    return protocol + posixpath.commonpath([posixpath.dirname(p[len(protocol):]) for p in paths]) + "/"


def _nothing_matches(fetcher: Fetcher, pattern: str) -> str:
    """Why a glob matched nothing, and what to do — the folder may hold images instead."""
    folder = pattern[: max(pattern.rfind("/"), 0)]
    try:
        listing = _listing(fetcher, folder)[0]
    except StorageError:
        listing = None
    if listing is not None and not listing.files and folder and not fetcher.call(folder, "exists"):
        return f"no shards match this pattern: {folder}/ does not exist"
    kind = container(listing.kind) if listing is not None and listing.kind != "empty" else None
    if kind is not None and kind.in_place:
        return (f"no shards match this pattern, but {folder}/ holds {kind.listed}: give the folder URL ({folder}/) to read "
                f"them in place, or run `gpupipe ingest {folder}/ DST` to make shards")
    return (f"no shards match this pattern (and no {MANIFEST_NAME} here); give tar shards, a folder of images or "
            ".parquet files, or make shards with `gpupipe ingest`")


def _manifest_for(fetcher: Fetcher, shard_urls: list[str]) -> tuple[Manifest | None, str]:
    """The manifest entries of these shards, if one manifest in their folder lists them all,
    and the manifest's identity."""
    folders = {posixpath.dirname(u) for u in shard_urls}
    if len(folders) != 1:
        return None, ""
    folder = folders.pop() + "/"
    found = _load_manifest(fetcher, folder + MANIFEST_NAME)
    if found is None:
        return None, ""
    manifest, identity = found
    by_name = {s.name: s for s in manifest.shards}
    names = [u[len(folder):] for u in shard_urls]
    missing = [n for n in names if n not in by_name]
    if missing:
        log.warning("%s does not list %s; ignoring it", folder + MANIFEST_NAME, missing[:3])
        return None, ""
    entries: list[ShardEntry] = [by_name[n] for n in names]
    return Manifest(shards=tuple(entries), classes=manifest.classes), identity


def _load_manifest(fetcher: Fetcher, url: str) -> tuple[Manifest, str] | None:
    """The manifest at ``url`` and its identity; ``None`` when there is none (other storage
    errors raise)."""
    got = read_whole(fetcher, url)
    return None if got is None else (Manifest.from_json(got[0], source=url), got[1])


def _is_folder(fetcher: Fetcher, url: str) -> bool:
    if url.endswith("/") or url.endswith(MANIFEST_NAME):
        return True
    if _has_glob(url) or url.endswith((".tar", ".tgz", ".tar.gz", ".parquet")):
        return False
    return bool(fetcher.call(url, "isdir"))


#END
