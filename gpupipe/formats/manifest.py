"""The shard manifest, ``index.json`` beside the shards.

It lists each shard's name (relative to the manifest), sample count, byte size,
SHA-256 and the byte offset where each sample starts (plus the end of the last
sample). With it, a reader knows the whole epoch without listing or scanning:
exact equal splits, and byte-range reads of part of a shard.

Optionally (written by ``gpupipe ingest``, ``gpupipe index`` and the shard writer;
older manifests load without it) ``crc32`` lists each sample's
:func:`~gpupipe.formats.tar.sample_crc32`. A byte-range read cannot check the
whole-shard SHA-256, so the stream checks these instead: a flipped byte or an
object replaced under the manifest is caught per sample, never delivered.

Optionally too (written by ``gpupipe ingest``, ``gpupipe index`` and the shard writer;
older manifests load without it, as "not recorded") ``targets`` lists the target kinds the
data holds (:data:`~gpupipe.core.targets.TARGET_KINDS`: ``boxes`` for samples with a ``.json``
of boxes, ``masks`` for a ``.mask.png``): at the top, the kinds every shard holds, and per
shard the kinds at least one of its samples holds. A source asking for a kind the data
lacks is refused when it is resolved, naming the shards (:func:`held_kinds` decides).

The same file describes sources read in place (version 2, with a ``kind``): an
image folder (``"kind": "folder"``, its objects' names, sizes, labels and
optionally CRC-32s: :class:`~gpupipe.formats.folder.ObjectTable`) or Parquet
files (``"kind": "parquet"``, their row groups' rows and column-chunk byte
ranges: :class:`~gpupipe.formats.rowgroups.RowGroupTable`). To the epoch plan
each is a list of units with sample counts: a shard, an object, a row group.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import ShardFormatError
from gpupipe.core.targetkinds import TARGET_KINDS
from gpupipe.core.types import TarMember
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD
from gpupipe.formats.containers import Container, UnitTable, container, container_of_table
from gpupipe.formats.folder import ObjectTable
from gpupipe.formats.rowgroups import RowGroupTable
from gpupipe.formats.tar import group_by_key, iter_members, sample_crc32

__all__ = ["MANIFEST_NAME", "ShardEntry", "Manifest", "index_shard", "held_kinds", "shard_entry_json", "shard_entry_from_json"]

MANIFEST_NAME = "index.json"
FORMAT = "gpupipe-manifest"
VERSION = 1  # tar shards; written unchanged, so older readers keep reading them
VERSION_IN_PLACE = 2  # adds "kind": a container read in place ("folder", "parquet", a plugin's)


@dataclass(frozen=True, eq=False)
class ShardEntry:
    """One shard: ``offsets`` has ``num_samples + 1`` entries (sample starts, then end of data);
    ``crc32``, when known, one checksum per sample (``None`` for manifests written without);
    ``targets``, when recorded, the target kinds its samples hold (:func:`held_kinds`).

    Offsets are kept as a read-only int64 array: 8 bytes a sample instead of a
    Python int each, and pages that forked DataLoader workers keep sharing.
    """

    name: str
    num_samples: int
    size: int
    sha256: str
    offsets: np.ndarray = field(repr=False)
    crc32: np.ndarray | None = field(default=None, repr=False)
    targets: tuple[str, ...] | None = None

    def __init__(self, name: str, num_samples: int, size: int, sha256: str, offsets: ArrayLike,
                 crc32: ArrayLike | None = None, targets: Iterable[str] | None = None) -> None:
        """``offsets`` and ``crc32``: any integer sequences; the fields hold read-only copies."""
        for attr, value in (("name", name), ("num_samples", num_samples), ("size", size), ("sha256", sha256),
                            ("targets", None if targets is None else _kinds(targets, name))):
            object.__setattr__(self, attr, value)
        offs = np.array(offsets, dtype=np.int64)  # a copy we own, whatever was given
        offs.flags.writeable = False
        object.__setattr__(self, "offsets", offs)
        object.__setattr__(self, "crc32", None)
        if crc32 is not None:
            crcs = np.array(crc32, dtype=np.int64)
            if len(crcs) != self.num_samples or ((crcs < 0) | (crcs >= 1 << 32)).any():
                raise ShardFormatError(f"manifest lists {len(crcs)} crc32 values for {self.num_samples} samples "
                                       "(need one 32-bit value per sample)", shard=self.name)
            crcs = crcs.astype(np.uint32)
            crcs.flags.writeable = False
            object.__setattr__(self, "crc32", crcs)
        if len(offs) != self.num_samples + 1:
            raise ShardFormatError(
                f"manifest lists {len(offs)} offsets for {self.num_samples} samples (need samples + 1)",
                shard=self.name,
            )
        if (np.diff(offs) < 0).any() or (len(offs) and (offs[0] < 0 or offs[-1] > self.size)):
            raise ShardFormatError("manifest offsets are not increasing within the shard size", shard=self.name)

    def __eq__(self, other: object) -> bool:  # (and so no __hash__: entries are compared, not hashed)
        if not isinstance(other, ShardEntry):
            return NotImplemented
        a, b = self.crc32, other.crc32
        same_crc = (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
        return (self.name, self.num_samples, self.size, self.sha256, self.targets) == (
            other.name, other.num_samples, other.size, other.sha256, other.targets) and np.array_equal(
            self.offsets, other.offsets) and same_crc

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Bytes holding samples ``[start, stop)`` of this shard."""
        return int(self.offsets[start]), int(self.offsets[stop])


