"""Make a shard dataset: ``gpupipe ingest``.

:func:`ingest` turns an image folder (``src/<class>/<image>``, ImageNet layout) or Parquet
files (an image-bytes column and a label column) into WebDataset-layout tar shards plus the
``index.json`` manifest, on any fsspec filesystem. Each image's header is checked with
:func:`~gpupipe.formats.imageheader.probe` first; what fails is skipped, logged and listed in
the :class:`IngestReport` -- never dropped silently. The output order is a permutation drawn
from ``seed`` (readers shuffle only within a window, so the order at rest matters) and the
same inputs and seed give byte-identical shards.

:func:`gpupipe.tools.indexer.index` writes the manifest for shards made elsewhere (e.g. by
``webdataset``) and :func:`gpupipe.tools.sourceinfo.inspect` summarises a dataset. Nothing here prints.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import posixpath
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpupipe.core.errors import ConfigError, DecodeError, StorageError
from gpupipe.formats.imagefolder import IMAGE_EXTENSIONS, extension, no_images_message, scan_image_folder
from gpupipe.formats.imageheader import MAX_PIXELS, probe
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.writer import ShardSink
from gpupipe.plan import shuffle_buffer
from gpupipe.sources.classes import CLASSES_NAME, check_class_names, class_list, describe, refuse_unlisted
from gpupipe.storage.fetch import open_filesystem, storage_errors

__all__ = ["IngestReport", "ingest", "in_val_split"]

log = logging.getLogger(__name__)

_EXT_OF_FORMAT = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "gif": "gif"}
_READS_AHEAD_PER_WORKER = 4  # image files requested but not yet written, per worker
_PARQUET_SHUFFLE_BUFFER = 2048  # rows mixed across row groups (which are themselves permuted)
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class IngestReport:
    """What :func:`ingest` wrote, and every input it skipped as ``(path, reason)``."""

    num_samples: int
    num_shards: int
    bytes: int
    classes: tuple[str, ...]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)  # samples per carved split ({} without one)
    indexes: list[str] = field(default_factory=list)  # the index.json files written

    def summary(self, max_skipped: int = 10) -> str:
        """A few lines for people: counts, size, speed, and the first skipped inputs."""
        rate = self.num_samples / self.seconds if self.seconds > 0 else 0.0
        lines = [f"{self.num_samples} samples in {self.num_shards} shards ({self.bytes / 2**20:.1f} MiB), "
                 f"{len(self.classes)} classes, {len(self.skipped)} skipped, "
                 f"{self.seconds:.1f} s ({rate:.0f} samples/s)"]
        if self.splits:
            lines.append("  split: " + ", ".join(f"{name} {n}" for name, n in self.splits.items()))
        lines += [f"  skipped {path}: {reason}" for path, reason in self.skipped[:max_skipped]]
        if len(self.skipped) > max_skipped:
            lines.append(f"  ... and {len(self.skipped) - max_skipped} more skipped")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Item:
    """One input image: ``name`` for messages, ``stem`` and ``index`` (its rank in the sorted
    source) for its key, and its bytes -- or ``None`` and the reason it could not be read.
    (A dataclass: as a NamedTuple its field ``index`` would hide ``tuple.index``.)"""

    name: str
    class_name: str
    stem: str
    index: int
    label: int | None
    data: bytes | None
    error: str = ""


def ingest(src: str, dst: str, *, shard_size: int = 1000, workers: int = 4,
           storage_options: Mapping[str, Any] | None = None,
           dst_storage_options: Mapping[str, Any] | None = None, seed: int = 0, shuffle: bool = True,
           max_pixels: int | None = MAX_PIXELS, progress: bool = True,
           image_column: str | None = None, label_column: str | None = None,
           classes: Sequence[str] | None = None, classes_from: str | None = None,
           val_fraction: float = 0.0) -> IngestReport:
    """Write the images of ``src`` as shards + ``index.json`` (+ ``classes.txt``) under ``dst``.

    ``src``: a folder ``<class>/<image>`` (classes sorted by name give the label index), or a
    ``.parquet`` file, a folder of them or a glob. ``dst_storage_options=None`` reuses
    ``storage_options`` when ``dst`` has the same protocol. Samples get keys
    ``<class>/<stem>_<NNNNNNNN>`` and fields ``{jpg|png|webp|bmp|gif: bytes, "cls": b"<label>"}``.

    ``classes`` (or ``classes_from``: an ``index.json``, its folder or a ``classes.txt``, see
    :func:`~gpupipe.sources.classes.class_list`) fixes the class list and so the numbering, e.g. val's from train's
    index; a class of the source that is not in it is refused.

    ``val_fraction`` > 0 carves a validation split: ``dst/train/`` and ``dst/val/`` each get
    shards, ``index.json`` and ``classes.txt`` (one class list). Whether an input goes to val
    is :func:`in_val_split` of ``seed`` and its path under ``src``: the same on every run.
    Raises ``StorageError`` for a missing source and ``ConfigError`` for bad arguments.
    """
    start = time.perf_counter()
    if shard_size < 1 or workers < 1:
        raise ConfigError(f"ingest: shard_size and workers must be >= 1, got {shard_size} and {workers}")
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"ingest: val_fraction must be in [0, 1) (e.g. 0.1 for 10% validation), got {val_fraction}")
    fs, root = open_filesystem(src, storage_options)
    _check_not_inside(src, dst)
    dst_options = _dst_options(src, dst, storage_options, dst_storage_options)
    given = _given_classes(classes, classes_from, _options_like(classes_from, (dst, dst_options),
                                                                (src, storage_options)))
    skipped: list[tuple[str, str]] = []
    with storage_errors(src):  # a storage backend's error becomes one line naming src
        kind, paths = _list_source(fs, src, root)
    rng = _rng(seed)
    if isinstance(paths, list):  # kind "parquet": the files; a folder is {path: info}
        classes, total, items = _parquet_items(fs, paths, rng, shuffle=shuffle, workers=workers,
                                               image_column=image_column, label_column=label_column, given=given)
    else:
        classes, total, items = _folder_items(fs, root, paths, rng, skipped, shuffle=shuffle, workers=workers,
                                              given=given)
    splits = ("train", "val") if val_fraction else ("",)
    sinks = {s: ShardSink(f"{dst.rstrip('/')}/{s}" if s else dst, shard_size=shard_size, classes=classes,
                          storage_options=dst_options) for s in splits}
    base = root.rstrip("/") if kind == "folder" else posixpath.commonpath([posixpath.dirname(p) for p in paths])

    def sink_of(item: _Item) -> ShardSink:
        if not val_fraction:
            return sinks[""]
        return sinks["val" if in_val_split(item.name[len(base):].lstrip("/"), seed, val_fraction) else "train"]

    from tqdm import tqdm

    with tqdm(total=total, disable=not progress, file=sys.stderr, unit="img", desc="ingest") as bar:
        _write_items(items, sink_of, max_pixels=max_pixels, skipped=skipped, tick=bar.update)
    manifests = {s: _close(sink, classes) for s, sink in sinks.items()}
    return IngestReport(sum(m.num_samples for m in manifests.values()), sum(len(m.shards) for m in manifests.values()),
                        sum(m.total_bytes for m in manifests.values()), tuple(classes), skipped,
                        time.perf_counter() - start, {s: m.num_samples for s, m in manifests.items() if s},
                        [f"{dst.rstrip('/')}/{s + '/' if s else ''}{MANIFEST_NAME}" for s in manifests])


def in_val_split(key: str, seed: int, fraction: float) -> bool:
    """Whether the input at ``key`` (its path under the source) belongs to the validation split.

    A pure function of ``(seed, key)``: a re-run gives the same split, and adding inputs never
    moves the others between splits. Each input is in val with probability ``fraction``, so a
    class gets ``fraction`` of its inputs in expectation (not exactly: a class of 3 images may
    get none at 0.2).
    """
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def _close(sink: ShardSink, classes: Sequence[str]) -> Manifest:
    """Write ``classes.txt`` (when there are classes), then the manifest, which ends the dataset."""
    if classes:
        sink.fs.pipe_file(f"{sink.root}/{CLASSES_NAME}", "".join(c + "\n" for c in classes).encode())
    return sink.close()


def _rng(seed: int):
    import numpy as np

    return np.random.default_rng(seed)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def _dst_options(src: str, dst: str, src_options, dst_options):
    if dst_options is not None:
        return dst_options
    return src_options if _protocol(src) == _protocol(dst) else None


def _options_like(url: str | None, *known: tuple[str, Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """The storage options of the first ``(url, options)`` on ``url``'s protocol."""
    for other, options in known:
        if url is not None and _protocol(url) == _protocol(other):
            return options
    return None


