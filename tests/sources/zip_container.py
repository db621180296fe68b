"""A container from outside gpupipe, in this one module (issue 37): zip archives of images, in class
folders (``<class>/<name>.zip``, each holding ``.png`` / ``.jpg`` members), read in place — each
archive a unit, its image members (in name order) its samples.

What it gives gpupipe: a :class:`~gpupipe.formats.containers.Container` record (how a listing is
recognised, its words, that a unit is read whole) with its table of units (``index.json`` keeps
it under ``"zips"``), and three hooks — ``describe`` (a listing to a manifest), ``unit_urls`` and
``read_spans`` (the stream's reader). Nothing inside gpupipe/ names it. Not given, and so refused
clearly by name: ``unit_crcs`` (``gpupipe index --checksums``), ``join`` (a mix of sources), ingest.
"""
from __future__ import annotations

import io
import posixpath
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import GpupipeError, ShardFormatError
from gpupipe.core.types import ByteRange, Sample
from gpupipe.formats.containers import Container, register_container
from gpupipe.formats.folder import NameList
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.tar import safe_key, sample_fields
from gpupipe.sources import UnitURLs
from gpupipe.stream.readers import ReadSpan

IMAGE_MEMBERS = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True, eq=False)
class ZipTable:
    """The archives: names (relative to the folder), sizes, images in each, labels (class index)."""

    names: tuple[str, ...]
    sizes: np.ndarray
    counts: np.ndarray
    labels: np.ndarray
    crc32: Any = None

    def __len__(self) -> int:
        return len(self.names)

    def sample_counts(self) -> UnitCounts:
        return UnitCounts.of(self.counts)

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def with_crc32(self, crc32: Any) -> ZipTable:
        return replace(self, crc32=crc32)

    def to_dict(self) -> dict:
        return {"names": list(self.names), "sizes": self.sizes.tolist(), "counts": self.counts.tolist(),
                "labels": self.labels.tolist()}

    @classmethod
    def from_dict(cls, doc: dict) -> ZipTable:
        return cls(tuple(doc["names"]), np.array(doc["sizes"], np.int64), np.array(doc["counts"], np.int64),
                   np.array(doc["labels"], np.int64))


def members(archive: zipfile.ZipFile) -> list[str]:
    return sorted(n for n in archive.namelist() if n.lower().endswith(IMAGE_MEMBERS))


def describe(fetcher, folder: str, listing, source, skipped: list) -> Manifest:
    """Every archive's image count (its central directory read), labels from the class folders."""
    names = sorted(p[len(listing.root):].lstrip("/") for p in listing.files if p.endswith(".zip"))
    classes = tuple(sorted({posixpath.dirname(n) for n in names}))
    counts = []
    for n in names:
        try:
            with zipfile.ZipFile(io.BytesIO(fetcher.read(ByteRange(folder + n)))) as z:
                counts.append(len(members(z)))
        except zipfile.BadZipFile as exc:  # described as empty: nothing of it is read
            skipped.append((n, f"not a zip archive: {exc}"))
            counts.append(0)
    sizes = [listing.files[f"{listing.root}/{n}"] for n in names]
    labels = [classes.index(posixpath.dirname(n)) for n in names]
    table = ZipTable(tuple(names), np.array(sizes, np.int64), np.array(counts, np.int64), np.array(labels, np.int64))
    return Manifest(shards=(), classes=classes, table=table)


def read_spans(fetcher, source, spans) -> Iterator[ReadSpan]:
    """Each span's images: its archive read whole, members ``[start, stop)`` of its image list."""
    table: ZipTable = source.manifest.table
    for s in spans:
        url = source.shard_urls[s.shard]
        try:
            data = fetcher.read(ByteRange(url, 0, int(table.sizes[s.shard])))
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = members(z)[s.start:s.stop]
                samples: Sequence[Sample | None] = [
                    Sample(key=safe_key(posixpath.splitext(f"{table.names[s.shard]}/{m}")[0]),
                           fields=sample_fields(z.read(m), int(table.labels[s.shard]), m.rsplit(".", 1)[1].lower()),
                           shard=url, offset=s.start + i) for i, m in enumerate(names)]
            if len(samples) != len(s):
                raise ShardFormatError(f"holds {len(samples)} images of {len(s)} asked for", shard=url)
            yield ReadSpan(list(samples), {})
        except (zipfile.BadZipFile, ShardFormatError, GpupipeError) as exc:
            problem = exc if isinstance(exc, GpupipeError) else ShardFormatError(f"not a zip archive: {exc}", shard=url)
            yield ReadSpan([None] * len(s), {i: problem for i in range(len(s))})


ZIP = register_container(Container(
    "zip", "zip archives", "archive", "archives", ".zip files", reads="whole", rank=15,
    recognise=lambda paths: any(p.endswith(".zip") for p in paths), table=ZipTable, table_key="zips"))
ZIP.hook(describe=describe, unit_urls=lambda folder, table: UnitURLs(folder, NameList(table.names)),
         read_spans=read_spans)
