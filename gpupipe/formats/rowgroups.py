"""The Parquet format: row groups as units, two column chunks per request -- the one reader
of Parquet sources, for ``gpupipe ingest`` and for reading in place alike.

:func:`describe_parquet` reads each file's footer (one ranged request for the file's
tail, a second only when the footer is longer) and turns it into a
:class:`RowGroupTable`: per row group its file, row count and the byte ranges of the
image and label column chunks. :func:`row_group_samples` decodes one row group from
those ranges only, with pyarrow, through :class:`Pieces` — a read-only file that holds
the fetched byte ranges and nothing else — so no file is ever downloaded whole and only
the two needed columns are read. pandas is never involved.

Columns (:func:`parquet_columns`): the image column is the one named, else the first of
``image``, ``img``, ``jpg``, ``jpeg``, ``png``, ``bytes`` that holds binary values or a
Hugging Face ``{bytes, path}`` struct (only ``bytes`` is read), else the only such column;
several and none named is an error naming them. The label column is the one named, else
the first of ``label``, ``labels``, ``cls``, ``class``, ``target``; integer labels are
kept, string labels become their index among the sorted names (``classes``), and Hugging
Face ``ClassLabel`` metadata gives names to integer labels. A table without a label
column is unlabelled: every label is -1 (with a warning).

Targets (:func:`with_target_columns`, when the source asks for them): boxes come from the
``boxes`` column (``list<list<float>>`` of ``[x1, y1, x2, y2]`` absolute pixels, or a flat
``list<float>`` of ``4n`` values) with one class index per box in ``box_labels``
(``list<int>``); a mask from ``mask`` (binary: an 8-bit PNG of class indices). Their column
chunks are fetched with the image's (:meth:`RowGroupTable.byte_ranges`), and a row's
sample gets them as the members a WebDataset sample has (:mod:`gpupipe.formats.annotations`:
``json``, ``mask.png``; made by :mod:`gpupipe.formats.rowtargets`). A null cell, a box that is not four finite numbers or has a
negative size, a box count that is not the label count, a label outside the class list
and a mask that is not a PNG make the row a ``ShardFormatError`` naming it.

Rows (:func:`row_group_samples`): a row's key is ``<file>/<row in the file>``; a null or
empty image cell, a null label cell, a string label outside the class list and an integer that numbers
no class (:func:`~gpupipe.formats.folder.label_problem`; -1 means "no label") make that row
a :class:`~gpupipe.core.errors.ShardFormatError`, which the loader raises or skips
(``on_error``) and ingest skips and lists.
"""
from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import ConfigError, MissingDependencyError, ShardFormatError, StorageError
from gpupipe.core.types import Sample
from gpupipe.formats.containers import Container, register_container
from gpupipe.formats.folder import NameList, class_numbering, label_problem, read_only
from gpupipe.formats.imageheader import field_name
from gpupipe.formats.rowtargets import TARGET_COLUMNS, check_target_types, row_targets
from gpupipe.formats.tar import safe_key, sample_fields

__all__ = ["IMAGE_COLUMNS", "LABEL_COLUMNS", "TAIL_BYTES", "Columns", "RowGroupTable", "Pieces", "footer_range",
           "read_footer", "describe_parquet", "parquet_columns", "parquet_classes", "read_columns",
           "row_key", "row_group_samples", "require_pyarrow", "is_image_type", "classlabel_names",
           "with_target_columns"]

log = logging.getLogger(__name__)

IMAGE_COLUMNS = ("image", "img", "jpg", "jpeg", "png", "bytes")
LABEL_COLUMNS = ("label", "labels", "cls", "class", "target")
TAIL_BYTES = 64 << 10  # first read of a file's tail: holds the footer of most files
_MERGE_GAP = 64 << 10  # column chunks closer than this are fetched as one range


@dataclass(frozen=True)
class Columns:
    """The column chunks read: ``image`` (a binary column, or a struct whose ``bytes``
    field is read when ``image_field`` is ``"bytes"``), ``label`` (``None``: no labels) and
    ``targets``, the target columns (:data:`TARGET_COLUMNS`) read when the source asks for them."""

    image: str
    image_field: str | None = None
    label: str | None = None
    string_labels: bool = False
    targets: tuple[str, ...] = ()

    @property
    def leaves(self) -> tuple[str, ...]:
        """Column paths as pyarrow reads them (``image.bytes`` for a struct)."""
        img = f"{self.image}.{self.image_field}" if self.image_field else self.image
        return (img,) if self.label is None else (img, self.label)