def _check_not_inside(src: str, dst: str) -> None:
    """Refuse a destination inside the source: a second run would ingest the shards."""
    if _protocol(src) != _protocol(dst):
        return
    s, d = _bare(src), _bare(dst)
    if d == s or d.startswith(s + "/"):
        raise ConfigError(f"ingest: the destination {dst!r} is inside the source {src!r}; write it elsewhere")


def _bare(url: str) -> str:
    path = url.split("://", 1)[-1].rstrip("/")
    return os.path.abspath(path) if _protocol(url) == "file" else path


def _list_source(fs, src: str, root: str) -> tuple[str, list[str] | dict[str, Any]]:
    """``("parquet", sorted paths)`` or ``("folder", {path: info})`` for the source."""
    if any(ch in root for ch in "*?["):
        paths = sorted(fs.glob(root))
        if not paths:
            raise StorageError("no files match this pattern", url=src)
        if not all(p.endswith(".parquet") for p in paths):
            raise ConfigError(f"ingest: a glob source must match .parquet files only ({src!r}); "
                              "for images give the folder that holds the class sub-folders")
        return "parquet", paths
    if root.endswith(".parquet"):
        if not fs.isfile(root):
            raise StorageError("no such Parquet file", url=src)
        return "parquet", [root]
    if not fs.isdir(root):
        what = "not a folder or a .parquet file" if fs.exists(root) else "no such folder"
        raise StorageError(what, url=src)
    found = fs.find(root, detail=True)
    parquet = sorted(p for p in found if p.endswith(".parquet"))
    if parquet and not any(extension(p) in IMAGE_EXTENSIONS for p in found):
        return "parquet", parquet
    if not found:
        raise ConfigError(f"ingest: {src!r} is empty; expected <class>/<image> files or .parquet files")
    return "folder", found


