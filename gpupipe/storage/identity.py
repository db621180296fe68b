"""What an object's bytes are known by, so that a cache entry can never outlive them.

A cached block is named by (URL, the object's *version tag*, byte range). The tag comes
from what describes the object, cheapest first:

* a checksum in the manifest — a tar shard's SHA-256, an object's or row group's
  CRC-32 (``gpupipe index --checksums``): no request at all, and the same for every epoch
  and every re-index that leaves the bytes alone;
* the identity the storage gives in ``fs.info()`` (one HEAD, which a whole-object read
  makes anyway to learn the size), as :func:`identity_of` picks it:

  ============  ==========================================================
  s3 (s3fs)     ``ETag``, ``VersionId`` when versioned, ``LastModified``, size
  gcs (gcsfs)   ``generation``, ``md5Hash``/``crc32c``, ``updated``, size
  azure (adlfs) ``etag``, ``last_modified``, size
  http(s)       ``ETag`` / ``Content-MD5`` / ``Digest`` when sent, ``Last-Modified``, size
  local disk    ``mtime``, inode, size
  memory://     ``created``, size
  ============  ==========================================================

An object modified less than :data:`RACY_S` seconds ago (by this machine's clock) has
no identity yet: a rewrite within the storage's timestamp resolution — one second for
S3's ``LastModified`` and HTTP dates, a clock tick for a local disk's mtime — could not be
told from it (git's "racy" entries). An object whose info has neither a content tag nor a
modification time has none either. Without a tag nothing is cached: the bytes are read
from storage every time.
"""
from __future__ import annotations

import email.utils
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["ObjectVersion", "RACY_S", "identity_of", "digest_of", "as_version"]

RACY_S = 2.0  # an object younger than this is not cached (see the module doc)

# info() keys, lower-cased without "-" and "_": the first group names the content or the
# write (any one suffices), the second the modification time (the first one found).
_CONTENT_KEYS = ("etag", "versionid", "generation", "md5hash", "crc32c", "contentmd5", "digest", "blobid")
_TIME_KEYS = ("lastmodified", "mtime", "updated", "modified", "created")
_EXTRA_KEYS = ("ino",)


@dataclass(frozen=True)
class ObjectVersion:
    """One content of one object: ``tag`` names it (a checksum from the manifest, or the
    storage's identity; ``""``: unknown, never cached) and ``size`` is the object's length
    in bytes when known (then it is cached in blocks of a fixed grid; else by exact range)."""

    tag: str = ""
    size: int | None = None


def as_version(version: ObjectVersion | str) -> ObjectVersion:
    """``version`` as an :class:`ObjectVersion` (a string is a tag of unknown size)."""
    return version if isinstance(version, ObjectVersion) else ObjectVersion(str(version))


def _timestamp(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return email.utils.parsedate_to_datetime(value).timestamp()  # HTTP dates
        except (TypeError, ValueError, IndexError):
            pass
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def identity_of(info: Mapping[str, Any], now: float | None = None) -> str:
    """The version tag of an object from its ``fs.info()`` (or listing) entry; ``""`` when the
    entry does not identify its bytes, or they were modified less than :data:`RACY_S` ago."""
    fields = {k.lower().replace("-", "").replace("_", ""): v for k, v in info.items()}
    content = [(k, str(fields[k])) for k in _CONTENT_KEYS if fields.get(k) not in (None, "")]
    modified = next((t for k in _TIME_KEYS if (t := _timestamp(fields.get(k))) is not None), None)
    if modified is not None and modified > (time.time() if now is None else now) - RACY_S:
        return ""  # racy: a rewrite in the same timestamp tick would look the same
    if not content and modified is None:
        return ""
    parts = [*content, ("time", "" if modified is None else f"{modified:.6f}"), ("size", str(fields.get("size")))]
    parts += [(k, str(fields[k])) for k in _EXTRA_KEYS if fields.get(k) is not None]
    return ";".join(f"{k}={v}" for k, v in parts)


def digest_of(tags: Iterable[tuple[str, str]]) -> str:
    """One tag for many objects (``(name, tag)`` pairs, e.g. a folder's listing); ``""`` when
    any of them has none."""
    h = hashlib.sha256()
    for name, tag in sorted(tags):
        if not tag:
            return ""
        h.update(f"{name}\0{tag}\0".encode())
    return "sha256:" + h.hexdigest()