@dataclass(frozen=True)
class Manifest:
    """Tar ``shards``; or, for a source read in place, its ``table`` of units (a
    :class:`~gpupipe.formats.containers.UnitTable`: an image folder's :class:`ObjectTable`, Parquet's
    :class:`RowGroupTable`, a plugin container's) with ``shards`` empty. The plan's units are the
    shards or the table's rows (:meth:`sample_counts`). ``targets``: the target kinds the data
    holds (``None``: not recorded); for tar shards that record theirs, the kinds every shard with
    samples holds."""

    shards: tuple[ShardEntry, ...]
    classes: tuple[str, ...] = ()
    table: UnitTable | None = None
    targets: tuple[str, ...] | None = None
    prepared: Mapping[str, Any] | None = field(default=None, compare=False)  # what ingest did (e.g. re-encoding)

    def __post_init__(self) -> None:
        if self.table is not None and self.shards:
            raise ShardFormatError("a manifest describes tar shards or a source read in place, not both")
        if self.table is not None:
            container_of_table(self.table)  # a table of no registered container cannot be written or read
        if self.targets is not None:
            object.__setattr__(self, "targets", _kinds(self.targets, MANIFEST_NAME))
        if self.shards and all(s.targets is not None for s in self.shards):  # the shards' records decide
            held = [set(s.targets or ()) for s in self.shards if s.num_samples]
            every = set.intersection(*held) if held else set()
            object.__setattr__(self, "targets", tuple(k for k in TARGET_KINDS if k in every))

    def lacking(self, kind: str) -> list[str]:
        """The shards (tar) that record no sample holding ``kind``; ``[]`` when none, or none recorded."""
        return [s.name for s in self.shards if s.num_samples and s.targets is not None and kind not in s.targets]

    @property
    def container(self) -> Container:
        """The kind of source: tar shards, or the container of the ``table``."""
        return container("tar") if self.table is None else container_of_table(self.table)

    @property
    def kind(self) -> str:
        """The container's name: ``tar``, ``folder``, ``parquet`` or a plugin's."""
        return self.container.name

    @property
    def objects(self) -> ObjectTable | None:
        """An image folder's table (else ``None``)."""
        return self.table if isinstance(self.table, ObjectTable) else None

    @property
    def parquet(self) -> RowGroupTable | None:
        """Parquet's table of row groups (else ``None``)."""
        return self.table if isinstance(self.table, RowGroupTable) else None

    @property
    def num_units(self) -> int:
        """Shards, or the table's units (objects, row groups)."""
        return len(self.shards) if self.table is None else len(self.table)

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards) if self.table is None else self.table.num_samples

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards) if self.table is None else self.table.total_bytes

    def sample_counts(self) -> UnitCounts:
        """Samples per unit, in manifest order: what the epoch plan splits (compact: an image
        folder of 100M objects is one number, not 100M)."""
        if self.table is not None:
            return self.table.sample_counts()
        return UnitCounts.of([s.num_samples for s in self.shards])

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "version": VERSION if self.table is None else VERSION_IN_PLACE,
            "num_samples": self.num_samples,
            "classes": list(self.classes),
        }
        if self.targets is not None:
            doc["targets"] = list(self.targets)
        if self.prepared:
            doc["prepared"] = dict(self.prepared)
        if self.table is not None:
            c = self.container
            doc.update({"kind": c.name, str(c.table_key): self.table.to_dict()})
        else:
            doc["shards"] = [shard_entry_json(s) for s in self.shards]
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate a manifest; any defect raises ``ShardFormatError`` naming ``source``."""
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT or doc.get("version") not in (VERSION, VERSION_IN_PLACE):
                raise ValueError(f"not a {FORMAT} v{VERSION} or v{VERSION_IN_PLACE} file (format={doc.get('format')!r}, "
                                 f"version={doc.get('version')!r}); a newer gpupipe wrote it, or rerun `gpupipe index`")
            kind = container(doc.get("kind", "tar"))  # an unknown kind: ValueError naming the known
            targets = _kinds(doc["targets"], source) if "targets" in doc else None
            if kind.table is not None:
                return cls(shards=(), classes=tuple(str(c) for c in doc.get("classes", [])),
                           table=kind.table.from_dict(doc[kind.table_key]), targets=targets)
            shards = tuple(shard_entry_from_json(s) for s in doc["shards"])
            classes = tuple(str(c) for c in doc.get("classes", []))
        except ShardFormatError as exc:
            raise ShardFormatError(f"bad manifest entry: {exc}", shard=source) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ShardFormatError(f"not a valid manifest: {exc}", shard=source) from None
        for s in shards:
            if "/" in s.name and ".." in s.name.split("/") or s.name.startswith("/"):
                raise ShardFormatError(f"shard name {s.name!r} escapes the manifest's folder", shard=source)
        prepared = doc.get("prepared")
        return cls(shards=shards, classes=classes, targets=targets, prepared=prepared if isinstance(prepared, dict) else None)


def _kinds(value, where: str) -> tuple[str, ...]:
    """A recorded list of target kinds, checked (an unknown kind: written by a newer gpupipe)."""
    if isinstance(value, str) or not all(isinstance(k, str) for k in value):
        raise ShardFormatError(f"targets should be a list of target kinds, got {value!r}", shard=where)
    unknown = sorted(set(value) - set(TARGET_KINDS))
    if unknown:
        raise ShardFormatError(f"unknown target kinds {unknown} (known: {', '.join(TARGET_KINDS)}); a newer gpupipe "
                               "wrote it, or rerun `gpupipe index`", shard=where)
    return tuple(k for k in TARGET_KINDS if k in value)


def held_kinds(fields: Mapping[str, bytes]) -> set[str]:
    """The target kinds a sample's members hold: ``masks`` for a ``.mask.png``; ``boxes`` for a
    ``.json`` unless it is a JSON object without ``"boxes"`` (other metadata, e.g. a caption).
    A ``.json`` that does not parse counts: it is a damaged annotation, reported when read."""
    held = set()
    if MASK_FIELD in fields:
        held.add("masks")
    data = fields.get(BOXES_FIELD)
    if data is not None:
        try:
            doc = json.loads(bytes(data))
        except (UnicodeDecodeError, ValueError):
            doc = None
        if not isinstance(doc, dict) or "boxes" in doc:
            held.add("boxes")
    return held


def shard_entry_from_json(s: Mapping[str, Any]) -> ShardEntry:
    """A shard's entry from its JSON object (``ValueError``, ``KeyError`` or ``ShardFormatError`` when it is not one)."""
    return ShardEntry(name=str(s["name"]), num_samples=int(s["num_samples"]), size=int(s["size"]),
                      sha256=str(s["sha256"]), offsets=_int_array(s["offsets"]),
                      crc32=_int_array(s["crc32"], "crc32") if "crc32" in s else None,
                      targets=_kinds(s["targets"], str(s["name"])) if "targets" in s else None)


