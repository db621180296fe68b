"""Delta Lake tables read in place: the Parquet files of one snapshot, through ``deltalake``.

A folder whose listing holds ``_delta_log/<20 digits>.json`` commits is a Delta table. Its
Parquet files are not "every ``.parquet`` file in it": a later commit (an overwrite, a
delete) removes files from the table while they stay in the folder until ``VACUUM``. The
``deltalake`` package replays the log (JSON commits, Parquet checkpoints) and
:func:`read_snapshot` keeps only the files of the table's latest version, or of the
version pinned with ``table@v<N>`` (Spark's path syntax for time travel). Those files are
then described like any Parquet source (footers, row groups).

Refused, naming the feature: deletion vectors (rows deleted without rewriting the file
would be read), column mapping (physical column names differ from the schema), and a
label column that is a partition column (its value lives in the folder name, not in the
files; rewrite the table without ``partition_by`` on it).

``gpupipe index TABLE`` writes ``_gpupipe_index.json`` in the table folder (a name starting
with ``_``: ``VACUUM`` leaves it alone, where it would delete an ``index.json``); it
records the version it describes. At start the latest version is read from the listing of
``_delta_log``; an index of another version is ignored with a warning and the current
snapshot described afresh — never a stale file list.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from gpupipe.core.errors import ConfigError, MissingDependencyError, StorageError
from gpupipe.formats.folder import FolderListing
from gpupipe.formats.rowgroups import LABEL_COLUMNS

__all__ = ["DELTA_INDEX", "Snapshot", "split_version", "latest_version", "delta_storage_options",
           "read_snapshot", "index_json", "parse_index"]

log = logging.getLogger(__name__)

DELTA_INDEX = "_gpupipe_index.json"  # starts with "_": Delta's VACUUM does not delete it
_COMMIT = re.compile(r"_delta_log/(\d{20})\.json$")
_PINNED = re.compile(r"^(.+?)/?@v(\d+)/?$")
_REFUSED_FEATURES = {"deletionVectors": "deletion vectors (rows deleted without rewriting their file)",
                     "columnMapping": "column mapping (physical column names differ from the schema)"}


@dataclass(frozen=True)
class Snapshot:
    """The files of table version ``version``: ``names`` relative to the table folder
    (sorted: every rank plans the same order) and their ``sizes``."""

    version: int
    names: tuple[str, ...]
    sizes: tuple[int, ...]


def split_version(url: str) -> tuple[str, int | None]:
    """``("s3://b/table", 3)`` for ``s3://b/table@v3``; ``(url, None)`` without a pin."""
    m = _PINNED.match(url)
    return (m.group(1), int(m.group(2))) if m else (url, None)


def latest_version(listing: FolderListing) -> int | None:
    """The table's latest version: its highest commit file (``None``: not a Delta table)."""
    root = listing.root.rstrip("/") + "/"
    found = [_COMMIT.match(p[len(root):]) for p in listing.files if p.startswith(root)]
    return max((int(m.group(1)) for m in found if m), default=None)


def delta_storage_options(options: Mapping[str, Any]) -> dict[str, str]:
    """s3fs storage options as ``deltalake``'s object store reads them (``key`` →
    ``AWS_ACCESS_KEY_ID``, ``client_kwargs.endpoint_url`` → ``AWS_ENDPOINT_URL``, ...).
    Options with no counterpart (s3fs' own tuning) are left out."""
    client = dict(options.get("client_kwargs") or {})
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    region = client.get("region_name") or options.get("region_name")
    pairs = {"AWS_ACCESS_KEY_ID": options.get("key"), "AWS_SECRET_ACCESS_KEY": options.get("secret"),
             "AWS_SESSION_TOKEN": options.get("token"), "AWS_PROFILE": options.get("profile"),
             "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": region or ("us-east-1" if endpoint else None)}
    out = {k: str(v) for k, v in pairs.items() if v is not None}
    if endpoint and str(endpoint).startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    if options.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    return out


def _deltalake():
    try:
        import deltalake
    except ImportError:
        raise MissingDependencyError("deltalake", extra="delta", feature="reading Delta Lake tables") from None
    return deltalake


def read_snapshot(root: str, storage_options: Mapping[str, Any], version: int | None = None,
                  label_column: str | None = None) -> Snapshot:
    """The Parquet files of the table at ``root`` (its latest version, or ``version``),
    after refusing what cannot be read faithfully (see the module's docstring)."""
    deltalake = _deltalake()
    uri = root.rstrip("/")
    try:
        table = deltalake.DeltaTable(uri, version=version, storage_options=delta_storage_options(storage_options))
        actions = table.get_add_actions(flatten=True)
    except Exception as exc:  # deltalake raises its own TableNotFoundError, OSError, DeltaError ...
        raise StorageError(f"cannot read the Delta table{'' if version is None else f' at version {version}'} "
                           f"({type(exc).__name__}: {exc}); check the URL, the version and the storage "
                           "options", url=root) from None
    _refuse_features(table, root)
    _refuse_partition_label(table, root, label_column)
    paths = [str(p) for p in actions.column("path").to_pylist()]
    sizes = [int(s) for s in actions.column("size_bytes").to_pylist()]
    rel = sorted(zip((unquote(p) for p in paths), sizes))
    outside = [p for p, _ in rel if "://" in p or p.startswith("/") or ".." in p.split("/")]
    if outside:
        raise ConfigError(f"source: Delta table {root} lists files outside its folder ({outside[0]!r}, a shallow "
                          "clone?); gpupipe reads tables whose files sit in the table folder")
    return Snapshot(int(table.version()), tuple(p for p, _ in rel), tuple(s for _, s in rel))


def _refuse_features(table, root: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode not in ("none", None):
        features.add("columnMapping")
    for name, what in _REFUSED_FEATURES.items():
        if name in features:
            raise ConfigError(f"source: Delta table {root} uses {name} — {what}; gpupipe cannot honour it and "
                              "will not read deleted rows or misnamed columns. Rewrite the table without it "
                              "(e.g. OPTIMIZE / REORG ... APPLY (PURGE) and disable the feature), or `gpupipe "
                              "ingest` a read of it made with a Delta reader")


def _refuse_partition_label(table, root: str, label_column: str | None) -> None:
    parts = list(table.metadata().partition_columns or ())
    label = label_column or next((c for c in LABEL_COLUMNS if c in parts), None)
    if label in parts:
        raise ConfigError(f"source.label_column: {label!r} is a partition column of the Delta table {root} (its "
                          "value is in the folder names, not in the Parquet files); gpupipe does not read "
                          "partition values: rewrite the table without partition_by on it, or name another "
                          "label_column")


def index_json(manifest_json: str, version: int) -> bytes:
    """The text of ``_gpupipe_index.json``: the manifest plus the table version it describes."""
    doc = json.loads(manifest_json)
    doc["delta_version"] = version
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_index(text: bytes, url: str) -> int:
    """The table version that a ``_gpupipe_index.json`` describes."""
    try:
        version = json.loads(text)["delta_version"]
        if type(version) is not int or version < 0:
            raise ValueError(f"delta_version {version!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{url}: not a gpupipe Delta index ({exc}); rerun `gpupipe index` on the table") from None
    return version
