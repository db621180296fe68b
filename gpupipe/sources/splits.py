"""A dataset's root that holds its splits as folders: ``root/train/``, ``root/val/``, ``root/test/``.

Read as one image folder, such a root would make its splits the classes (``train`` and ``val``:
two classes, every label wrong), as torchvision's ``ImageFolder(root)`` does. A loader of one
split refuses it (:func:`gpupipe.formats.folder.folder_table` names the split folder to give);
``GpuDataModule``, which has a loader per split, reads each split from its folder
(:func:`split_folders`).
"""
from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from gpupipe.formats.folder import SPLIT_FOLDERS, extension
from gpupipe.formats.imageheader import image_extensions
from gpupipe.formats.manifest import MANIFEST_NAME
from gpupipe.storage.fetch import open_filesystem

__all__ = ["split_folders"]

_SPLIT_OF = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
assert set(_SPLIT_OF) == set(SPLIT_FOLDERS)


def split_folders(url: Any, storage_options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``{split: folder URL}`` of the split folders right under ``url`` (``train`` ← ``train/``,
    ``val`` ← ``val/``, ``valid/`` or ``validation/``, ``test`` ← ``test/``), when ``url`` is a
    dataset's root: a folder holding a ``train/`` folder and no data of its own at its top level
    (no index, shards, images or Parquet files). ``{}`` for anything else — a pattern, a list, a
    file, a dataset, a folder that cannot be listed (its loader then says why). One listing of
    the top level."""
    if not isinstance(url, str) or any(ch in url for ch in "*?[{") or \
            url.rstrip("/").endswith((".json", ".tar", ".parquet")):
        return {}
    fs, path = open_filesystem(url, storage_options)
    try:
        entries = fs.ls(path.rstrip("/") or "/", detail=True)
    except (OSError, ValueError):
        return {}
    folders, data = set(), False
    for entry in entries:
        name = posixpath.basename(str(entry["name"]).rstrip("/"))
        if entry.get("type") == "directory":
            folders.add(name)
        elif name == MANIFEST_NAME or extension(name) in (*image_extensions(readable=True), "tar", "parquet"):
            data = True
    if data or "train" not in folders:
        return {}
    out: dict[str, str] = {}
    for name in SPLIT_FOLDERS:  # the first of val/, valid/, validation/ is the val split
        if name in folders:
            out.setdefault(_SPLIT_OF[name], f"{url.rstrip('/')}/{name}/")
    return out
