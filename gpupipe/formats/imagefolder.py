"""The image-folder layout (ImageNet, torchvision ``ImageFolder``): ``root/<class>/<image>``.

:func:`scan_image_folder` turns a recursive listing of ``root`` (``fs.find(root,
detail=True)``) into the image files in sorted order, the class names (sorted; a class's
position is its label) and the files that are not input images, each with the reason. It
reads no file: whether the bytes are an image is checked later, from the header.
"""
from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gpupipe.core.errors import ConfigError
from gpupipe.formats.tar import MAX_MEMBER_BYTES

__all__ = ["IMAGE_EXTENSIONS", "FolderImage", "extension", "scan_image_folder", "no_images_message"]

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif"})


class FolderImage(NamedTuple):
    """An image file: its path, its class (first folder under the root) and its stem (the
    path inside the class folder without the extension, ``/`` → ``_``)."""

    path: str
    class_name: str
    stem: str


def extension(path: str) -> str:
    """The lower-case extension of the last path component ('' without one)."""
    base = posixpath.basename(path)
    return base.rpartition(".")[2].lower() if "." in base else ""


def scan_image_folder(root: str, listing: Mapping[str, Mapping[str, Any]]
                      ) -> tuple[list[FolderImage], tuple[str, ...], list[tuple[str, str]]]:
    """``(images, classes, rejected)`` from ``{path: info}`` of the files under ``root``.

    ``rejected`` lists ``(path, reason)`` for files outside a class folder, hidden files
    and folders, names without an image extension and files over the tar member limit.
    """
    images: list[FolderImage] = []
    rejected: list[tuple[str, str]] = []
    root = root.rstrip("/")
    _refuse_a_parent_of_datasets(root, listing)
    for path in sorted(listing):
        rel = path[len(root):].lstrip("/")
        class_name, _, rest = rel.partition("/")
        reason = _reject(rel, rest, listing[path].get("size"))
        if reason:
            rejected.append((path, reason))
        else:
            images.append(FolderImage(path, class_name, rest.rpartition(".")[0].replace("/", "_")))
    return images, tuple(sorted({im.class_name for im in images})), rejected


def _refuse_a_parent_of_datasets(root: str, listing: Iterable[str]) -> None:
    """A would-be class sub-folder holding tar shards (and no images) or an ``index.json`` is
    a dataset of its own: ``root`` is the folder above datasets (``data/`` with ``shards/``
    and ``images/``), and reading it as classes would mix them — train and val images as two
    classes. A class folder with a stray .tar beside its images stays a class."""
    index, tars, images = set(), set(), set()
    for path in listing:
        top, _, rest = path[len(root):].lstrip("/").partition("/")
        if rest == "index.json":
            index.add(top)
        elif rest.endswith(".tar") and "/" not in rest:
            tars.add(top)
        elif rest and extension(rest) in IMAGE_EXTENSIONS:
            images.add(top)
    datasets = sorted(index | (tars - images))
    if datasets:
        folders = sorted(images - index - tars) or datasets
        raise ConfigError(f"{root}/ holds dataset folders ({', '.join(d + '/' for d in datasets[:3])} with tar shards "
                          f"or an index.json), so read as an image folder its sub-folders "
                          f"({', '.join(sorted(index | tars | images)[:5])}) would be the classes; give one "
                          f"dataset's folder, e.g. {root}/{folders[0]}/")


def no_images_message(src: str, rejected: list[tuple[str, str]]) -> str:
    """Why a folder gave no input images, and what to do: images lying directly in it (no class
    sub-folders), or no image files at all."""
    loose = [p for p, reason in rejected if reason == _OUTSIDE and extension(p) in IMAGE_EXTENSIONS]
    if loose:
        return (f"{src} holds {len(loose)} image file(s) directly (e.g. {posixpath.basename(loose[0])!r}) and no "
                "class sub-folders; ingest reads <src>/<class>/<image>, where the sub-folder's name is the label. "
                "Move each image into a folder named for its class (<src>/cat/1.jpg, <src>/dog/2.jpg; unlabelled "
                "images: all in one folder, e.g. <src>/unlabelled/), or label them in a labels.csv (filename,label) "
                "beside them and read the folder in place (source.train: <src>; gpupipe index <src> --labels FILE)")
    seen = f"; found {len(rejected)} other file(s), e.g. {posixpath.basename(rejected[0][0])!r} ({rejected[0][1]})" \
        if rejected else ""
    return (f"{src} holds no image files in class sub-folders (<src>/<class>/<image>, extensions "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}){seen}")


_OUTSIDE = "not in a class sub-folder (expected <src>/<class>/<image>)"


def _reject(rel: str, rest: str, size: int | None) -> str:
    """Why a listed file is not an input image ('' when it is one)."""
    if not rest:
        return _OUTSIDE
    if any(part.startswith(".") for part in rel.split("/")):
        return "hidden file or folder"
    if extension(rest) not in IMAGE_EXTENSIONS:
        return f"not an image file name (extension not one of {sorted(IMAGE_EXTENSIONS)})"
    if size is not None and size > MAX_MEMBER_BYTES:
        return f"file of {size} bytes is larger than the {MAX_MEMBER_BYTES}-byte member limit"
    return ""