@dataclass(frozen=True, eq=False)
class RowGroupTable:
    """The row groups of a Parquet source, in file order then row-group order.

    Per file (``files`` relative to the root): ``file_sizes``, and its footer (plus the
    8-byte trailer) kept whole — ``footer_blob`` holds them back to back, ``footer_sizes``
    their lengths — so that a worker decodes row groups without asking for footers. Per row group: ``file``, ``index`` in its file,
    ``first_row`` in its file, ``rows``, and ``ranges`` (R, 4 + 2T): start and stop of the image
    column chunk, then of the label column chunk (``-1, -1`` without labels), then of each of
    the T ``columns.targets``; ``crc32`` of those bytes when indexed with checksums.
    """

    columns: Columns
    files: NameList
    file_sizes: np.ndarray = field(repr=False)
    footer_sizes: np.ndarray = field(repr=False)
    footer_blob: bytes = field(repr=False)
    file: np.ndarray = field(repr=False)
    index: np.ndarray = field(repr=False)
    first_row: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    ranges: np.ndarray = field(repr=False)
    crc32: np.ndarray | None = field(default=None, repr=False)

    def __init__(self, columns: Columns, files: NameList, file_sizes: ArrayLike, footer_sizes: ArrayLike,
                 footer_blob: bytes, file: ArrayLike, index: ArrayLike, first_row: ArrayLike, rows: ArrayLike,
                 ranges: ArrayLike, crc32: ArrayLike | None = None) -> None:
        """The array-likes: any integer sequences; the fields hold read-only int64 copies."""
        for name, value in (("columns", columns), ("files", files), ("footer_blob", footer_blob)):
            object.__setattr__(self, name, value)
        arrays = {"file_sizes": file_sizes, "footer_sizes": footer_sizes, "file": file, "index": index,
                  "first_row": first_row, "rows": rows, "ranges": ranges}
        for name, values in arrays.items():
            object.__setattr__(self, name, read_only(values))
        object.__setattr__(self, "crc32", None if crc32 is None else read_only(crc32))
        self._check()

    def _check(self) -> None:
        n, width = len(self.rows), 4 + 2 * len(self.columns.targets)
        if self.ranges.size != n * width:
            raise ShardFormatError(f"row-group table: {self.ranges.size} range values for {n} row groups of "
                                   f"{width} each")
        self.ranges.shape = (n, width)
        if not all(len(getattr(self, a)) == n for a in ("file", "index", "first_row")) or (
                self.crc32 is not None and len(self.crc32) != n):
            raise ShardFormatError(f"row-group table lists {n} row groups but other columns of other lengths")
        if len(self.file_sizes) != len(self.files) or len(self.footer_sizes) != len(self.files) or \
                int(self.footer_sizes.sum()) != len(self.footer_blob):
            raise ShardFormatError("row-group table: one size and one footer per file needed")
        if n and (self.file.min() < 0 or self.file.max() >= len(self.files) or self.rows.min() < 0):
            raise ShardFormatError("row-group table: a row group names a file that is not listed")
        for i in range(len(self.files)):
            name = self.files[i]
            if not name or name.startswith("/") or ".." in name.split("/") or "://" in name:
                raise ShardFormatError(f"file name {name!r} escapes the folder")

    def __len__(self) -> int:
        return len(self.rows)

    def sample_counts(self) -> UnitCounts:
        return UnitCounts.of(self.rows)

    @property
    def num_samples(self) -> int:
        return int(self.rows.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.file_sizes.sum())

    def with_crc32(self, crc32: Any) -> RowGroupTable:
        return replace(self, crc32=crc32)

    def footer(self, f: int) -> tuple[int, bytes]:
        """``(start in the file, bytes)`` of file ``f``'s footer and trailer."""
        end = int(self.footer_sizes[:f + 1].sum())
        n = int(self.footer_sizes[f])
        return int(self.file_sizes[f]) - n, self.footer_blob[end - n:end]

    def byte_ranges(self, group: int) -> list[tuple[int, int]]:
        """The byte ranges to fetch for row group ``group``: its column chunks in file order,
        those less than 64 KiB apart fetched as one (one range when they sit together)."""
        row = [int(x) for x in self.ranges[group]]
        chunks = sorted((row[k], row[k + 1]) for k in range(0, len(row), 2) if row[k] >= 0)
        out = [chunks[0]]
        for a, b in chunks[1:]:
            if a - out[-1][1] <= _MERGE_GAP:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        return out

    def to_dict(self) -> dict:
        c = self.columns
        doc: dict[str, Any] = {"image_column": c.image, "image_field": c.image_field, "label_column": c.label,
               "string_labels": c.string_labels, **({"target_columns": list(c.targets)} if c.targets else {}),
               "files": {"names": list(self.files), "sizes": self.file_sizes.tolist(),
                         "footers": self.footer_sizes.tolist(),
                         "footer_bytes": base64.b64encode(self.footer_blob).decode("ascii")},
               "row_groups": {"file": self.file.tolist(), "index": self.index.tolist(),
                              "first_row": self.first_row.tolist(), "rows": self.rows.tolist(),
                              "ranges": self.ranges.reshape(-1).tolist()}}
        if self.crc32 is not None:
            doc["row_groups"]["crc32"] = self.crc32.tolist()
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping) -> RowGroupTable:
        files, groups = doc["files"], doc["row_groups"]
        if not all(isinstance(n, str) for n in files["names"]):
            raise ValueError("parquet.files.names must be strings")
        targets = doc.get("target_columns", [])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError("parquet.target_columns must be a list of column names")
        columns = Columns(str(doc["image_column"]), doc.get("image_field"), doc.get("label_column"),
                          bool(doc.get("string_labels", False)), tuple(targets))
        return cls(columns, NameList(files["names"]), _ints(files["sizes"]), _ints(files["footers"]),
                   base64.b64decode(files["footer_bytes"], validate=True), _ints(groups["file"]), _ints(groups["index"]), _ints(groups["first_row"]), _ints(groups["rows"]),
                   _ints(groups["ranges"]), _ints(groups["crc32"]) if "crc32" in groups else None)