def _folder_items(fs, root: str, found: dict, rng, skipped: list, *, shuffle: bool, workers: int,
                  given: tuple[str, ...] | None) -> tuple[tuple[str, ...], int, Iterator[_Item]]:
    """Classes, the number of images, and the images read concurrently in (shuffled) order."""
    files, classes, rejected = scan_image_folder(root, found)
    if not files:  # a flat folder would give an empty dataset
        raise ConfigError(f"ingest: {no_images_message(root, rejected)}")
    if given is not None:
        refuse_unlisted(classes, given, "class folder")
        classes = given
    for path, reason in rejected:
        _skip(skipped, path, reason)
    label_of = {c: i for i, c in enumerate(classes)}
    order = rng.permutation(len(files)).tolist() if shuffle else range(len(files))

    def read(i: int) -> _Item:
        path, class_name, stem = files[i]
        try:
            data, error = fs.cat_file(path), ""
        except OSError as exc:
            data, error = None, f"read failed: {type(exc).__name__}: {exc}"
        return _Item(path, class_name, stem, i, label_of[class_name], data, error)

    return classes, len(files), _ordered_map(read, order, workers, workers * _READS_AHEAD_PER_WORKER)


def _parquet_items(fs, paths: list[str], rng, *, shuffle: bool, workers: int, image_column: str | None,
                   label_column: str | None, given: tuple[str, ...] | None
                   ) -> tuple[tuple[str, ...], int, Iterator[_Item]]:
    """Classes, the number of rows, and the rows: row groups in (permuted) order, read
    ``workers`` at a time, then mixed by a bounded shuffle buffer."""
    from gpupipe.formats.parquet import plan_parquet, read_row_group

    plan = plan_parquet(fs, paths, image_column=image_column, label_column=label_column)
    groups = list(plan.row_groups)
    if shuffle:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    batches = _ordered_map(lambda g: read_row_group(fs, plan, g), groups, workers, workers)
    classes, number = _parquet_numbering(plan.classes, given)

    def items() -> Iterator[_Item]:
        for row in itertools.chain.from_iterable(batches):
            label = number(row.label) if row.label is not None else None
            name = classes[label] if label is not None and 0 <= label < len(classes) else str(row.label)
            error = "" if label is not None else (
                f"null in label column {plan.label_column!r}" if row.label is None else
                f"label {row.label} is not a class number of the given list ({describe(classes)})")
            yield _Item(row.name, name, row.stem, row.index, label, row.data if not error else None, error)

    out = shuffle_buffer(items(), _PARQUET_SHUFFLE_BUFFER, rng) if shuffle else items()
    return classes, plan.num_rows, out


