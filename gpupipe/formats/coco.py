"""COCO detection annotations (``instances_*.json``) beside an image folder, read in place.

The file (COCO's detection format) holds ``images`` (``{id, file_name, width, height}``),
``annotations`` (``{id, image_id, bbox: [x, y, w, h], category_id, iscrowd, segmentation}``)
and ``categories`` (``{id, name}``). :func:`parse_coco` turns it into a :class:`CocoTable`:
per image (keyed by ``file_name``) its boxes packed in one array — absolute ``xyxy``
float32 pixels — with their labels and per-image counts, so that the table pickles into
DataLoader workers as a few numpy arrays, not as a list of dicts per image.

* ``labels``: the index of the box's category among the categories sorted by id (their
  names, in that order, are the source's ``classes``); or, when a class list is given, the
  index of the category's name in it (a category it does not name is refused).
* Annotations with ``iscrowd: 1`` are dropped, as torchvision's detection references drop
  them (a crowd region is not one object; its segmentation is RLE). An image the file
  lists without annotations has 0 boxes.
* A bad file raises: :class:`~gpupipe.core.errors.ShardFormatError` naming the annotation
  id and its image for a bbox that is not four finite numbers, a negative width or height,
  a ``category_id`` not among the categories, an ``image_id`` not among the images; and for
  JSON that does not parse or lacks the three lists.

Masks (:meth:`CocoTable.mask`): the polygon segmentations of an image rasterized with
Pillow's ``ImageDraw.polygon`` into a label map of the image's ``width`` x ``height``:
category index + 1 where an object is, 0 for background, painted in the file's annotation
order (a later object covers an earlier one where they overlap). Pillow fills a polygon's
boundary pixels too; pycocotools' ``frPyObjects`` does not always, so edge pixels may differ
from masks made with it. RLE segmentations (crowd regions, kept only if ``iscrowd`` is 0)
are not supported for masks: that image's mask raises ``ShardFormatError`` saying so.
The sample members they become are :mod:`gpupipe.formats.annotations`' ``json`` and
``mask.png`` (:meth:`CocoTable.fields`).
"""
from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.core.targetkinds import ragged_rows
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, encode_boxes
from gpupipe.formats.folder import NameList, class_numbering, read_only

__all__ = ["CocoTable", "parse_coco", "mask_png"]

log = logging.getLogger(__name__)

_NONE, _POLYGONS, _RLE = 0, 1, 2  # what an annotation's segmentation is


