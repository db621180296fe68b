"""A streaming reader and a writer for WebDataset-layout POSIX tar shards.

The reader works on an iterable of byte chunks (no file, no extraction, nothing
unpickled): :func:`iter_members` yields regular-file members, and
:func:`group_by_key` joins consecutive members with one key into a
:class:`~gpupipe.core.types.Sample`. Links, devices, FIFOs, absolute names and ``..``
components are rejected with :class:`~gpupipe.core.errors.ShardFormatError`, which
names the shard and the byte offset of the bad header. A compressed shard
(gzip, bzip2, xz, zstd) is refused from its first bytes, before anything is
decompressed: byte-range reads need an uncompressed tar, and encoded images do
not compress, so a compressed shard buys nothing and a gzip bomb costs nothing.

:func:`sample_crc32` is the per-sample checksum the manifest stores and the
stream verifies: CRC-32 over each member's name and bytes, in member order.
"""
from __future__ import annotations

import logging
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from typing import BinaryIO

from gpupipe.core.checksum import crc32
from gpupipe.core.errors import ShardFormatError
from gpupipe.core.types import Sample, TarMember
from gpupipe.formats.containers import Container, register_container

__all__ = [
    "BLOCK",
    "MAX_MEMBER_BYTES",
    "iter_members",
    "group_by_key",
    "split_name",
    "sample_crc32",
    "safe_key",
    "sample_fields",
    "TarShardWriter",
]

log = logging.getLogger(__name__)

BLOCK = 512
MAX_MEMBER_BYTES = 1 << 30  # a member larger than this is a corrupt size field, not an image
_ZERO_BLOCK = bytes(512)
_MAX_EXT_HEADER = 1 << 20  # pax / GNU long-name payloads are names, not data
_REGULAR = (b"0", b"\0", b"7")
_EXTENDED = (b"x", b"g", b"L", b"K")  # headers whose data is metadata, not a member
_SKIPPED = (b"5", b"g", b"K")  # directories, global pax headers, GNU long link names
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
_REJECTED = {b"1": "hard link", b"2": "symbolic link", b"3": "character device",
             b"4": "block device", b"6": "FIFO"}


class _ChunkReader:
    """Exact reads over an iterator of byte chunks, counting the bytes consumed."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buf = b""
        self._pos = 0
        self.consumed = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at the end of the stream.

        Only the bytes returned are copied (a read inside the current chunk is one
        slice); a read across chunk boundaries joins just the pieces it needs.
        """
        end = self._pos + n
        if end <= len(self._buf):
            out = self._buf[self._pos:end]
            self._pos = end
        else:
            parts = [self._buf[self._pos:]]
            need = n - len(parts[0])
            while need > 0:
                nxt = next(self._chunks, None)
                if nxt is None:
                    self._buf, self._pos = b"", 0
                    break
                self._buf = nxt if isinstance(nxt, bytes) else bytes(nxt)
                parts.append(self._buf[:need])
                self._pos = len(parts[-1])
                need -= self._pos
            out = b"".join(parts)
        self.consumed += len(out)
        return out

    def skip(self, n: int) -> int:
        """Advance up to ``n`` bytes without copying them; returns how many were skipped."""
        if self._pos + n <= len(self._buf):
            self._pos += n
            self.consumed += n
            return n
        return len(self.read(n))