def _parquet_numbering(found: tuple[str, ...], given: tuple[str, ...] | None
                       ) -> tuple[tuple[str, ...], Callable[[int], int | None]]:
    """The class list, and each row label's number in it (``None``: not a class of the list).
    Named labels (strings, or integers with class-name metadata) are renumbered by name;
    bare integers are kept and must fall inside the given list."""
    if given is None:
        return found, lambda label: label
    if found:
        refuse_unlisted(found, given, "label")
        number = {i: given.index(c) for i, c in enumerate(found)}
        return given, number.get
    return given, lambda label: label if 0 <= label < len(given) else None


def _given_classes(classes: Sequence[str] | None, classes_from: str | None,
                   options: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    if classes is not None and classes_from is not None:
        raise ConfigError("ingest: give the class list or where to read it from (--classes or --classes-from), "
                          "not both")
    if classes_from is not None:
        return class_list(classes_from, storage_options=options)
    return None if classes is None else check_class_names(classes, "ingest: --classes")


def _ordered_map(fn: Callable[[_T], _R], items: Iterable[_T], workers: int, ahead: int) -> Iterator[_R]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most ``ahead`` results pending."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="gpupipe-ingest")
    try:
        it = iter(items)
        pending = deque(pool.submit(fn, x) for x in itertools.islice(it, max(ahead, 1)))
        while pending:
            done = pending.popleft()
            for nxt in itertools.islice(it, 1):  # the next item, if any
                pending.append(pool.submit(fn, nxt))
            yield done.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _write_items(items: Iterable[_Item], sink_of: Callable[[_Item], ShardSink], *, max_pixels: int | None,
                 skipped: list, tick: Callable[[int], Any]) -> None:
    """Probe each item's header and write the good ones; skip (and log) the others."""
    for item in items:
        tick(1)
        if item.data is None:
            _skip(skipped, item.name, item.error or "no image bytes (null)")
            continue
        try:
            header = probe(item.data, max_pixels=max_pixels)
        except DecodeError as exc:
            _skip(skipped, item.name, str(exc))
            continue
        key = f"{_sanitise(item.class_name)}/{_sanitise(item.stem)}_{item.index:08d}"
        sink_of(item).write(key, {_EXT_OF_FORMAT[header.format]: item.data, "cls": str(item.label).encode()})


def _sanitise(part: str) -> str:
    """A key component: letters, digits, '_' and '-' only (no dots, slashes or spaces)."""
    return re.sub(r"[^\w-]", "_", part) or "_"


def _skip(skipped: list, name: str, reason: str) -> None:
    log.warning("skipping %s: %s", name, reason)
    skipped.append((name, reason))