@dataclass(frozen=True, eq=False)
class CocoTable:
    """The boxes (and polygons) of a COCO file, packed, one row per image.

    Per image ``i`` (``names[i]``: its ``file_name``): ``sizes[i]`` = ``(width, height)``,
    and its annotations are rows ``offsets[i]:offsets[i + 1]`` of ``boxes`` (N, 4) float32
    ``xyxy``, ``labels`` (N,) int64 and ``ann_ids`` (N,) int64. Per annotation, ``seg``
    says what its segmentation is (none, polygons, RLE) and its polygons are rows
    ``seg_offsets[a]:seg_offsets[a + 1]`` of ``poly_offsets``, which cut ``coords``
    (x, y, x, y, ... float64). ``classes``: the category names that ``labels`` index."""

    names: NameList
    sizes: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    boxes: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    ann_ids: np.ndarray = field(repr=False)
    seg: np.ndarray = field(repr=False)
    seg_offsets: np.ndarray = field(repr=False)
    poly_offsets: np.ndarray = field(repr=False)
    coords: np.ndarray = field(repr=False)
    classes: tuple[str, ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.names)

    @property
    def counts(self) -> np.ndarray:
        """(I,) int64: the boxes of each image."""
        return np.diff(self.offsets)

    def index(self) -> dict[str, int]:
        """``{file_name: row}``."""
        return {n: i for i, n in enumerate(self.names)}

    def aligned(self, names: Sequence[str], where: str) -> CocoTable:
        """The table with row ``i`` for image ``names[i]`` (an image folder's objects).

        An image the file lists that is not among ``names`` raises ``ConfigError`` naming it, as
        does an image among ``names`` the file does not list (``where``: the folder, for the
        message): a wrong or partial annotations file must not pass as images with no objects."""
        rows = self.index()
        order = np.fromiter((rows.get(n, -1) for n in names), dtype=np.int64, count=len(names))
        unlisted = [n for n, r in zip(names, order) if r < 0]
        if unlisted:
            raise ConfigError(f"source.annotations: {len(unlisted)} image(s) of {where} are not in {self.source} "
                              f"({', '.join(unlisted[:3])}{', ...' if len(unlisted) > 3 else ''}); an image without "
                              "objects needs an entry in its \"images\" list. Move the others out of the folder, or "
                              "give the annotations file that lists them (annotations: / Source(annotations=...))")
        if len(names) != len(self):
            present = set(names)
            missing = [n for n in self.names if n not in present]
            raise ConfigError(f"source.annotations: {self.source} lists {len(missing)} image(s) that are not images "
                              f"in {where} ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); put them "
                              "there, or take them out of the annotations file")
        offsets, a = _ranges(self.offsets, order)
        seg_offsets, p = _ranges(self.seg_offsets, a)
        poly_offsets, c = _ranges(self.poly_offsets, p)
        return CocoTable(NameList(names), read_only(self.sizes[order], np.int64), read_only(offsets, np.int64),
                         read_only(self.boxes[a], np.float32), read_only(self.labels[a], np.int64),
                         read_only(self.ann_ids[a], np.int64), read_only(self.seg[a], np.int8),
                         read_only(seg_offsets, np.int64), read_only(poly_offsets, np.int64),
                         read_only(self.coords[c], np.float64), self.classes, self.source)

    def image_boxes(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(boxes (n, 4) float32 xyxy, labels (n,) int64)`` of image ``i``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.boxes[a:b], self.labels[a:b]

    def mask(self, i: int) -> np.ndarray:
        """(height, width) uint8 label map of image ``i``'s polygons (see the module's docstring)."""
        from PIL import Image, ImageDraw

        width, height = (int(v) for v in self.sizes[i])
        if len(self.classes) > 254:
            raise ShardFormatError(f"{len(self.classes)} categories do not fit an 8-bit mask (category index + 1 "
                                   "<= 255)", shard=self.source)
        canvas = Image.new("L", (width, height), 0)
        draw = ImageDraw.Draw(canvas)
        for a in range(int(self.offsets[i]), int(self.offsets[i + 1])):
            if self.seg[a] == _RLE:
                raise ShardFormatError(f"image {self.names[i]!r}: annotation {int(self.ann_ids[a])} has an RLE "
                                       "segmentation; masks are made from polygons only (RLE is not supported)",
                                       shard=self.source)
            for p in range(int(self.seg_offsets[a]), int(self.seg_offsets[a + 1])):
                xy = self.coords[int(self.poly_offsets[p]):int(self.poly_offsets[p + 1])]
                draw.polygon(xy.tolist(), fill=int(self.labels[a]) + 1)
        return np.asarray(canvas, dtype=np.uint8)

    def fields(self, i: int, kinds: Sequence[str]) -> dict[str, bytes]:
        """The sample members of image ``i`` for target ``kinds`` (``boxes``, ``masks``)."""
        out = {}
        if "boxes" in kinds:
            out[BOXES_FIELD] = encode_boxes(*self.image_boxes(i))
        if "masks" in kinds:
            out[MASK_FIELD] = mask_png(self.mask(i))
        return out


def mask_png(mask: np.ndarray) -> bytes:
    """An (H, W) uint8 label map as the 8-bit grayscale PNG of :data:`~gpupipe.formats.annotations.MASK_FIELD`."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8), mode="L").save(out, format="PNG")
    return out.getvalue()


def _ranges(offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``order`` of a ragged array cut by ``offsets``: the new offsets, and the flat index of
    every element they hold, in order."""
    lengths, rows = ragged_rows(np.diff(offsets), np.asarray(order, dtype=np.int64))
    new = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    return new, rows


def parse_coco(data: bytes, url: str, classes: Sequence[str] | None = None) -> CocoTable:
    """The :class:`CocoTable` of the bytes of a COCO ``instances_*.json`` read from ``url``.
    ``classes``: the class list numbering the categories by name (default: the category
    names, sorted by category id)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"the COCO annotations do not parse as JSON ({exc})", shard=url) from None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list) for k in ("images", "annotations",
                                                                                  "categories")):
        raise ShardFormatError('not COCO detection annotations: expected an object with "images", "annotations" '
                               'and "categories" lists', shard=url)
    names, sizes, image_rows = _images(doc["images"], url)
    category_index, found = _categories(doc["categories"], url, classes)
    parts = _annotations(doc["annotations"], url, image_rows, names, category_index)
    order = np.argsort(parts["image"], kind="stable")  # grouped by image, in the file's order within one
    counts = np.bincount(parts["image"], minlength=len(names)).astype(np.int64)
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seg_offsets, p = _ranges(parts["seg_offsets"], order)
    poly_offsets, c = _ranges(parts["poly_offsets"], p)
    return CocoTable(NameList(names), read_only(sizes, np.int64).reshape(-1, 2), read_only(offsets, np.int64),
                     read_only(parts["boxes"][order], np.float32).reshape(-1, 4), read_only(parts["labels"][order], np.int64),
                     read_only(parts["ids"][order], np.int64), read_only(parts["seg"][order], np.int8),
                     read_only(seg_offsets, np.int64), read_only(poly_offsets, np.int64),
                     read_only(parts["coords"][c], np.float64), found, url)


def _images(images: list, url: str) -> tuple[list[str], list[tuple[int, int]], dict[int, int]]:
    names: list[str] = []
    sizes: list[tuple[int, int]] = []
    rows: dict[int, int] = {}
    seen: set[str] = set()
    for k, image in enumerate(images):
        ok = isinstance(image, dict) and _is_int(image.get("id")) and isinstance(image.get("file_name"), str) and \
            all(_is_int(image.get(d)) and image[d] > 0 for d in ("width", "height"))
        if not ok:
            raise ShardFormatError(f"images[{k}] is {_preview(image)}; expected {{\"id\": int, \"file_name\": str, "
                                   "\"width\": int > 0, \"height\": int > 0}", shard=url)
        if image["id"] in rows or image["file_name"] in seen:
            raise ShardFormatError(f"images[{k}]: id {image['id']} or file_name {image['file_name']!r} is listed "
                                   "twice", shard=url)
        rows[image["id"]] = len(names)
        seen.add(image["file_name"])
        names.append(image["file_name"])
        sizes.append((image["width"], image["height"]))
    return names, sizes, rows


def _categories(categories: list, url: str, given: Sequence[str] | None) -> tuple[dict[int, int], tuple[str, ...]]:
    """``{category_id: label}`` and the class list the labels index."""
    pairs = []
    for k, cat in enumerate(categories):
        if not (isinstance(cat, dict) and _is_int(cat.get("id")) and isinstance(cat.get("name"), str)):
            raise ShardFormatError(f"categories[{k}] is {_preview(cat)}; expected {{\"id\": int, \"name\": str}}",
                                   shard=url)
        pairs.append((cat["id"], cat["name"]))
    pairs.sort()
    ids, names = [i for i, _ in pairs], [n for _, n in pairs]
    if len(set(ids)) != len(ids) or len(set(names)) != len(names):
        raise ShardFormatError("categories: a category id or name is listed twice", shard=url)
    found = class_numbering(names, given, url) if given is not None else tuple(names)
    number = {c: k for k, c in enumerate(found)}
    return {i: number[n] for i, n in pairs}, found


def _annotations(annotations: list, url: str, image_rows: dict[int, int], names: list[str],
                 category_index: dict[int, int]) -> dict[str, np.ndarray]:
    """Every usable annotation as flat arrays (in the file's order; crowds dropped)."""
    image, boxes, labels, ids, seg = [], [], [], [], []
    seg_offsets, poly_offsets, coords = [0], [0], []
    crowds = 0
    for k, ann in enumerate(annotations):
        aid = ann.get("id", f"#{k}") if isinstance(ann, dict) else f"#{k}"
        if not isinstance(ann, dict):
            raise ShardFormatError(f"annotation {aid} is {_preview(ann)}, not an object", shard=url)
        image_id, category_id = ann.get("image_id"), ann.get("category_id")
        row = image_rows.get(image_id) if type(image_id) is int else None
        if row is None:
            raise ShardFormatError(f"annotation {aid}: image_id {image_id!r} is not among the images",
                                   shard=url)
        if ann.get("iscrowd", 0) == 1:
            crowds += 1
            continue

        def bad(what: str, row=row, aid=aid) -> ShardFormatError:
            return ShardFormatError(f"annotation {aid} of image {names[row]!r}: {what}", shard=url)

        box = ann.get("bbox")
        if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) and math.isfinite(v) for v in box)):
            raise bad(f"bbox is {_preview(box)}, not four finite numbers [x, y, width, height]")
        if box[2] < 0 or box[3] < 0:
            raise bad(f"bbox {box} has a negative width or height")
        label = category_index.get(category_id) if type(category_id) is int else None
        if label is None:
            raise bad(f"category_id {category_id!r} is not among the categories")
        kind, polygons = _segmentation(ann.get("segmentation"), bad)
        for poly in polygons:
            coords.extend(poly)
            poly_offsets.append(len(coords))
        seg_offsets.append(len(poly_offsets) - 1)
        image.append(row)
        boxes.append([box[0], box[1], box[0] + box[2], box[1] + box[3]])  # float64 sums, then float32
        labels.append(label)
        ids.append(ann["id"] if _is_int(ann.get("id")) else -1)
        seg.append(kind)
    if crowds:
        log.info("%s: %d crowd annotation(s) (iscrowd: 1) dropped, as torchvision's detection references do", url,
                 crowds)
    return {"image": np.array(image, dtype=np.int64), "boxes": np.array(boxes, dtype=np.float64).reshape(-1, 4),
            "labels": np.array(labels, dtype=np.int64), "ids": np.array(ids, dtype=np.int64),
            "seg": np.array(seg, dtype=np.int8), "seg_offsets": np.array(seg_offsets, dtype=np.int64),
            "poly_offsets": np.array(poly_offsets, dtype=np.int64), "coords": np.array(coords, dtype=np.float64)}


def _segmentation(value, bad) -> tuple[int, list[list[float]]]:
    """What a segmentation is, and its polygons (each ``[x, y, x, y, ...]``, 3 points or more)."""
    if value is None or value == []:
        return _NONE, []
    if isinstance(value, dict):
        return _RLE, []
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(_is_number(v) and math.isfinite(v)
                                                                           for v in p) for p in value):
        raise bad(f"segmentation is {_preview(value)}; expected polygons [[x, y, x, y, x, y, ...], ...] or RLE")
    return _POLYGONS, value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _preview(value: object) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."

