"""Several sources mixed into one epoch: ``source.train`` given as a list of sources, each drawn by
``weight`` (relative), ``repeat`` (times its size) or ``samples`` (absolute) a epoch.

:class:`MixedSource` is what a split holds for such a list; :func:`resolve_mixed` resolves each
source and joins them into one :class:`~gpupipe.sources.resolved.ResolvedSource` that the stream
reads as it reads one source: the units of every source, one source after another (its
``shard_urls`` and manifest joined), the joined class list, and per source a
:class:`~gpupipe.sources.resolved.SourcePart` — its units, samples and the table that renumbers its
labels into the joined list (applied in the workers, :func:`relabel`). How many samples an epoch
takes of each is the plan's (:func:`gpupipe.plan.draw_sizes`, ``PlanSpec.draws``): the loader computes
it from the parts' sizes.

Classes are matched by name: the joined list is ``source.classes`` when given (a source with a
class it lacks is refused), else the union of the sources' lists — the first source's order, then
the names new in each later one, in its order. For now a mix is of one kind (tar shards, or image
folders without targets) on one filesystem, and each source needs a manifest (an ``index.json``;
an image folder may be described at start).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.core.types import ErrorPolicy, StringTable
from gpupipe.formats.coco import CocoTable
from gpupipe.formats.folder import FOLDER, NameList, ObjectTable
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.rowgroups import PARQUET, RowGroupTable
from gpupipe.sources.annotated import first_url
from gpupipe.sources.resolved import ResolvedSource, Source, SourcePart
from gpupipe.sources.source import resolve
from gpupipe.storage.fetch import FetchConfig
from gpupipe.storage.identity import digest_of

__all__ = ["Drawn", "MixedSource", "resolve_mixed", "joined_classes", "part_of", "per_source", "relabel"]


@dataclass(frozen=True)
class Drawn:
    """How many samples an epoch takes of one source of a mix: exactly one of ``weight`` (the
    weighted sources share their total size in these proportions), ``repeat`` (its size times
    this) or ``samples`` (absolute)."""

    weight: float | None = None
    repeat: float | None = None
    samples: int | None = None


@dataclass(frozen=True)
class MixedSource:
    """Several sources read as one split: ``parts`` (each a :class:`Source`; they share the
    split's storage options, targets and columns), how each is drawn (``draws``, one each), the
    declared class list (``None``: the union by name) and the setting they came from (messages).
    ``url``, ``storage_options`` and ``targets`` answer as a single :class:`Source` does."""

    parts: tuple[Source, ...]
    draws: tuple[Drawn, ...]
    classes: tuple[str, ...] | None = None
    setting: str = "source.train"

    def __post_init__(self) -> None:
        if not self.parts or len(self.parts) != len(self.draws):
            raise ConfigError(f"{self.setting}: a mix needs one draw per source, got {len(self.parts)} source(s) "
                              f"and {len(self.draws)} draw(s)")

    @property
    def url(self) -> tuple[str, ...]:
        """Every source's URLs, in order."""
        return tuple(u for s in self.parts for u in ((s.url,) if isinstance(s.url, str) else s.url))

    @property
    def storage_options(self) -> Mapping[str, Any]:
        return self.parts[0].storage_options

    @property
    def targets(self) -> tuple[str, ...]:
        return self.parts[0].targets


class _JoinedURLs(StringTable):
    """The unit URLs of several sources, one after another, made on demand."""

    def __init__(self, tables: Sequence[Sequence[str]]):
        self._tables = list(tables)
        self._ends = np.cumsum([len(t) for t in tables])

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _at(self, i: int) -> str:
        k = int(np.searchsorted(self._ends, i, side="right"))
        return self._tables[k][i - (int(self._ends[k - 1]) if k else 0)]


def resolve_mixed(mixed: MixedSource, fetch: FetchConfig | None = None, *,
                  on_error: ErrorPolicy | str | None = None) -> ResolvedSource:
    """Resolve each source of ``mixed`` and join them (see the module's docstring); a mix that
    cannot be read as one raises :class:`ConfigError` naming the sources and the way out."""
    urls = [first_url(s.url) for s in mixed.parts]
    named = [f"{mixed.setting}[{i}] ({u})" for i, u in enumerate(urls)]
    protocols = {u.split("://", 1)[0] if "://" in u else "file" for u in urls}
    if len(protocols) > 1:
        raise ConfigError(f"{mixed.setting}: the sources of a mix are on one filesystem for now; these are on "
                          f"{', '.join(sorted(protocols))}: {', '.join(named)}. Copy them to one storage")
    resolved = [resolve(s, fetch, on_error=on_error) for s in mixed.parts]
    for name, r in zip(named, resolved):
        if r.manifest is None:
            raise ConfigError(f"{name}: no {MANIFEST_NAME} beside its shards; every source of a mix needs one (its "
                              f"sample count fixes its share of the epoch). Run `gpupipe index` on it")
    kinds = [r.kind for r in resolved]
    if len(set(kinds)) > 1:
        raise ConfigError(f"{mixed.setting}: the sources of a mix are of one kind for now; these are "
                          + ", ".join(f"{k} {n}" for k, n in zip(kinds, named))
                          + ". Make them one kind (`gpupipe ingest` writes any of them as tar shards)")
    if kinds[0] == "parquet":
        columns = [r.manifest.parquet.columns for r in resolved if r.manifest and r.manifest.parquet]
        if any(c != columns[0] for c in columns):
            raise ConfigError(f"{mixed.setting}: the Parquet sources of a mix read other columns ("
                              + "; ".join(f"{n}: {c}" for n, c in zip(named, columns))
                              + "); give them the same source.image_column and source.label_column, or "
                              "`gpupipe ingest` each to tar shards")
    own = [r.manifest.classes if r.manifest is not None else () for r in resolved]
    classes, tables = joined_classes(own, mixed.classes, named)
    renumbered = [n for n, t in zip(named, tables) if t is not None]
    if "masks" in mixed.targets and renumbered:  # a mask's pixels are class numbers of its source's own list
        raise ConfigError(f"{renumbered[0]}: its classes are numbered otherwise than the mix's ({', '.join(classes)}), "
                          "and its masks hold its own numbers, which are not renumbered; give every source the same "
                          "class list in the same order (source.classes), or mix them without masks")
    parts = tuple(SourcePart(u, r.manifest.num_units, r.manifest.num_samples, tuple(c), t)
                  for u, r, c, t in zip(urls, resolved, own, tables) if r.manifest is not None)
    coco = [r.annotations for r in resolved if r.annotations is not None]
    return ResolvedSource(_joined_urls(resolved), _joined_manifest(resolved, classes), mixed.storage_options,
                          skipped=tuple(x for r in resolved for x in r.skipped),
                          identity=digest_of((u, r.identity) for u, r in zip(urls, resolved)),
                          targets=mixed.targets, parts=parts,
                          annotations=_joined_coco(coco, classes) if len(coco) == len(resolved) else None)


def joined_classes(lists: Sequence[Sequence[str]], declared: Sequence[str] | None, named: Sequence[str]
                   ) -> tuple[tuple[str, ...], list[np.ndarray | None]]:
    """The joined class list, and per source the table that renumbers its labels into it (``None``
    where its numbering is already the joined one's). ``declared``: ``source.classes``, else the
    union by name. A source whose classes cannot be matched by name raises :class:`ConfigError`."""
    if not any(lists):
        return tuple(declared or ()), [None] * len(lists)
    unnamed = [n for n, c in zip(named, lists) if not c]
    if unnamed:
        raise ConfigError(f"{unnamed[0]}: its index names no classes, and other sources of the mix do: its labels "
                          "cannot be matched to theirs by name. Index it with its class names (`gpupipe index`, "
                          "`gpupipe ingest --classes`)")
    if declared is not None:
        joined = tuple(declared)
        for name, own in zip(named, lists):
            missing = [c for c in own if c not in joined]
            if missing:
                raise ConfigError(f"{name}: class {missing[0]!r} is not in source.classes ({len(joined)} classes); "
                                  "add it to the list, or leave source.classes out to number the union of the "
                                  "sources' classes")
    else:
        seen: dict[str, None] = {}
        for own in lists:
            seen.update(dict.fromkeys(own))
        joined = tuple(seen)
    index = {c: i for i, c in enumerate(joined)}
    tables: list[np.ndarray | None] = []
    for own in lists:
        table = np.array([index[c] for c in own], dtype=np.int64)
        tables.append(None if np.array_equal(table, np.arange(len(own))) else table)
    return joined, tables


def _joined_urls(resolved: Sequence[ResolvedSource]) -> Sequence[str]:
    if all(isinstance(r.shard_urls, tuple) for r in resolved):
        return tuple(u for r in resolved for u in r.shard_urls)
    return _JoinedURLs([r.shard_urls for r in resolved])


def _joined_manifest(resolved: Sequence[ResolvedSource], classes: tuple[str, ...]) -> Manifest:
    manifests = [r.manifest for r in resolved if r.manifest is not None]
    held = [m.targets for m in manifests]
    targets = None if any(t is None for t in held) else \
        tuple(k for k in (held[0] or ()) if all(k in (t or ()) for t in held))
    if manifests[0].table is None:  # tar shards
        return Manifest(shards=tuple(s for m in manifests for s in m.shards), classes=classes, targets=targets)
    join = manifests[0].container.needs("join", "a mix of sources")  # one kind: checked before
    return Manifest(shards=(), classes=classes, table=join([m.table for m in manifests]), targets=targets)


def _joined_objects(tables: Sequence[ObjectTable]) -> ObjectTable:
    """The objects of several image folders as one table, one folder's after another's."""
    starts = np.cumsum([0] + [len(t) for t in tables])[:-1]
    crcs = [t.crc32 for t in tables]
    return ObjectTable(
        NameList(n for t in tables for n in t.names), np.concatenate([t.sizes for t in tables]),
        np.concatenate([t.labels for t in tables]),
        None if any(c is None for c in crcs) else np.concatenate([c for c in crcs if c is not None]),
        np.concatenate([t.with_extension + s for t, s in zip(tables, starts)]))


def _joined_row_groups(tables: Sequence[RowGroupTable]) -> RowGroupTable:
    """The row groups of several Parquet sources (read with the same columns) as one table: their
    files one after another, each row group pointing at its file in the joined list."""
    firsts = np.cumsum([0] + [len(t.files) for t in tables])[:-1]
    crcs = [t.crc32 for t in tables]
    return RowGroupTable(
        tables[0].columns, NameList(n for t in tables for n in t.files),
        np.concatenate([t.file_sizes for t in tables]), np.concatenate([t.footer_sizes for t in tables]),
        b"".join(t.footer_blob for t in tables), np.concatenate([t.file + f for t, f in zip(tables, firsts)]),
        np.concatenate([t.index for t in tables]), np.concatenate([t.first_row for t in tables]),
        np.concatenate([t.rows for t in tables]), np.concatenate([t.ranges for t in tables]),
        None if any(c is None for c in crcs) else np.concatenate([c for c in crcs if c is not None]))


def _chained(offsets: Sequence[np.ndarray]) -> np.ndarray:
    """Offset arrays (each from 0, one more entry than the rows it cuts) of tables put one after
    another, as one: each shifted by the rows before it."""
    bases = np.cumsum([0] + [int(o[-1]) for o in offsets])
    return np.concatenate([o[:-1] + b for o, b in zip(offsets, bases)] + [bases[-1:]]).astype(np.int64)


def _joined_coco(tables: Sequence[CocoTable], classes: tuple[str, ...]) -> CocoTable:
    """The COCO tables of image folders mixed, one after another as their images are (each
    aligned with its folder's objects); the box labels stay each source's own numbers, which the
    workers renumber with the rest (:func:`relabel`)."""
    return CocoTable(NameList(n for t in tables for n in t.names), np.concatenate([t.sizes for t in tables]),
                     _chained([t.offsets for t in tables]), np.concatenate([t.boxes for t in tables]),
                     np.concatenate([t.labels for t in tables]), np.concatenate([t.ann_ids for t in tables]),
                     np.concatenate([t.seg for t in tables]), _chained([t.seg_offsets for t in tables]),
                     _chained([t.poly_offsets for t in tables]), np.concatenate([t.coords for t in tables]),
                     classes, " + ".join(t.source for t in tables))


def part_of(parts: Sequence[SourcePart], sample_ids: np.ndarray) -> np.ndarray:
    """The source (index into ``parts``) of each global sample id of a joined source, int64."""
    firsts = np.cumsum([0] + [p.samples for p in parts])[:-1]
    return np.searchsorted(firsts, np.asarray(sample_ids, dtype=np.int64), side="right") - 1


def per_source(parts: Sequence[SourcePart], sample_ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Valid samples of each source among ``sample_ids`` (int64, one count per part)."""
    return np.bincount(part_of(parts, np.asarray(sample_ids)[np.asarray(valid, dtype=bool)]),
                       minlength=len(parts)).astype(np.int64)


def relabel(parts: Sequence[SourcePart], sample_ids: np.ndarray, labels: np.ndarray,
            keys: Sequence[str] = ()) -> np.ndarray:
    """``labels`` (each source's own numbering; -1: none) renumbered into the joined class list,
    vectorized: one lookup in the sources' tables laid end to end. A label at or above its source's
    class count raises :class:`ShardFormatError` naming the sample and the source."""
    labels = np.asarray(labels, dtype=np.int64)
    if not parts or all(p.relabel is None for p in parts) or not len(labels):
        return labels
    tables = [p.relabel if p.relabel is not None else np.arange(len(p.classes), dtype=np.int64) for p in parts]
    sizes = np.array([len(t) for t in tables], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    k = part_of(parts, sample_ids)
    has = labels >= 0
    bad = np.flatnonzero(has & (labels >= sizes[k]))
    if len(bad):
        i = int(bad[0])
        key = keys[i] if i < len(keys) else f"#{int(sample_ids[i])}"
        raise ShardFormatError(f"sample {key!r}: label {int(labels[i])} is not below the {int(sizes[k[i]])} classes "
                               "its index lists", shard=parts[int(k[i])].url)
    out = labels.copy()
    out[has] = np.concatenate(tables)[offsets[k[has]] + labels[has]]
    return out


FOLDER.hook(join=_joined_objects)
PARQUET.hook(join=_joined_row_groups)