def _ints(values) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError("parquet tables hold lists of integers")
    return values


def data_files(paths: Sequence[str]) -> list[str]:
    """The Parquet files among ``paths`` (relative to a folder): hidden files and Spark/Delta side
    files and folders (``.x``, ``_SUCCESS``, ``_delta_log``) left out."""
    return [p for p in paths if p.endswith(".parquet") and not any(part.startswith((".", "_")) for part in p.split("/"))]


PARQUET = register_container(Container(
    "parquet", "Parquet", "row group", "row groups", ".parquet files", reads="whole", rank=20,
    recognise=lambda paths: bool(data_files(paths)), table=RowGroupTable, table_key="parquet"))


class Pieces(io.RawIOBase):
    """A read-only file of ``size`` bytes that holds only the fetched ``pieces``
    (``{start: bytes}``). A read outside them calls ``fallback(start, stop)`` (a ranged
    fetch) when given, else raises — pyarrow never sees bytes that were not fetched."""

    def __init__(self, size: int, pieces: Mapping[int, bytes], name: str = "",
                 fallback: Callable[[int, int], bytes] | None = None):
        super().__init__()
        self.size, self.name, self._fallback = size, name, fallback
        self._pieces = sorted(pieces.items())
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        stop = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        start, self._pos = self._pos, max(self._pos, stop)
        if start >= stop:
            return b""
        for at, data in self._pieces:
            if at <= start and stop <= at + len(data):
                return data[start - at:stop - at]
        if self._fallback is None:
            raise OSError(f"{self.name}: bytes [{start}, {stop}) were not fetched")
        return self._fallback(start, stop)

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


def footer_range(size: int, tail: bytes, name: str) -> tuple[int, int]:
    """The byte range of the footer plus trailer, from the last bytes of the file."""
    if size < 12 or len(tail) < 8 or tail[-4:] != b"PAR1":
        raise ShardFormatError("not a Parquet file (no PAR1 trailer) or it is truncated", shard=name)
    length = int.from_bytes(tail[-8:-4], "little") + 8
    if length > size - 4:
        raise ShardFormatError(f"Parquet footer of {length} bytes does not fit in a file of {size}", shard=name)
    return size - length, size