def iter_members(
    chunks: Iterable[bytes],
    *,
    shard: str = "",
    base_offset: int = 0,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> Iterator[TarMember]:
    """Regular-file members of the tar stream made of ``chunks``.

    ``base_offset`` is where the first chunk starts in the shard (for byte-range
    reads), so offsets in errors and members are shard offsets. A stream may end
    cleanly at a header boundary (a byte range, or a tar without end blocks);
    ending anywhere else is a truncation and raises.
    """
    reader = _ChunkReader(chunks)
    pending_name: str | None = None
    pending_size: int | None = None
    first_header: int | None = None
    while True:
        here = base_offset + reader.consumed
        block = reader.read(BLOCK)
        if not block:
            if pending_name is not None or first_header is not None:
                raise ShardFormatError("stream ends after an extended header", shard=shard, offset=here)
            return
        if len(block) < BLOCK:
            _refuse_compressed(block, here, shard=shard)
            raise ShardFormatError(f"truncated header ({len(block)} of 512 bytes)", shard=shard, offset=here)
        if block == _ZERO_BLOCK:
            if first_header is not None:
                raise ShardFormatError("end-of-archive marker after an extended header", shard=shard, offset=here)
            return  # end-of-archive marker
        try:
            header = _parse_header(block, shard=shard, offset=here)
        except ShardFormatError:
            _refuse_compressed(block, here, shard=shard)
            raise
        typeflag, size = header["type"], header["size"]
        if pending_size is not None and typeflag not in _EXTENDED:
            size, pending_size = pending_size, None
        limit = _MAX_EXT_HEADER if typeflag in _EXTENDED else max_member_bytes
        if size > limit:
            raise ShardFormatError(f"member size {size} exceeds the limit of {limit} bytes", shard=shard, offset=here)
        if first_header is None:
            first_header = here
        data = reader.read(size)
        if len(data) < size:
            raise ShardFormatError(f"truncated member data ({len(data)} of {size} bytes)", shard=shard, offset=here)
        padding = -size % BLOCK
        if padding and reader.skip(padding) < padding:
            raise ShardFormatError("truncated padding after member data", shard=shard, offset=here)
        if typeflag == b"x":
            pending_name, pax_size = _parse_pax(data, shard=shard, offset=here, name=pending_name)
            pending_size = pending_size if pax_size is None else pax_size
            continue
        if typeflag == b"L":
            pending_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        if typeflag in _REJECTED:
            raise ShardFormatError(f"{_REJECTED[typeflag]} member {header['name']!r} is not allowed", shard=shard, offset=here)
        name = _safe_name(pending_name or header["name"], shard=shard, offset=here)
        start, pending_name, first_header = first_header, None, None
        if typeflag in _SKIPPED:
            continue
        if typeflag not in _REGULAR:
            raise ShardFormatError(f"unsupported member type {typeflag!r} for {name!r}", shard=shard, offset=here)
        yield TarMember(name=name, data=data, offset=start, end=base_offset + reader.consumed)


def _refuse_compressed(block: bytes, offset: int, *, shard: str) -> None:
    """Name the compression when a shard's first block is not a tar header but starts with
    a compression format's magic bytes (nothing is ever inflated)."""
    if offset != 0:
        return
    for magic, kind in _COMPRESSED:
        if block.startswith(magic):
            raise ShardFormatError(
                f"shard is {kind}-compressed; gpupipe reads uncompressed tar shards only (byte-range reads need "
                "them, and encoded images do not compress). Decompress it, or re-shard with `gpupipe ingest`",
                shard=shard, offset=0)


def _parse_header(block: bytes, *, shard: str, offset: int) -> dict:
    stored = _octal(block[148:156], what="checksum", shard=shard, offset=offset)
    unsigned = sum(block) - sum(block[148:156]) + 8 * 0x20  # the checksum field counts as spaces
    if stored != unsigned and stored != unsigned - 256 * sum(b > 127 for b in block[:148] + block[156:]):  # signed-char tars
        raise ShardFormatError(f"header checksum {stored} does not match {unsigned} (corrupt header)", shard=shard, offset=offset)
    raw_size = block[124:136]
    if raw_size[0] & 0x80:  # GNU base-256 for large sizes
        size = int.from_bytes(raw_size[1:], "big") if raw_size[0] == 0x80 else -1
    else:
        size = _octal(raw_size, what="size", shard=shard, offset=offset)
    if size < 0:
        raise ShardFormatError("negative member size", shard=shard, offset=offset)
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix may hold the directory part
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return {"name": name.decode("utf-8", "replace"), "size": size, "type": block[156:157]}


def _octal(field: bytes, *, what: str, shard: str, offset: int) -> int:
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ShardFormatError(f"header {what} field {field!r} is not octal (corrupt header)", shard=shard, offset=offset) from None


def _parse_pax(data: bytes, *, shard: str, offset: int, name: str | None) -> tuple[str | None, int | None]:
    """The ``path`` and ``size`` overrides of a pax extended header."""
    size = None
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardFormatError("malformed pax header record", shard=shard, offset=offset) from None
        if space < 0 or length <= space - pos or pos + length > len(data):
            raise ShardFormatError("malformed pax header record", shard=shard, offset=offset)
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "replace")
        elif key == b"size":
            if not value.isdigit():
                raise ShardFormatError(f"pax size {value!r} is not a decimal number", shard=shard, offset=offset)
            try:
                size = int(value)
            except ValueError:  # more digits than int() converts
                raise ShardFormatError(f"pax size {value[:20]!r}... is too long", shard=shard, offset=offset) from None
        pos += length
    return name, size


def _safe_name(name: str, *, shard: str, offset: int) -> str:
    while name.startswith("./"):
        name = name[2:]
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts:
        raise ShardFormatError(f"unsafe member name {name!r} (absolute, '..' or backslash)", shard=shard, offset=offset)
    return name