def shard_entry_json(s: ShardEntry) -> dict:
    """The JSON object of a shard's entry in ``index.json`` (what :func:`shard_entry_from_json` reads)."""
    doc = {"name": s.name, "num_samples": s.num_samples, "size": s.size, "sha256": s.sha256,
           "offsets": s.offsets.tolist()}
    if s.crc32 is not None:
        doc["crc32"] = s.crc32.tolist()
    if s.targets is not None:
        doc["targets"] = list(s.targets)
    return doc


def _int_array(values, what: str = "offsets") -> np.ndarray:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError(f"{what} must be a list of integers")
    return np.array(values, dtype=np.int64)


def index_shard(name: str, chunks: Iterable[bytes]) -> ShardEntry:
    """Scan a whole shard (given as byte chunks) and describe it for the manifest."""
    digest = hashlib.sha256()
    size = 0
    source = iter(chunks)

    def hashed() -> Iterator[bytes]:
        nonlocal size
        for chunk in source:
            digest.update(chunk)
            size += len(chunk)
            yield chunk

    last_end = 0

    def tracked(members: Iterable[TarMember]) -> Iterator[TarMember]:
        nonlocal last_end
        for m in members:
            last_end = m.end
            yield m

    offsets, crcs = [], []
    held: set[str] = set()
    for s in group_by_key(tracked(iter_members(hashed(), shard=name)), shard=name):
        offsets.append(s.offset)
        crcs.append(sample_crc32(s.key, s.fields))
        held |= held_kinds(s.fields)
    for _ in hashed():  # bytes after the end-of-archive marker still count in size and checksum
        pass
    return ShardEntry(name=name, num_samples=len(offsets), size=size, sha256=digest.hexdigest(),
                      offsets=tuple(offsets) + (last_end if offsets else 0,), crc32=crcs, targets=held)
