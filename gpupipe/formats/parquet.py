"""Images and labels from Parquet files (the Petastorm / Spark / HuggingFace layout).

A Parquet source has one image-bytes column -- ``binary``, or a HuggingFace-style struct
``{bytes, path}`` -- and one label column: integers (kept as they are) or strings (mapped to
their index among the sorted class names). :func:`plan_parquet` reads only the footers (and
the label column, when labels are strings) and lists the row groups; :func:`read_row_group`
reads one row group batch by batch. Nothing is loaded whole: memory is one row group per
reader. Files are opened through the fsspec filesystem given, so any storage works.
"""
from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from gpupipe.core.errors import ConfigError, MissingDependencyError

__all__ = ["LABEL_COLUMNS", "RowGroup", "ParquetPlan", "ParquetRow", "plan_parquet", "read_row_group",
           "require_pyarrow", "is_image_type", "classlabel_names"]

log = logging.getLogger(__name__)

LABEL_COLUMNS = ("label", "labels", "class", "target")  # looked for, in this order, when not named
_BATCH_ROWS = 256


@dataclass(frozen=True)
class RowGroup:
    """Row group ``index`` of ``path``; its first row is row ``first_row`` of the whole source."""

    path: str
    index: int
    first_row: int
    num_rows: int


@dataclass(frozen=True)
class ParquetPlan:
    """The columns to read and the row groups to read them from (in file order).

    ``classes`` maps a label index to a name: the sorted string labels, the names stored
    in HuggingFace ``ClassLabel`` metadata for integer labels, or ``()``.
    """

    image_column: str
    label_column: str
    string_labels: bool
    classes: tuple[str, ...]
    row_groups: tuple[RowGroup, ...]

    @property
    def num_rows(self) -> int:
        return sum(g.num_rows for g in self.row_groups)


@dataclass(frozen=True)
class ParquetRow:
    """One row: ``name`` is ``<file>#<row in file>``, ``stem`` the image's own file stem
    (from a struct's ``path``) or the Parquet file's; ``None`` where the row holds a null.
    (A dataclass, not a NamedTuple: a field ``index`` would hide ``tuple.index``.)"""

    name: str
    stem: str
    index: int
    label: int | None
    data: bytes | None


def require_pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("pyarrow", extra="parquet", feature="reading Parquet sources") from None
    return pq


def plan_parquet(fs, paths: Sequence[str], *, image_column: str | None = None,
                 label_column: str | None = None) -> ParquetPlan:
    """Check the schema of every file in ``paths`` and list their row groups.

    The columns are those named, else detected from the first file's schema; every file
    must have them with the same types. Raises ``ConfigError`` naming the file and the
    columns it has when a column is missing or of a type that cannot be used.
    """
    pq = require_pyarrow()
    if not paths:
        raise ConfigError("ingest: no .parquet files in the source")
    groups: list[RowGroup] = []
    names: set[str] = set()
    image: str | None = None  # these four from the first file
    label: str | None = None
    string_labels, first_schema = False, None
    total = 0
    for path in paths:
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            if image is None or label is None:  # the first file
                image, label = _image_column(schema, image_column, path), _label_column(schema, label_column, path)
                string_labels, first_schema = _is_string_labels(schema, label, path), schema
            _check_same(schema, first_schema, (image, label), path)
            for i in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(i).num_rows
                groups.append(RowGroup(path, i, total, n))
                total += n
            if string_labels:
                names.update(v for v in pf.read(columns=[label]).column(0).to_pylist() if v is not None)
    assert image is not None and label is not None  # set by the first file; paths is not empty
    classes = tuple(sorted(names)) if string_labels else classlabel_names(first_schema, label)
    return ParquetPlan(image, label, string_labels, classes, tuple(groups))