def split_name(name: str) -> tuple[str, str]:
    """``"a/b/x.seg.png"`` → ``("a/b/x", "seg.png")``: the key ends at the first dot
    of the last path component (the WebDataset rule); the extension is lower-cased."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem or not dot:
        return "", ""
    return (f"{head}/{stem}" if head else stem), ext.lower()


def group_by_key(members: Iterable[TarMember], *, shard: str = "") -> Iterator[Sample]:
    """Join consecutive members that share a key into samples.

    Members without an extension (or with an empty key, such as ``._x`` files)
    are skipped and logged. A repeated extension within one key raises.
    """
    key: str | None = None
    fields: dict[str, bytes] = {}
    start = 0
    for m in members:
        k, ext = split_name(m.name)
        if not k:
            log.warning("%s: skipping member %r at byte %d: no <key>.<ext> name", shard, m.name, m.offset)
            continue
        if k != key:
            if key is not None:
                yield Sample(key=key, fields=fields, shard=shard, offset=start)
            key, fields, start = k, {}, m.offset
        if ext in fields:
            raise ShardFormatError(f"key {k!r} has two '.{ext}' members", shard=shard, offset=m.offset)
        fields[ext] = m.data
    if key is not None:
        yield Sample(key=key, fields=fields, shard=shard, offset=start)


def sample_crc32(key: str, fields: Mapping[str, bytes]) -> int:
    """The sample checksum stored in the manifest: CRC-32 of ``"<key>.<ext>\\0" + bytes``
    for each member, in member order (so a changed name, extension or byte changes it)."""
    crc = 0
    for ext, data in fields.items():
        crc = crc32(data, crc32(f"{key}.{ext}\0".encode("utf-8", "surrogateescape"), crc))
    return crc


TAR = register_container(Container(
    "tar", "tar shards", "shard", "shards", "tar shards", reads="ranges", rank=0,
    recognise=lambda paths: any("/" not in p and p.endswith(".tar") for p in paths)))
"""Tar shards at the top of a folder win over anything beside them; their ``index.json`` lists
shard entries of its own (no ``table``), written by ``gpupipe ingest`` or ``gpupipe index``."""


def safe_key(path: str) -> str:
    """``path`` (a name without its extension) as a sample key that a member name keeps:
    the dots of its last component, backslashes and NULs become ``_`` (the key ends at the
    first dot of the last component, and the reader refuses the others)."""
    head, slash, base = path.replace("\\", "_").replace("\0", "_").rpartition("/")
    return head + slash + base.replace(".", "_")


def sample_fields(image: bytes, label: int, ext: str) -> dict[str, bytes]:
    """The fields of a sample of one image: ``{ext: image}``, and ``cls`` (the label in ASCII)
    when it has one -- a label of -1 means none, which is also what a sample without ``cls``
    reads as."""
    return {ext: image} if label < 0 else {ext: image, "cls": str(label).encode()}


def _check_member_name(key: str, ext: str) -> None:
    name = f"{key}.{ext}"
    try:
        ok = split_name(name) == (key, ext) and _safe_name(name, shard="", offset=0) == name
        name.encode("utf-8")
    except (ShardFormatError, UnicodeEncodeError):
        ok = False
    if not ok:
        raise ValueError(f"member name {name!r} is not usable: the key needs no dot in its last component, "
                         "no '..', no leading '/' or './', no backslash or NUL; the extension needs no '/' "
                         "and no upper case")


class TarShardWriter:
    """Writes samples as a WebDataset-layout tar and records where each one starts.

    Headers are deterministic (mtime 0, uid/gid 0, mode 0444), so the same samples
    give the same bytes. ``offsets`` ends with the end-of-data offset once closed,
    and ``crcs`` holds each sample's :func:`sample_crc32`: what the manifest stores.
    """

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self.size = 0
        self.offsets: list[int] = []
        self.crcs: list[int] = []
        self._closed = False
        self._last_key: str | None = None

    def write(self, key: str, fields: dict[str, bytes]) -> int:
        """Append one sample; returns its byte offset.

        Raises ``ValueError`` for a sample the reader would not give back as written:
        no fields, the previous sample's key (the two would merge into one), or a
        member name that :func:`split_name` / the reader's name check would change.
        """
        if not fields or key == self._last_key:
            raise ValueError(f"sample {key!r} has no fields or repeats the previous key (the reader would merge them)")
        for ext in fields:
            _check_member_name(key, ext)
        self._last_key = key
        offset = self.size
        for ext, data in fields.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mode, info.mtime = len(data), 0o444, 0
            self._put(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            self._put(data)
            self._put(bytes(-len(data) % BLOCK))
        self.offsets.append(offset)
        self.crcs.append(sample_crc32(key, fields))
        return offset

    def close(self) -> None:
        """Record the end-of-data offset and write the two end-of-archive blocks."""
        if not self._closed:
            self.offsets.append(self.size)
            self._put(bytes(2 * BLOCK))
            self._closed = True

    def _put(self, data: bytes) -> None:
        self._stream.write(data)
        self.size += len(data)
