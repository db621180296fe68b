"""The image-folder format: one object per sample, listed once -- the one reader of image
folders, for ``gpupipe ingest`` and for reading in place alike.

Two layouts, told apart by where the images sit under the root:

* **class sub-folders** (ImageNet, torchvision ``ImageFolder``): ``root/<class>/<image>``;
  classes sorted by name give the label index (or a given class list does);
* **flat**: ``root/<image>``, labels from a mapping file — ``labels.csv`` or
  ``labels.json`` in the root, or one named explicitly. CSV: a header row with a file
  column (``file``, ``filename``, ``path``, ``image``, ``name`` or ``id``) and a label
  column (``label``, ``class``, ``cls`` or ``target``). JSON: ``{"<file>": label}`` or a
  list of ``{"file": ..., "label": ...}``. A file is matched by its name relative to the
  root, or by that name without its extension. Integer labels are kept (-1: no label);
  string labels become their index among the sorted names. Every image needs a label
  in the mapping file; a flat folder without one is unlabelled (every label -1, with a
  warning).

Images at both levels are refused. An image is a file whose extension (any case) is one of
:func:`~gpupipe.formats.imageheader.image_extensions`, not hidden (no path component starting with ``.``) and at most
``MAX_MEMBER_BYTES``; every other file is left out and reported, with the reason
(``index.json``, ``classes.txt`` and the labels file excepted). Files are taken in sorted
order. A sample's key is the image's path under the root without its extension
(:func:`object_key`: ``cat/x.jpg`` → ``cat/x``), the key a WebDataset tar gives the same
file, so that a key names one sample before and after ``gpupipe ingest``; two images of one
folder whose names differ only in their extension (``star.gif``, ``star.png``: two samples
to torchvision's ``ImageFolder``) keep it in their keys, tar-safe (``cat/star_gif``,
``cat/star_png``: :func:`object_keys`), in ingest and in place alike. Names that give one
key even so are refused.

An :class:`ObjectTable` holds the listing compactly — names as one UTF-8 blob plus
offsets, sizes and labels as int64 arrays — so a million objects cost tens of
megabytes, pickle fast into DataLoader workers and are shared by forked ones.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.core.types import Sample, StringTable
from gpupipe.formats.containers import Container, recognised, register_container
from gpupipe.formats.imageheader import field_name, image_extensions
from gpupipe.formats.tar import MAX_MEMBER_BYTES, safe_key, sample_fields

__all__ = ["LABEL_FILES", "SPLIT_FOLDERS", "NameList", "ObjectTable", "FolderListing", "extension",
           "classify_listing", "parse_label_file", "class_numbering", "label_problem", "folder_table", "object_key",
           "object_keys", "object_sample"]

log = logging.getLogger(__name__)

LABEL_FILES = ("labels.csv", "labels.json")
# folder names of a dataset's splits under its root, in the order the splits are named in messages
SPLIT_FOLDERS = ("train", "val", "valid", "validation", "test")
_FILE_COLUMNS = ("file", "filename", "path", "image", "name", "id")
_LABEL_COLUMNS = ("label", "class", "cls", "target")
_EXPECTED = frozenset({"index.json", "classes.txt", *LABEL_FILES})  # never reported as skipped


def extension(path: str) -> str:
    """The lower-case extension of the last path component ('' without one)."""
    base = posixpath.basename(path)
    return base.rpartition(".")[2].lower() if "." in base else ""


class NameList(StringTable):
    """Strings kept as one UTF-8 blob and int64 offsets: no Python object per name."""

    def __init__(self, names: Iterable[str] = ()):
        encoded = [n.encode("utf-8") for n in names]
        self._blob = b"".join(encoded)
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._offsets[1:])

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _at(self, i: int) -> str:
        return self._blob[self._offsets[i]:self._offsets[i + 1]].decode("utf-8")

    def packed(self) -> tuple[bytes, np.ndarray]:
        """The names as stored: one UTF-8 blob and the int64 offsets that cut it (for a digest)."""
        return self._blob, self._offsets

    def __eq__(self, other: object) -> bool:  # (and so no __hash__: Python sets it to None)
        return isinstance(other, NameList) and self._blob == other._blob and np.array_equal(
            self._offsets, other._offsets)


def read_only(values, dtype=np.int64) -> np.ndarray:
    """A read-only copy of ``values``: the columns of a table that DataLoader workers share."""
    out = np.array(values, dtype=dtype)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)
class ObjectTable:
    """The objects of a folder source, sorted by name: ``names`` relative to the root,
    ``sizes`` in bytes, ``labels`` (-1: none) and, when indexed with checksums, the
    CRC-32 of each object's bytes."""

    names: NameList
    sizes: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    crc32: np.ndarray | None = field(default=None, repr=False)
    # the (sorted) objects whose key keeps the extension (:func:`object_keys`): almost always none
    with_extension: np.ndarray = field(default_factory=lambda: read_only([]), repr=False)

    def __init__(self, names: NameList, sizes: ArrayLike, labels: ArrayLike, crc32: ArrayLike | None = None,
                 with_extension: ArrayLike = ()) -> None:
        """Any integer sequences in; the fields hold read-only int64 copies of them."""
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "sizes", read_only(sizes, np.int64))
        object.__setattr__(self, "labels", read_only(labels, np.int64))
        object.__setattr__(self, "crc32", None if crc32 is None else read_only(crc32, np.int64))
        object.__setattr__(self, "with_extension", read_only(np.sort(np.asarray(with_extension, np.int64)), np.int64))
        self._check()

    def key(self, i: int) -> str:
        """The sample key of object ``i`` (:func:`object_keys`)."""
        ext = self.with_extension
        keep = len(ext) > 0 and bool(ext[min(int(np.searchsorted(ext, i)), len(ext) - 1)] == i)
        return object_key(self.names[i], keep_extension=keep)

    def _check(self) -> None:
        n = len(self.names)
        if len(self.sizes) != n or len(self.labels) != n or (self.crc32 is not None and len(self.crc32) != n):
            raise ShardFormatError(f"object table lists {n} names but {len(self.sizes)} sizes, {len(self.labels)} "
                                   f"labels{'' if self.crc32 is None else f' and {len(self.crc32)} crc32 values'}")
        if n and (self.sizes.min() < 0 or self.sizes.max() > MAX_MEMBER_BYTES):
            raise ShardFormatError(f"object sizes must be in [0, {MAX_MEMBER_BYTES}]")
        for i in range(n):  # names come from a file anyone could edit: none may leave the folder
            name = self.names[i]
            if not name or name.startswith("/") or ".." in name.split("/") or "://" in name:
                raise ShardFormatError(f"object name {name!r} escapes the folder")

    def __len__(self) -> int:
        return len(self.names)

    def sample_counts(self) -> UnitCounts:
        return UnitCounts.uniform(1, len(self.names))

    @property
    def num_samples(self) -> int:
        return len(self.names)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def with_crc32(self, crc32: Any) -> ObjectTable:
        return replace(self, crc32=crc32)

    def __eq__(self, other: object) -> bool:  # (and so no __hash__: Python sets it to None)
        if not isinstance(other, ObjectTable):
            return NotImplemented
        a, b = self.crc32, other.crc32
        same_crc = (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
        return self.names == other.names and np.array_equal(self.sizes, other.sizes) and np.array_equal(
            self.labels, other.labels) and same_crc and np.array_equal(self.with_extension, other.with_extension)

    def to_dict(self) -> dict:
        doc = {"names": list(self.names), "sizes": self.sizes.tolist(), "labels": self.labels.tolist()}
        if self.crc32 is not None:
            doc["crc32"] = self.crc32.tolist()
        if len(self.with_extension):
            doc["keyed_with_extension"] = self.with_extension.tolist()
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping) -> ObjectTable:
        names = doc["names"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("objects.names must be a list of strings")
        return cls(NameList(names), _ints(doc["sizes"], "sizes"), _ints(doc["labels"], "labels"),
                   _ints(doc["crc32"], "crc32") if "crc32" in doc else None,
                   _ints(doc.get("keyed_with_extension", []), "keyed_with_extension"))


def _ints(values, what: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError(f"objects.{what} must be a list of integers")
    return values


@dataclass(frozen=True)
class FolderListing:
    """What a folder listing holds: ``kind`` is ``tar``, ``parquet``, ``folder`` or
    ``empty``; ``files`` maps each path under the root to its size."""

    kind: str
    root: str
    files: Mapping[str, int]


def classify_listing(root: str, listing: Mapping[str, Mapping[str, Any]]) -> FolderListing:
    """Which source a recursive listing ``{path: info}`` under ``root`` is: the first container
    (:func:`~gpupipe.formats.containers.recognised`, by rank) its files are — tar shards at the
    top level win, then images, then Parquet files — or ``empty``."""
    root = root.rstrip("/")
    files = {p: int(info.get("size") or 0) for p, info in listing.items() if info.get("type", "file") != "directory"}
    found = recognised([p[len(root):].lstrip("/") for p in files])
    return FolderListing(found.name if found is not None else "empty", root, files)


def _holds_images(paths: Sequence[str]) -> bool:
    readable = image_extensions(readable=True)
    return any(extension(r) in readable for r in paths)


FOLDER = register_container(Container(
    "folder", "image folder", "image", "images", "images", reads="objects", rank=10, recognise=_holds_images,
    table=ObjectTable, table_key="objects", units_per_task=1000))


def parse_label_file(data: bytes, name: str) -> dict[str, int | str]:
    """``{file: label}`` from the bytes of a CSV or JSON mapping file called ``name``."""
    try:
        text = data.decode("utf-8-sig")
        pairs = _json_pairs(json.loads(text)) if name.lower().endswith(".json") else _csv_pairs(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"source.labels: {name} is not a label mapping: {exc}") from None
    out: dict[str, int | str] = {}
    for file, label in pairs:
        if isinstance(label, bool) or not isinstance(label, (int, str)) or not isinstance(file, str):
            raise ConfigError(f"source.labels: {name}: label of {file!r} is {label!r}; give an integer or a name")
        out[file] = label
    return out


def _json_pairs(doc) -> Iterator[tuple[Any, Any]]:
    if isinstance(doc, dict):
        yield from doc.items()
    elif isinstance(doc, list) and all(isinstance(d, dict) for d in doc):
        for d in doc:
            fcol, lcol = _pick(list(d), _FILE_COLUMNS, "file"), _pick(list(d), _LABEL_COLUMNS, "label")
            yield d[fcol], d[lcol]
    else:
        raise ValueError('expected {"<file>": label} or a list of {"file": ..., "label": ...}')


def _csv_pairs(text: str) -> Iterator[tuple[str, int | str]]:
    rows = csv.reader(io.StringIO(text))
    header = [h.strip().lower() for h in next(rows, [])]
    fi, li = header.index(_pick(header, _FILE_COLUMNS, "file")), header.index(_pick(header, _LABEL_COLUMNS, "label"))
    for n, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) <= max(fi, li):
            raise ValueError(f"line {n} has {len(row)} fields")
        label = row[li].strip()
        yield row[fi].strip(), int(label) if label.lstrip("-").isdigit() else label


def _pick(names: Sequence[str], wanted: Sequence[str], what: str) -> str:
    found = next((w for w in wanted if w in names), None)
    if found is None:
        raise ValueError(f"no {what} column (looked for {list(wanted)}; it has {list(names)})")
    return found


def class_numbering(found: Iterable[str], given: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The class list that numbers the labels: ``given`` (e.g. the training split's, so
    that a split lacking a class numbers the others the same), or the sorted names found.
    A name found but not given raises ``ConfigError`` (its label would mean nothing)."""
    found = set(found)
    if given is None:
        return tuple(sorted(found))
    unknown = sorted(found - set(given))
    if unknown:
        shown = ", ".join(given[:8]) + (", ..." if len(given) > 8 else "")
        raise ConfigError(f"classes: {where} has class(es) {unknown[:5]} that the class list ({len(given)} classes "
                          f"[{shown}]) does not name; add them to it (classes= in Python, source.classes in YAML, "
                          "ingest --classes), or leave "
                          "them out of the data")
    return tuple(given)


def label_problem(label: int, classes: Sequence[str]) -> str:
    """Why integer ``label`` numbers no class ('' when it is usable): -1 means "no label"
    (Hugging Face's convention too); any other negative number does not, nor one past the
    class list when there is one."""
    if label == -1 or (label >= 0 and (not classes or label < len(classes))):
        return ""
    upper = f"0 to {len(classes) - 1}" if classes else "0 or more"
    return f"label {label} is not a class number ({upper}, or -1 for none)"


def object_key(name: str, keep_extension: bool = False) -> str:
    """The sample key of image ``name`` (its path under the root): the path without its
    extension, tar-safe (:func:`~gpupipe.formats.tar.safe_key`: ``c0/img.1.jpg`` → ``c0/img_1``);
    ``keep_extension``: with it (``c0/star.gif`` → ``c0/star_gif``), for names whose keys would
    collide without it (:func:`object_keys`)."""
    head, slash, base = name.rpartition("/")
    return safe_key(head + slash + (base if keep_extension else base.rpartition(".")[0] or base))


def object_keys(names: Sequence[str], root: str = "") -> tuple[list[str], list[int]]:
    """The sample keys of a folder's images ``names`` and the indices of those that keep their
    extension: :func:`object_key`, except for names whose keys would be one (``star.gif`` and
    ``star.png``: two samples, as torchvision's ``ImageFolder`` reads them), which keep it. Names
    that give one key even so (``a.gif`` and ``a_gif.png``) raise ``ConfigError`` naming both
    (``root``: the folder, for the message)."""
    first: dict[str, int] = {}
    shared: set[str] = set()
    for i, name in enumerate(names):
        if first.setdefault(object_key(name), i) != i:
            shared.add(object_key(name))
    keep = [i for i, name in enumerate(names) if shared and object_key(name) in shared]
    kept = set(keep)
    keys = [object_key(name, keep_extension=i in kept) for i, name in enumerate(names)]
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        other = seen.setdefault(key, i)
        if other != i:
            raise ConfigError(f"source: {root}/{names[other]} and {root}/{names[i]} give one sample key {key!r} (a key "
                              "is the path without its extension, tar-safe: dots become _); rename one")
    return keys, keep


def object_sample(name: str, data: bytes, label: int, url: str, targets: Mapping[str, bytes] | None = None,
                  key: str | None = None) -> Sample:
    """The sample of image ``name`` read as ``data`` from ``url``: key ``key`` (the table's,
    :meth:`ObjectTable.key`; default :func:`object_key`), the image under the name of its
    format (its extension when the bytes say none), and ``cls`` when ``label >= 0``, then the
    ``targets`` members (``json``, ``mask.png``: from a COCO file,
    :meth:`~gpupipe.formats.coco.CocoTable.fields`). An empty file raises ``ShardFormatError``
    (a loader knows of it at start: :func:`gpupipe.sources.source.resolve`)."""
    key = object_key(name) if key is None else key
    if not data:
        raise ShardFormatError(f"sample {key!r}: the image is empty (0 bytes)", shard=url)
    fields = sample_fields(data, label, field_name(data, extension(name)))
    return Sample(key=key, fields={**fields, **targets} if targets else fields, shard=url, offset=0)


def folder_table(listing: FolderListing, mapping: Mapping[str, int | str] | None, *, explicit: bool = False,
                 classes: Sequence[str] | None = None, annotated: bool = False
                 ) -> tuple[ObjectTable, tuple[str, ...], list[tuple[str, str]]]:
    """``(table, classes, skipped)`` for an image folder listing: the layout is class
    sub-folders when every image sits below the top level, flat when every one sits at
    it (labels from ``mapping``, else -1); a mix raises ``ConfigError``. A mapping given
    ``explicit``-ly for a folder with class sub-folders is refused (it would be ignored).
    ``classes`` numbers class names (see :func:`class_numbering`). ``skipped``: the files
    that are not read as images, with the reason (the expected side files left out).

    ``annotated``: a COCO folder (:mod:`gpupipe.formats.coco`), whose annotations file gives
    each image its objects and the classes: it must be flat (COCO's layout), every label is
    -1 (no class per image, no labels file read) and ``instances_*.json`` files are expected."""
    root = listing.root
    rel = {p: p[len(root):].lstrip("/") for p in listing.files}
    readable = image_extensions(readable=True)
    images = [r for r in rel.values() if extension(r) in readable and not _dotted(r)]
    top, deep = sorted(r for r in images if "/" not in r), sorted(r for r in images if "/" in r)
    if top and deep:
        raise ConfigError(f"source: {root} has images at the top level ({', '.join(top[:2])}, ...) and in sub-folders "
                          f"({', '.join(deep[:2])}, ...); put every image in a class sub-folder, or all of them at the "
                          "top with a labels.csv")
    if deep and annotated:
        raise ConfigError(f"source.annotations: {root} has its images in sub-folders ({', '.join(deep[:2])}, ...); "
                          "a folder read with COCO annotations holds its images at the top level, as COCO's "
                          "train2017/ does")
    if deep and mapping is not None and explicit:
        raise ConfigError(f"source.labels: {root} has class sub-folders, which give the labels; a labels file "
                          "is for a flat folder of images. Leave source.labels out.")
    if deep:
        _refuse_a_parent_of_datasets(root, listing.files)
        if classes is None:
            _refuse_a_root_of_splits(root, deep)
    keep, rejected = [], []
    for path in sorted(listing.files):
        reason = _reject(rel[path], listing.files[path], flat=not deep)
        if reason:
            rejected.append((path, reason))
        else:
            keep.append(rel[path])
    with_extension = object_keys(keep, root)[1]
    if deep:
        found = class_numbering({r.partition("/")[0] for r in keep}, classes, root)
        number = {c: i for i, c in enumerate(found)}
        labels, found = [number[r.partition("/")[0]] for r in keep], found
    elif annotated:
        labels, found = [-1] * len(keep), tuple(classes or ())
    else:
        labels, found = _mapped_labels(keep, mapping, classes, root)
    table = ObjectTable(NameList(keep), [listing.files[f"{root}/{r}"] for r in keep], labels,
                        with_extension=with_extension)
    return table, found, _reported(root, rejected)


_OUTSIDE = "not in a class sub-folder (expected <root>/<class>/<image>)"


def _dotted(rel: str) -> bool:
    """A hidden file or one in a hidden folder (a path component starting with ``.``)."""
    return any(part.startswith(".") for part in rel.split("/"))


def _reject(rel: str, size: int, *, flat: bool) -> str:
    """Why a listed file is not an input image ('' when it is one)."""
    if flat and "/" in rel:
        return "in a sub-folder of a flat folder (its images sit at the top level)"
    if not flat and "/" not in rel:
        return _OUTSIDE
    if _dotted(rel):
        return "hidden file or folder"
    if extension(rel) not in image_extensions(readable=True):
        return f"not an image file name (extension not one of {sorted(image_extensions(readable=True))})"
    if size > MAX_MEMBER_BYTES:
        return f"file of {size} bytes is larger than the {MAX_MEMBER_BYTES}-byte member limit"
    return ""


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
        elif rest and extension(rest) in image_extensions(readable=True):
            images.add(top)
    datasets = sorted(index | (tars - images))
    if datasets:
        folders = sorted(images - index - tars) or datasets
        raise ConfigError(f"{root}/ holds dataset folders ({', '.join(d + '/' for d in datasets[:3])} with tar shards "
                          f"or an index.json), so read as an image folder its sub-folders "
                          f"({', '.join(sorted(index | tars | images)[:5])}) would be the classes; give one "
                          f"dataset's folder, e.g. {root}/{folders[0]}/")


def _refuse_a_root_of_splits(root: str, images: list[str]) -> None:
    """Images only under split-named folders (``train/``, ``val/``, ...), in class sub-folders
    or in two or more splits: ``root`` is a dataset's root, and read as an image folder its
    splits would be the classes (train and val, 2 classes, every label wrong), as torchvision's
    ``ImageFolder(root)`` makes them. A class list given by hand (``classes=``) says they are classes."""
    tops = {r.partition("/")[0] for r in images}
    nested = all(r.count("/") >= 2 for r in images)
    if not tops <= set(SPLIT_FOLDERS) or not (nested or len(tops) > 1):
        return
    splits = sorted(tops, key=lambda t: (SPLIT_FOLDERS.index(t), t))
    raise ConfigError(
        f"source: {root}/ holds the splits {', '.join(t + '/' for t in splits)} of a dataset; read as one image "
        f"folder they would be its {len(splits)} classes and every label wrong. Give one split's folder: "
        f"GpuLoader('{root}/{splits[0]}/'), source: {{train: {root}/{splits[0]}/, val: ...}} in YAML; "
        f"GpuDataModule(source='{root}/') reads the split folders itself. (If they really are classes, "
        "name them: classes=[...], source.classes in YAML)")


def _mapped_labels(names: list[str], mapping: Mapping[str, int | str] | None, given: Sequence[str] | None,
                   where: str) -> tuple[list[int], tuple[str, ...]]:
    if mapping is None:
        if names:
            log.warning("%s: a flat folder without a labels file (%s): its %d images are unlabelled (label -1)",
                        where, " or ".join(LABEL_FILES), len(names))
        return [-1] * len(names), tuple(given or ())
    known, stems = set(names), {n.rpartition(".")[0] or n: n for n in names}
    by_name = {(k if k in known else stems.get(k, k)): v for k, v in mapping.items()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ConfigError(f"source.labels: {len(missing)} of {len(names)} images have no label "
                          f"({', '.join(missing[:3])}, ...); add them to the labels file or move them out of the folder")
    values = [by_name[n] for n in names]
    strings = [v for v in values if isinstance(v, str)]
    if not strings:
        ints = [int(v) for v in values]
        bad = [(n, label_problem(v, given or ())) for n, v in zip(names, ints) if label_problem(v, given or ())]
        if bad:
            raise ConfigError(f"source.labels: {len(bad)} image(s) have a label that numbers no class ({bad[0][0]}: "
                              f"{bad[0][1]}); correct the labels file")
        return ints, tuple(given or ())
    if len(strings) < len(values):
        raise ConfigError("source.labels: the labels mix integers and names; use one kind")
    classes = class_numbering(strings, given, where)
    index = {c: i for i, c in enumerate(classes)}
    return [index[v] for v in strings], classes


def _coco_file(path: str, root: str) -> bool:
    """A COCO annotations file at the top of the folder (``instances_val2017.json``)."""
    rel = path[len(root):].lstrip("/")
    return "/" not in rel and rel.startswith("instances_") and rel.endswith(".json")


def _reported(root: str, rejected: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The rejected files worth telling the user about (not index.json, labels.csv, ...)."""
    out = [(p, why) for p, why in rejected if p[len(root):].lstrip("/") not in _EXPECTED and not _coco_file(p, root)]
    if out:
        log.warning("%s: %d file(s) are not read as images (first: %s: %s)", root, len(out), out[0][0], out[0][1])
    return out
