"""Containers: the ways data lies at rest as *units* of samples — tar shards, an image folder, Parquet
row groups — and one record of each that every layer reads instead of switching on a name.

A :class:`Container` says what the rooms above need to know of a kind of source: its name (the
``kind`` of an ``index.json``), the words for it and its units in messages, how a folder listing is
recognised as one, how the plan may cut its units (``reads``), and the table of units an
``index.json`` holds for it (``table``: a :class:`UnitTable`). Behaviour that lives in higher rooms
(describing a listing, reading spans in the stream, reading samples for ``gpupipe validate`` or
``ingest``) is registered there on the same record, under a name (:meth:`Container.hook`): the
built-in containers' where each is written, a plugin's in its one module (``register_container``,
then ``hook``). A room asks for a hook by name and says clearly when a container lacks it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import ConfigError

__all__ = ["Container", "UnitTable", "HOOKS", "register_container", "unregister_container", "container", "containers", "container_of_table",
           "recognised", "READS"]

READS = ("ranges", "objects", "whole")
"""How the plan may cut a container's units: ``ranges`` — any run of a unit's samples is read alone
(a tar shard's byte range: blocks); ``objects`` — every unit is one sample (an image per object);
``whole`` — a unit is read whole (a Parquet row group is decoded whole)."""


HOOKS = {
    "describe": "(fetcher, folder URL, FolderListing, Source, skipped list) -> Manifest: a listing described "
                "(append (path, why) of each file not read to skipped)  [sources]",
    "unit_urls": "(folder URL, table) -> Sequence[str]: the URL of each unit  [sources]",
    "unit_version": "(table, unit, vouched tag) -> ObjectVersion: what the block cache knows a unit by "
                    "(default: the tag of what described it)  [sources]",
    "unit_crcs": "(fetcher, table, unit URLs, range of units, tick) -> list[int]: CRC-32 of each, for "
                 "`gpupipe index --checksums`  [sources]",
    "join": "(tables) -> table: several sources' tables as one, for a mix  [sources]",
    "read_spans": "(fetcher, ResolvedSource, iterable of Span) -> iterator of ReadSpan, one a span, in "
                  "order: the stream's reader (and ingest's, validate's by default)  [stream]",
    "read_unit": "tar: a unit's samples of local files from one read (or None: read span by span)  [stream]",
    "scan_unit": "tar: a unit's fetched spans scanned together  [stream]",
    "settle_span": "tar: a fetched span read as samples when the scan gave up  [stream]",
    "validate_read": "(fetcher, ResolvedSource, range of units) -> iterator of Good | Problem  [tools]",
}
"""The behaviour a room above asks a container for, by name (the room in brackets). A container read
in place needs ``describe``, ``unit_urls`` and ``read_spans``; the rest are optional, and a room that
needs one a container lacks says so (:meth:`Container.needs`)."""


@runtime_checkable
class UnitTable(Protocol):
    """What an ``index.json`` holds of a container read in place, one row per unit."""

    @property
    def crc32(self) -> Any: ...  # one CRC-32 per unit when indexed with checksums, else None

    def __len__(self) -> int: ...

    def sample_counts(self) -> UnitCounts: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...

    def with_crc32(self, crc32: Any) -> Any: ...  # the table with these CRC-32s

    def to_dict(self) -> dict: ...


@dataclass
class Container:
    """One kind of source. ``table`` (the class of its :class:`UnitTable`, with a ``from_dict``)
    and ``table_key`` (its key in ``index.json``) are for containers read in place; tar shards
    have their own entries (``None``). ``recognise(paths)`` says whether a listing's files (paths
    relative to the folder) are this container; ``rank`` orders the checks (lower first: tar
    shards at the top of a folder win over images beside them). ``units_per_task``: units in one
    task of ``gpupipe index`` / ``validate`` on an engine."""

    name: str
    title: str  # "image folder"
    unit: str  # "image"
    units: str  # "images"
    listed: str  # what a listing of it shows: "images", ".parquet files"
    reads: str  # one of READS
    rank: int = 100
    recognise: Callable[[Sequence[str]], bool] | None = None
    table: Any = None  # the class of its UnitTable (with a from_dict classmethod)
    table_key: str | None = None
    units_per_task: int = 1
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.reads not in READS:
            raise ValueError(f"container {self.name!r}: reads must be one of {READS}, got {self.reads!r}")
        if (self.table is None) != (self.table_key is None):
            raise ValueError(f"container {self.name!r}: give table and table_key together")

    @property
    def in_place(self) -> bool:
        """Read where it lies, described by a listing (tar shards have an index of their own)."""
        return self.table is not None

    def hook(self, **fns: Callable[..., Any]) -> Container:
        """Register behaviour of a higher room under these names (:data:`HOOKS`, e.g. ``read_spans=...``)."""
        unknown = sorted(set(fns) - set(HOOKS))
        if unknown:
            raise ValueError(f"container {self.name!r}: unknown hook(s) {unknown} (known: {', '.join(HOOKS)})")
        self.hooks.update(fns)
        return self

    def needs(self, name: str, what: str) -> Callable[..., Any]:
        """The hook ``name``; a ``ConfigError`` saying that ``what`` cannot be done when it is missing."""
        fn = self.hooks.get(name)
        if fn is None:
            raise ConfigError(f"{what}: the {self.title} container ({self.name!r}) does not support it "
                              f"(no {name!r} registered for it)")
        return fn


_REGISTRY: dict[str, Container] = {}  # the built-ins register where each is written (imported by the package)
_BY_TABLE: dict[type, Container] = {}  # container_of_table's answers, dropped when the registry changes


def register_container(c: Container) -> Container:
    """Add ``c`` (a name already registered is replaced: a plugin may override a built-in)."""
    _REGISTRY[c.name] = c
    _BY_TABLE.clear()
    return c


def unregister_container(name: str) -> None:
    """Remove the container called ``name`` (a plugin's, when it is done with)."""
    _REGISTRY.pop(name, None)
    _BY_TABLE.clear()


def container(name: str) -> Container:
    """The container called ``name``; a ``ValueError`` naming the known ones otherwise."""
    c = _REGISTRY.get(name)
    if c is None:
        raise ValueError(f"unknown kind of source {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    return c


def containers() -> tuple[Container, ...]:
    """Every registered container, in the order listings are recognised (``rank``, then name)."""
    return tuple(sorted(_REGISTRY.values(), key=lambda c: (c.rank, c.name)))


def container_of_table(table: Any) -> Container:
    """The container whose ``table`` class ``table`` is (asked once per span by the readers: kept
    by type)."""
    found = _BY_TABLE.get(type(table))
    if found is None:
        found = next((c for c in _REGISTRY.values() if c.table is not None and isinstance(table, c.table)), None)
        if found is None:
            raise ValueError(f"no container registered for a table of type {type(table).__name__}")
        _BY_TABLE[type(table)] = found
    return found


def recognised(paths: Sequence[str]) -> Container | None:
    """The first container (by ``rank``) that ``paths`` (a listing's files, relative) are."""
    for c in containers():
        if c.recognise is not None and c.recognise(paths):
            return c
    return None