def read_footer(size: int, start: int, footer: bytes, name: str):
    """pyarrow ``FileMetaData`` from the footer (and trailer) bytes at ``start`` of a file
    of ``size``: parsed on their own, with the header magic in front (the offsets in it
    stay those of the file)."""
    pq = require_pyarrow()
    import pyarrow as pa

    if len(footer) != size - start or footer[-4:] != b"PAR1":
        raise ShardFormatError("not a Parquet file (no PAR1 trailer) or it is truncated", shard=name)
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a damaged footer
        raise ShardFormatError(f"the Parquet footer cannot be read ({type(exc).__name__}: {exc}); "
                               "the file is damaged or not Parquet", shard=name) from None


def require_pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("pyarrow", extra="parquet", feature="reading Parquet sources") from None
    return pq


def describe_parquet(names: Sequence[str], sizes: Sequence[int], footers: Sequence[tuple[int, bytes]], metas,
                     *, image_column: str | None = None, label_column: str | None = None, root: str = ""
                     ) -> tuple[RowGroupTable, tuple[str, ...]]:
    """The row-group table of files ``names`` from their footers (``(start, bytes)`` and
    the parsed ``metas``), and the class names that Hugging Face metadata gives (``()``
    otherwise: string labels need their values read, see ``Columns.string_labels``).
    ``root + name`` is a file's URL, for messages. Files without rows add no row group;
    a source with no rows at all raises ``StorageError``."""
    if not names:
        raise ConfigError(f"source: no .parquet files in {root or 'the source'}")
    urls = [root + n for n in names]
    schema = metas[0].schema.to_arrow_schema()
    columns = parquet_columns(schema, image_column, label_column, urls[0])
    for url, meta in zip(urls[1:], metas[1:]):
        _check_same(meta.schema.to_arrow_schema(), schema, columns, url, urls[0])
    rows = _row_groups(metas, columns, urls)
    if not rows["rows"]:
        raise StorageError(f"no rows in {len(names)} Parquet file(s) ({', '.join(names[:3])}); nothing to read",
                           url=root)
    table = RowGroupTable(columns, NameList(names), list(sizes), [len(f) for _, f in footers],
                          b"".join(f for _, f in footers), **rows)
    return table, () if columns.label is None else classlabel_names(schema, columns.label)