def _image_column(schema, wanted: str | None, path: str) -> str:
    if wanted is not None:
        if wanted not in schema.names:
            raise ConfigError(f"ingest.image_column: {path} has no column {wanted!r}; its columns are {schema.names}")
        if not is_image_type(schema.field(wanted).type):
            raise ConfigError(f"ingest.image_column: column {wanted!r} of {path} is {schema.field(wanted).type}, "
                              "not binary or a struct with a binary 'bytes' field")
        return wanted
    for field in schema:
        if is_image_type(field.type):
            return field.name
    raise ConfigError(f"ingest: {path} has no image-bytes column (binary, or a struct {{bytes, path}}); "
                      f"its columns are {schema.names}; name one with image_column")


def is_image_type(t) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        return idx >= 0 and is_image_type(t.field(idx).type) and not pa.types.is_struct(t.field(idx).type)
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _label_column(schema, wanted: str | None, path: str) -> str:
    if wanted is not None and wanted not in schema.names:
        raise ConfigError(f"ingest.label_column: {path} has no column {wanted!r}; its columns are {schema.names}")
    found = wanted or next((n for n in LABEL_COLUMNS if n in schema.names), None)
    if found is None:
        raise ConfigError(f"ingest: {path} has no label column (looked for {list(LABEL_COLUMNS)}); "
                          f"its columns are {schema.names}; name one with label_column")
    return found


def _is_string_labels(schema, label: str, path: str) -> bool:
    import pyarrow as pa

    t = schema.field(label).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        return False
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    raise ConfigError(f"ingest.label_column: column {label!r} of {path} is {t}; labels must be integers or strings")


def _check_same(schema, first, columns: tuple[str, str], path: str) -> None:
    for name in columns:
        if name not in schema.names or schema.field(name).type != first.field(name).type:
            got = schema.field(name).type if name in schema.names else "missing"
            raise ConfigError(f"ingest: column {name!r} of {path} is {got}, but {first.field(name).type} "
                              "in the first file; all Parquet files of a source need the same columns")


def classlabel_names(schema, label: str) -> tuple[str, ...]:
    """Class names from HuggingFace ``datasets`` metadata (``ClassLabel(names=...)``), if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return ()
    try:
        feature = json.loads(raw)["info"]["features"][label]
        return tuple(str(n) for n in feature["names"]) if feature.get("_type") == "ClassLabel" else ()
    except (TypeError, ValueError, KeyError, AttributeError):
        return ()


def read_row_group(fs, plan: ParquetPlan, group: RowGroup) -> list[ParquetRow]:
    """The rows of one row group, in order, read in record batches of a few hundred rows."""
    pq = require_pyarrow()
    index = {c: i for i, c in enumerate(plan.classes)} if plan.string_labels else None
    file_stem = posixpath.basename(group.path).rsplit(".", 1)[0]
    file_start = _file_start(plan, group)
    rows: list[ParquetRow] = []
    with fs.open(group.path, "rb") as f:
        batches = pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS, row_groups=[group.index],
                                                 columns=[plan.image_column, plan.label_column])
        for batch in batches:
            images = batch.column(0).to_pylist()
            labels = batch.column(1).to_pylist()
            for image, label in zip(images, labels):
                row = group.first_row + len(rows)
                data, stem = _image_value(image, file_stem)
                if index is not None and label is not None:
                    label = index.get(label)
                rows.append(ParquetRow(f"{group.path}#row{row - file_start}", stem, row, label, data))
    return rows


def _image_value(value, file_stem: str) -> tuple[bytes | None, str]:
    if isinstance(value, dict):  # HuggingFace Image feature: {"bytes": ..., "path": ...}
        path = value.get("path")
        stem = posixpath.basename(path).rsplit(".", 1)[0] if path else file_stem
        return value.get("bytes"), stem or file_stem
    return value, file_stem


def _file_start(plan: ParquetPlan, group: RowGroup) -> int:
    """Source row number of the first row of ``group``'s file."""
    return next(g.first_row for g in plan.row_groups if g.path == group.path)
