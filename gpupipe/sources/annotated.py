"""What a source needs to read targets (``Source.targets``): the check of the kinds against what an
``index.json`` records, and for sources read in place, where the boxes and masks are — the
``boxes`` / ``box_labels`` / ``mask`` columns of Parquet files, or the COCO file of an image
folder (:func:`annotations_file`: named, inside the folder, or COCO's own ``annotations/``
beside it). :func:`~gpupipe.sources.source.resolve` calls these.
"""
from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.formats.coco import parse_coco
from gpupipe.formats.folder import ObjectTable
from gpupipe.formats.manifest import MANIFEST_NAME
from gpupipe.formats.rowgroups import with_target_columns
from gpupipe.sources.resolved import ResolvedSource, Source
from gpupipe.storage.fetch import Fetcher
from gpupipe.storage.objects import read_whole, with_protocol

__all__ = ["check_targets", "with_targets", "annotations_file", "first_url"]


def first_url(url: str | Sequence[str]) -> str:
    return url if isinstance(url, str) else url[0]


def check_targets(resolved: ResolvedSource, source: Source) -> None:
    """Refuse target kinds the manifest records the data lacks (an old index records none: the
    samples are checked as they are read)."""
    m = resolved.manifest
    if m is None or m.targets is None:
        return
    for kind in source.targets:
        if kind in m.targets:
            continue
        lacking = m.lacking(kind)
        where = (f"shard(s) {', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''} ({len(lacking)} of "
                 f"{len(m.shards)}) under {first_url(source.url)}") if lacking else first_url(source.url)
        member = {"boxes": ".json boxes", "masks": ".mask.png masks"}[kind]
        raise ConfigError(f"source.targets: {kind!r} asked for, but its {MANIFEST_NAME} records no {member} in "
                          f"{where}. Drop {kind!r} from targets, or point at data that has them (rerun "
                          "`gpupipe index` if they were added since)")


def with_targets(fetcher: Fetcher, resolved: ResolvedSource, source: Source, root: str | None) -> ResolvedSource:
    """``resolved`` reading the target kinds ``source`` asks for (see
    :func:`~gpupipe.sources.source.resolve`); ``root``: the folder of a source read in place."""
    m = resolved.manifest
    if not source.targets or m is None:
        return replace(resolved, targets=source.targets)
    if m.parquet is not None:
        assert root is not None, "a Parquet source names its units from a root"
        table = with_target_columns(m.parquet, source.targets, root)
        return replace(resolved, manifest=replace(m, table=table), targets=source.targets)
    if m.objects is None:
        return replace(resolved, targets=source.targets)
    assert root is not None, "an image folder names its units from a root"
    folder = root
    url, data = annotations_file(fetcher, folder, source)
    coco = parse_coco(data, url, source.classes).aligned(list(m.objects.names), folder)
    t = m.objects
    objects = ObjectTable(t.names, t.sizes, np.full(len(t), -1, dtype=np.int64), t.crc32, t.with_extension)
    return replace(resolved, manifest=replace(m, table=objects, classes=coco.classes), targets=source.targets,
                   annotations=coco)


def annotations_file(fetcher: Fetcher, folder: str, source: Source) -> tuple[str, bytes]:
    """The URL and bytes of the COCO file of image folder ``folder`` (see :func:`resolve`)."""
    if source.annotations is not None:
        got = read_whole(fetcher, source.annotations)
        if got is None:
            raise ConfigError(f"source.annotations: {source.annotations} does not exist; give the COCO "
                              "instances_*.json of the images in " + folder)
        return source.annotations, got[0]
    protocol = folder.split("://", 1)[0] + "://" if "://" in folder else ""
    try:
        listed = fetcher.call(folder + "instances_*.json", "glob")
    except (StorageError, NotImplementedError):  # storage that cannot list (http): the file beside, or named
        listed = []
    inside = sorted(with_protocol(protocol, p) for p in listed)
    if len(inside) > 1:
        raise ConfigError(f"source.annotations: {folder} holds {len(inside)} COCO files ({', '.join(inside[:3])}); "
                          "name the one to read with annotations: (Source(annotations=...))")
    parent, name = posixpath.split(folder.rstrip("/"))
    beside = f"{parent}/annotations/instances_{name}.json"
    for url in inside or [beside]:
        got = read_whole(fetcher, url)
        if got is not None:
            return url, got[0]
    raise ConfigError(f"source.annotations: no COCO annotations for {folder} (source.targets asks for "
                      f"{'+'.join(source.targets)}): looked for {folder}instances_*.json and {beside}; name the file "
                      "with annotations: in YAML (Source(annotations=...))")