def parquet_classes(columns: Columns, named: Sequence[str], strings: Iterable[str] | None,
                    given: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The class list of a Parquet source: string labels (``strings``: every value found)
    numbered by ``given`` or sorted (:func:`~gpupipe.formats.folder.class_numbering`);
    integer labels named by Hugging Face metadata (``named``), which ``given`` must equal;
    else ``given``, or ``()``."""
    if columns.string_labels:
        return class_numbering(strings or (), given, where)
    if given is not None and named and tuple(given) != tuple(named):
        raise ConfigError(f"classes: {where} names its integer labels {list(named[:5])}... (Hugging Face "
                          f"ClassLabel), not {list(given[:5])}...; give the same list, or leave the class list out")
    return tuple(given) if given is not None else tuple(named)


def _row_groups(metas, columns: Columns, names: Sequence[str]) -> dict[str, list]:
    """Per row group with rows (empty ones are left out: they hold nothing to read)."""
    out: dict[str, list] = {"file": [], "index": [], "first_row": [], "rows": [], "ranges": []}
    for f, meta in enumerate(metas):
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        first = 0
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            if rg.num_rows == 0:
                continue
            span = [x for leaf in columns.leaves for x in _chunk_range(rg.column(leaves.index(leaf)), names[f])]
            out["ranges"] += span + [-1, -1] * (2 - len(columns.leaves))
            out["file"].append(f)
            out["index"].append(g)
            out["first_row"].append(first)
            out["rows"].append(rg.num_rows)
            first += rg.num_rows
    return out


def _chunk_range(col, name: str) -> tuple[int, int]:
    start = col.data_page_offset
    if col.has_dictionary_page and col.dictionary_page_offset is not None and 0 < col.dictionary_page_offset < start:
        start = col.dictionary_page_offset
    if start < 4 or col.total_compressed_size < 0:
        raise ShardFormatError(f"column chunk {col.path_in_schema} has a bad offset {start}", shard=name)
    return start, start + col.total_compressed_size


def parquet_columns(schema, image: str | None, label: str | None, name: str) -> Columns:
    """The image and label columns of a file with ``schema`` (called ``name`` in messages),
    by the rules in the module's docstring; ``ConfigError`` names the columns it has."""
    import pyarrow as pa

    image = _image_column(schema, image, name)
    t = schema.field(image).type
    image_field = "bytes" if pa.types.is_struct(t) else None
    if label is not None and label not in schema.names:
        raise ConfigError(f"label_column: column {label!r} of {name} is missing; its columns are {schema.names}")
    label = label or next((c for c in LABEL_COLUMNS if c in schema.names), None)
    if label is None:
        log.warning("%s has no label column (looked for %s): it is unlabelled, every label is -1. Name one with "
                    "label_column.", name, list(LABEL_COLUMNS))
        return Columns(image, image_field)
    lt = schema.field(label).type
    lt = lt.value_type if pa.types.is_dictionary(lt) else lt
    if not (pa.types.is_integer(lt) or pa.types.is_string(lt) or pa.types.is_large_string(lt)):
        raise ConfigError(f"label_column: column {label!r} of {name} is {lt}; labels must be integers or strings")
    return Columns(image, image_field, label, not pa.types.is_integer(lt))


def _image_column(schema, wanted: str | None, name: str) -> str:
    if wanted is not None:
        if wanted not in schema.names or not is_image_type(schema.field(wanted).type):
            got = schema.field(wanted).type if wanted in schema.names else "missing"
            raise ConfigError(f"image_column: column {wanted!r} of {name} is {got}; it must hold binary "
                              f"values or a {{bytes, path}} struct (columns: {schema.names})")
        return wanted
    usable = [f.name for f in schema if is_image_type(f.type)]
    named = next((c for c in IMAGE_COLUMNS if c in usable), None)
    if named or len(usable) == 1:
        return named or usable[0]
    if not usable:
        raise ConfigError(f"{name} has no image-bytes column (binary, or a {{bytes, path}} struct) among "
                          f"{schema.names}; name one with image_column")
    raise ConfigError(f"cannot tell the image column of {name}: binary columns {usable} among {schema.names}, "
                      f"none called {' / '.join(IMAGE_COLUMNS)}; name it with image_column")


def is_image_type(t) -> bool:
    """Binary (or large binary), or a struct whose ``bytes`` field is: an image-bytes column."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        return idx >= 0 and is_image_type(t.field(idx).type) and not pa.types.is_struct(t.field(idx).type)
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def classlabel_names(schema, label: str | None) -> tuple[str, ...]:
    """Class names from Hugging Face ``datasets`` metadata (``ClassLabel(names=...)``), if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None or label is None:
        return ()
    try:
        feature = json.loads(raw)["info"]["features"][label]
        return tuple(str(n) for n in feature["names"]) if feature.get("_type") == "ClassLabel" else ()
    except (TypeError, ValueError, KeyError, AttributeError):
        return ()


def _check_same(schema, first, columns: Columns, name: str, first_name: str) -> None:
    for col in (columns.image, columns.label):
        if col is not None and (col not in schema.names or schema.field(col).type != first.field(col).type):
            got = schema.field(col).type if col in schema.names else "missing"
            raise ConfigError(f"source: column {col!r} of {name} is {got}, but {first.field(col).type} in "
                              f"{first_name}; every Parquet file of a source needs the same columns")


def read_columns(meta, file: Pieces, index: int, leaves: Sequence[str]):
    """Columns ``leaves`` of row group ``index`` as a pyarrow table, read from ``file``."""
    pq = require_pyarrow()
    try:
        return pq.ParquetFile(file, metadata=meta, pre_buffer=False).read_row_group(index, columns=list(leaves))
    except Exception as exc:  # pyarrow: ArrowInvalid, OSError (thrift, decompression, a missing range)
        raise ShardFormatError(f"row group {index} cannot be decoded ({type(exc).__name__}: {exc})",
                               shard=file.name) from None


def _decode(meta, file: Pieces, index: int, columns: Columns) -> tuple[list[bytes | None], list, dict[str, list]]:
    """Images, raw labels and the raw cells of each target column of row group ``index``."""
    table = read_columns(meta, file, index, columns.leaves + columns.targets)
    image = table.column(columns.image).combine_chunks()
    if columns.image_field:
        image = _struct_bytes(image, columns.image_field)
    labels = table.column(columns.label).to_pylist() if columns.label else [-1] * table.num_rows
    return image.to_pylist(), labels, {c: table.column(c).to_pylist() for c in columns.targets}


def _struct_bytes(array, name: str):
    """The ``name`` child of a struct array, null wherever the struct itself is null."""
    import pyarrow.compute as pc

    return pc.struct_field(array, name)


def row_key(file: str, row: int) -> str:
    """The sample key of row ``row`` (counted in its file) of ``file`` (its name under the
    root): ``part-000.parquet/17``, tar-safe."""
    return safe_key(f"{file}/{row}")


def row_group_samples(table: RowGroupTable, classes: Sequence[str], g: int, meta, file: Pieces
                      ) -> tuple[list[Sample | None], dict[int, ShardFormatError]]:
    """The samples of row group ``g`` decoded from ``file`` (its fetched column chunks; the
    file's parsed footer ``meta``): one per row, ``None`` where the row is unusable, and the
    ``ShardFormatError`` saying why by row. ``classes`` numbers string labels. Raises
    ``ShardFormatError`` when the row group does not decode or has other rows than listed."""
    images, labels, cells = _decode(meta, file, int(table.index[g]), table.columns)
    rows, url = int(table.rows[g]), file.name
    if len(images) != rows:
        raise ShardFormatError(f"row group {int(table.index[g])} has {len(images)} rows, index.json says {rows} "
                               "(the file changed: rerun `gpupipe index`)", shard=url)
    index = {c: i for i, c in enumerate(classes)} if table.columns.string_labels else None
    first, name = int(table.first_row[g]), table.files[int(table.file[g])]
    samples: list[Sample | None] = []
    problems: dict[int, ShardFormatError] = {}
    for i, (data, raw) in enumerate(zip(images, labels)):
        key = row_key(name, first + i)
        label, why = _row_label(raw, index, classes)
        if not data:
            why = "the image cell is null" if data is None else "the image is empty (0 bytes)"
        extra: dict[str, bytes] = {}
        if not why and cells:
            extra, why = row_targets({c: v[i] for c, v in cells.items()}, len(classes) or None)
        if why or data is None:
            problems[i] = ShardFormatError(f"sample {key!r}: {why}", shard=url)
            samples.append(None)
            continue
        samples.append(Sample(key=key, fields={**sample_fields(data, label, field_name(data, "jpg")), **extra},
                              shard=url, offset=first + i))
    return samples, problems


def with_target_columns(table: RowGroupTable, kinds: Sequence[str], root: str = "") -> RowGroupTable:
    """``table`` reading the target columns of ``kinds`` (``boxes``, ``masks``: :data:`TARGET_COLUMNS`)
    too: their column chunk ranges from the footers the table holds (no request). A column a file
    lacks, or of another type, raises ``ConfigError`` naming it and the file (``root + name``).
    CRC-32s of the index cover the other chunks only: they are dropped (``gpupipe index
    --checksums`` of a source with targets is not written yet)."""
    wanted = tuple(c for k in kinds for c in TARGET_COLUMNS.get(k, ()))
    if table.columns.targets == wanted:
        return table
    metas = []
    for f in range(len(table.files)):
        url = root + table.files[f]
        meta = read_footer(int(table.file_sizes[f]), *table.footer(f), url)
        check_target_types(meta.schema.to_arrow_schema(), wanted, url)
        metas.append(meta)
    extra = np.full((len(table), 2 * len(wanted)), -1, dtype=np.int64)
    for g in range(len(table)):
        f = int(table.file[g])
        meta, rg = metas[f], metas[f].row_group(int(table.index[g]))
        paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for k, name in enumerate(wanted):
            spans = [_chunk_range(rg.column(i), root + table.files[f]) for i, p in enumerate(paths)
                     if p == name or p.startswith(name + ".")]
            extra[g, 2 * k:2 * k + 2] = min(a for a, _ in spans), max(b for _, b in spans)
    if table.crc32 is not None:
        log.info("%s: the index's CRC-32s do not cover the target columns; row groups are read unchecked", root)
    return RowGroupTable(Columns(table.columns.image, table.columns.image_field, table.columns.label,
                                 table.columns.string_labels, wanted), table.files, table.file_sizes,
                         table.footer_sizes, table.footer_blob, table.file, table.index, table.first_row, table.rows,
                         np.hstack([table.ranges[:, :4], extra]))


def _row_label(raw, index: dict[str, int] | None, classes: Sequence[str]) -> tuple[int, str]:
    """A row's label and, when it has none that is usable, why."""
    if raw is None:
        return -1, "the label cell is null (a labelled source needs every label)"
    if index is not None:
        label = index.get(raw)
        return (-1, f"label {raw!r} is not in the class list (rerun `gpupipe index`)") if label is None else (label, "")
    return int(raw), label_problem(int(raw), classes)
