"""What a source is and what it resolves to: :class:`Source` (a data location and how to read
it), :class:`ResolvedSource` (its units and the manifest describing them) and :class:`UnitURLs`.
The values :mod:`gpupipe.sources.source` makes and :mod:`gpupipe.sources.annotated` reads, kept
below both (``gpupipe.sources.source`` names them too)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupipe.core.errors import ConfigError
from gpupipe.core.targetkinds import target_kinds
from gpupipe.core.types import StringTable
from gpupipe.formats.coco import CocoTable
from gpupipe.formats.folder import NameList
from gpupipe.formats.manifest import Manifest
from gpupipe.storage.identity import ObjectVersion

__all__ = ["Source", "ResolvedSource", "UnitURLs", "SourcePart"]


@dataclass(frozen=True)
class Source:
    """A data location and its storage options (which never appear in ``repr``).

    For sources read in place: ``image_column`` / ``label_column`` name the Parquet
    columns (default: detected), ``labels`` the mapping file of a flat image folder
    (default: ``labels.csv`` or ``labels.json`` in it), ``classes`` the class list that
    numbers class names (default: the names found, sorted — give the training split's
    list to a split that may lack a class). An ``index.json`` written with them by
    ``gpupipe index`` remembers them.

    ``targets``: the annotation kinds a sample brings beside its image (``("boxes",)``,
    ``("masks",)``, both, or ``()`` for classification: :func:`~gpupipe.core.targets.target_kinds`);
    their layout at rest is :mod:`gpupipe.formats.annotations`'. ``annotations``: a COCO
    ``instances_*.json`` holding an image folder's boxes (default: found beside it, see
    :func:`resolve`).
    """

    url: str | tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    image_column: str | None = None
    label_column: str | None = None
    labels: str | None = None
    classes: tuple[str, ...] | None = None
    targets: tuple[str, ...] = ()
    annotations: str | None = None

    def __init__(self, url: str | Sequence[str], storage_options: Mapping[str, Any] | None = None,
                 image_column: str | None = None, label_column: str | None = None, labels: str | None = None,
                 classes: Sequence[str] | None = None, targets: str | Sequence[str] | None = None,
                 annotations: str | None = None) -> None:
        """A list of URLs (or of class names) is kept as a tuple."""
        fields = {"url": url if isinstance(url, str) else tuple(url),
                  "storage_options": {} if storage_options is None else storage_options,
                  "image_column": image_column, "label_column": label_column, "labels": labels,
                  "classes": None if classes is None else tuple(classes),
                  "targets": target_kinds(targets), "annotations": annotations}
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        if not self.url:
            raise ConfigError("source.url: empty; give a folder, a pattern or a list of shard URLs")


class UnitURLs(StringTable):
    """The URL of each unit of a source read in place, made on demand from the root and
    the names in its manifest: object ``i``, or the file of row group ``i``."""

    def __init__(self, root: str, names: NameList, file_of: np.ndarray | None = None):
        self.root, self._names, self._file_of = root.rstrip("/") + "/", names, file_of

    def __len__(self) -> int:
        return len(self._names) if self._file_of is None else len(self._file_of)

    def _at(self, i: int) -> str:
        return self.root + self._names[i if self._file_of is None else int(self._file_of[i])]

    def __eq__(self, other: object) -> bool:  # (and so no __hash__: Python sets it to None)
        return isinstance(other, UnitURLs) and list(self) == list(other)


@dataclass(frozen=True)
class SourcePart:
    """One source of a mix inside the :class:`ResolvedSource` that joins them: its URL (for
    messages and stats), its units and samples (consecutive in the joined manifest, after those of
    the sources before it), its own class list, and ``relabel``: its label ``i`` is label
    ``relabel[i]`` of the joined class list (int64; ``None``: the same numbering)."""

    url: str
    units: int
    samples: int
    classes: tuple[str, ...] = ()
    relabel: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class ResolvedSource:
    """The URL of each unit (a tar shard, an object, a Parquet row group's file) and the
    manifest describing them in the same order (``None``: tar shards without one);
    ``delta_version``: the Delta table version they are the files of; ``skipped``: for an
    image folder described from its listing, ``(path, why)`` of each file not read as an
    image (empty when an index described it); ``identity``: the version tag of what described
    the units — the index (its storage identity), or a digest of the listing made at start
    — which vouches for units the manifest has no checksum of (``""``: none; those units
    are then never cached). ``targets``: the target kinds every sample must bring
    (``Source.targets``, checked against what the manifest records); ``annotations``: for an
    image folder read with a COCO file, its objects, row ``i`` for object ``i``
    (:class:`~gpupipe.formats.coco.CocoTable`: numpy arrays, which pickle compactly into
    DataLoader workers). ``parts``: for several sources mixed into one (:mod:`gpupipe.sources.mixed`),
    each one's units, samples and relabelling, in unit order (``()``: one source)."""

    shard_urls: Sequence[str]
    manifest: Manifest | None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    delta_version: int | None = None
    skipped: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    identity: str = field(default="", repr=False, compare=False)
    targets: tuple[str, ...] = ()
    annotations: CocoTable | None = field(default=None, repr=False, compare=False)
    parts: tuple[SourcePart, ...] = field(default=(), repr=False, compare=False)

    @property
    def num_samples(self) -> int | None:
        return None if self.manifest is None else self.manifest.num_samples

    @property
    def kind(self) -> str:
        """The container's name: ``tar``, ``folder``, ``parquet`` or a plugin's."""
        return "tar" if self.manifest is None else self.manifest.kind

    def unit_version(self, i: int) -> ObjectVersion:
        """What the bytes of unit ``i`` are known by in the block cache: a tar shard's SHA-256
        and size, an object's or row group's CRC-32 (``gpupipe index --checksums``), else
        :attr:`identity` — re-indexing, or any change to a folder listed at start, makes it
        new. An empty tag: not cached. A row group has no size: its column chunks are always
        read as the same ranges, and cached as such. Without a manifest (whole shards): an
        empty version, which a whole read completes with the storage's identity."""
        m, vouched = self.manifest, f"described:{self.identity}" if self.identity else ""
        if m is None:
            return ObjectVersion()
        if m.table is not None:  # a container read in place: its own rule, else what described it vouches
            rule = m.container.hooks.get("unit_version")
            return ObjectVersion(vouched) if rule is None else rule(m.table, i, vouched)
        entry = m.shards[i]
        return ObjectVersion(f"sha256:{entry.sha256}" if entry.sha256 else vouched, entry.size)
