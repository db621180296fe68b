"""Pack samples into an :class:`EncodedBatch`: one uint8 buffer of still-encoded
images, int64 offsets, labels, sample ids, keys and a valid mask.

Between reading and packing, samples travel as a :class:`SampleTable`: columns (where each
image lies in a buffer read from storage, labels, ids, keys, valid flags), not an object per
sample, so shuffling is an index and packing one copy per image into the batch's buffer.

Made in DataLoader workers; cheap to send to the main process (a handful of
tensors, one of them the bytes) and pinnable for an asynchronous copy.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from gpupipe.core.errors import ShardFormatError
from gpupipe.core.types import Sample
from gpupipe.formats.headers import ProbedHeaders
from gpupipe.formats.imageheader import image_extensions
from gpupipe.storage.buffers import BufferPool
from gpupipe.storage.fetch import FetchStats
from gpupipe.stream.slots import SlotTaker, shared_bytes
from gpupipe.stream.targets import SampleTargets, TargetColumns, read_targets

__all__ = ["EncodedBatch", "EncodedTargets", "SampleTable", "TargetColumns", "pack", "pack_table", "padded_stride", "LABEL_EXTENSIONS", "image_field", "label_of"]

LABEL_EXTENSIONS = ("cls", "label", "class", "cls2")


@dataclass(frozen=True)
class EncodedTargets:
    """The annotations of an encoded batch of B samples, still in their images' own frames.

    Boxes (when the source's ``targets`` name them): ``box_counts`` (B,) int64 — sample i owns
    the ``box_counts[i]`` rows after the sum of the counts before it; ``boxes`` (N, 4) float32
    absolute ``xyxy`` pixels of the image as decoded (upright: EXIF orientation applied),
    ``box_labels`` (N,) int64 class indices. Masks (when named): ``mask_data`` uint8, the
    encoded PNG label maps one after another, ``mask_offsets`` (B+1,) int64 — mask i is
    ``mask_data[mask_offsets[i]:mask_offsets[i+1]]``, empty for a placeholder. A kind not
    carried is ``None``. The decode stage turns these into :class:`~gpupipe.core.targets.Targets`.
    """

    box_counts: torch.Tensor | None = None
    boxes: torch.Tensor | None = None
    box_labels: torch.Tensor | None = None
    mask_data: torch.Tensor | None = None
    mask_offsets: torch.Tensor | None = None

    def __post_init__(self) -> None:
        carried = [t is not None for t in (self.box_counts, self.boxes, self.box_labels)]
        if any(carried) and not all(carried):
            raise ValueError("EncodedTargets: box_counts, boxes and box_labels come together")
        if (self.mask_data is None) != (self.mask_offsets is None):
            raise ValueError("EncodedTargets: mask_data and mask_offsets come together")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The target kinds carried, in ``TARGET_KINDS`` order."""
        return tuple(k for k, t in (("boxes", self.boxes), ("masks", self.mask_data)) if t is not None)

    def mask(self, i: int) -> memoryview:
        """Encoded mask ``i`` (a view, no copy; empty for a placeholder)."""
        assert self.mask_data is not None and self.mask_offsets is not None, "this batch carries no masks"
        a, b = int(self.mask_offsets[i]), int(self.mask_offsets[i + 1])
        return self.mask_data.numpy().data[a:b]

    def pin_memory(self) -> EncodedTargets:
        return EncodedTargets(*(None if t is None else t.pin_memory() for t in (
            self.box_counts, self.boxes, self.box_labels, self.mask_data, self.mask_offsets)))


@dataclass(frozen=True)
class EncodedBatch:
    """A batch of encoded images.

    Shape: ``data`` (total_bytes,) uint8; ``offsets`` (B+1,) int64 and ``sizes`` (B,) int64 —
    image i is ``data[offsets[i]:offsets[i] + sizes[i]]``; ``labels``, ``sample_ids`` (B,) int64;
    ``valid`` (B,) bool — False for padding and for samples skipped as unreadable.
    ``stride``: 0 when the images lie one after another (``offsets[i+1] = offsets[i] + sizes[i]``);
    else image i starts at ``i * stride`` and ``data[:B * stride]`` is a (B, stride) array whose
    row i is image i followed by bytes of no meaning — what a decoder is fed in one piece
    (:func:`pack_table`'s ``pad``).
    ``epoch``, ``chunk`` and ``batch`` place it in the epoch plan (resume state).
    ``targets``: the samples' boxes and masks (:class:`EncodedTargets`), when the source has them.
    ``probed``: every image's header, probed where the batch was packed
    (:class:`~gpupipe.formats.headers.ProbedHeaders`); ``crops``: (key, (B, 4) float64 boxes)
    drawn there too, for the decode settings ``key`` names (:mod:`gpupipe.decode.columns`).
    """

    data: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    valid: torch.Tensor
    keys: tuple[str, ...]
    epoch: int = 0
    chunk: int = -1
    batch: int = -1
    skipped: int = 0  # samples replaced by placeholders since the worker's previous batch
    fetched: FetchStats | None = None  # the worker's storage counters since its previous batch
    targets: EncodedTargets | None = None
    sizes: torch.Tensor | None = None  # None: offsets[i+1] - offsets[i] (packed by hand)
    stride: int = 0
    slot: int = -1  # the worker's reused shared buffer it is in (gpupipe.stream.slots); -1: its own
    probed: ProbedHeaders | None = None
    crops: tuple[tuple, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def image(self, i: int) -> memoryview:
        """Encoded bytes of image ``i`` (a view, no copy)."""
        a = int(self.offsets[i])
        b = a + int(self.sizes[i]) if self.sizes is not None else int(self.offsets[i + 1])
        return self.data.numpy().data[a:b]

    def images(self) -> list[memoryview]:
        """Every image's encoded bytes (views, no copy): two ``tolist`` and a slice per image,
        a fraction of a microsecond each, where :meth:`image` reads two tensor scalars."""
        view = self.data.numpy().data
        starts = self.offsets.tolist()
        sizes = self.sizes.tolist() if self.sizes is not None else [b - a for a, b in zip(starts, starts[1:])]
        return [view[a:a + z] for a, z in zip(starts, sizes)]

    def padded_rows(self) -> np.ndarray | None:
        """(B, stride) uint8: row i is image i and bytes of no meaning, for a batch packed padded;
        else None."""
        if not self.stride:
            return None
        return self.data.numpy()[:len(self) * self.stride].reshape(len(self), self.stride)

    def image_sizes(self) -> np.ndarray:
        """(B,) int64: each image's size in bytes."""
        return self.sizes.numpy() if self.sizes is not None else np.diff(self.offsets.numpy())

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def pin_memory(self) -> EncodedBatch:
        """Called by torch's DataLoader when ``pin_memory=True``."""
        return replace(self, data=self.data.pin_memory(), offsets=self.offsets.pin_memory(),
                       labels=self.labels.pin_memory(), sample_ids=self.sample_ids.pin_memory(),
                       valid=self.valid.pin_memory(), sizes=None if self.sizes is None else self.sizes.pin_memory(),
                       targets=None if self.targets is None else self.targets.pin_memory())


def image_field(sample: Sample) -> bytes:
    """The encoded image of a sample; an empty ``bytes`` when it has none."""
    for ext in image_extensions():
        if ext in sample.fields:
            return sample.fields[ext]
    return b""


def label_of(sample: Sample) -> int:
    """The integer class label (``.cls`` and friends, ASCII), or -1 when absent."""
    for ext in LABEL_EXTENSIONS:
        if ext in sample.fields:
            text = bytes(sample.fields[ext]).strip()
            try:
                return int(text)
            except ValueError:
                raise ShardFormatError(f"sample {sample.key!r}: label .{ext} is {text[:20]!r}, not an integer",
                                       shard=sample.shard, offset=sample.offset) from None
    return -1


@dataclass(frozen=True)
class SampleTable:
    """Samples as columns. Image ``i`` is bytes ``[start[i], start[i] + size[i])`` of
    ``buffers[buffer[i]]`` (``size`` 0: no image, a placeholder); ``labels``, ``sample_ids``
    (int64), ``valid`` (bool) and ``keys`` as in :class:`EncodedBatch`; ``targets`` the samples'
    boxes and masks (:class:`~gpupipe.stream.targets.TargetColumns`, masks in ``buffers`` too)
    when the source carries them.
    """

    buffers: tuple  # bytes-like objects (bytes, or uint8 numpy arrays), never copied here
    buffer: np.ndarray
    start: np.ndarray
    size: np.ndarray
    labels: np.ndarray
    sample_ids: np.ndarray
    keys: list[str]
    valid: np.ndarray
    targets: TargetColumns | None = None
    header_ids: np.ndarray | None = None  # each image's probe verdict kept (formats.headers.header_ids), -1 none

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], valid: Iterable[bool], kinds: Sequence[str] = (), *,
                     num_classes: int | None = None, parsed: Sequence[SampleTargets] | None = None) -> SampleTable:
        """One buffer per sample (its image field); invalid where ``valid`` is false or it has no image.

        ``kinds``: the target kinds every sample carries, read from its fields with
        :func:`~gpupipe.stream.targets.read_targets` (``ShardFormatError`` naming a sample without
        them; a placeholder, with no fields, has none) unless ``parsed`` gives them already."""
        images = tuple(image_field(s) for s in samples)
        n = len(images)
        size = np.fromiter((len(b) for b in images), dtype=np.int64, count=n)
        ok = np.fromiter((bool(v) for v in valid), dtype=bool, count=n)
        targets, masks = None, ()
        if kinds:
            if parsed is None:
                parsed = [read_targets(s, kinds, num_classes) for s in samples]
            targets, masks = TargetColumns.from_parsed(parsed, kinds, n)
        return cls(buffers=images + masks, buffer=np.arange(n, dtype=np.int64), start=np.zeros(n, np.int64),
                   size=size, labels=np.fromiter((s.label for s in samples), dtype=np.int64, count=n),
                   sample_ids=np.fromiter((s.sample_id for s in samples), dtype=np.int64, count=n),
                   keys=[s.key for s in samples], valid=ok & (size > 0), targets=targets)

    @classmethod
    def concat(cls, tables: Sequence[SampleTable]) -> SampleTable:
        if len(tables) == 1:
            return tables[0]
        first = np.cumsum([0] + [len(t.buffers) for t in tables[:-1]])
        carried = [t.targets is not None for t in tables]
        if any(carried) and not all(carried):
            raise ValueError("tables with and without targets cannot be joined")
        targets = TargetColumns.concat([t.targets for t in tables], first.tolist()) if all(carried) else None  # type: ignore[misc]
        return cls(buffers=tuple(b for t in tables for b in t.buffers),
                   buffer=np.concatenate([t.buffer + f for t, f in zip(tables, first)]),
                   start=np.concatenate([t.start for t in tables]), size=np.concatenate([t.size for t in tables]),
                   labels=np.concatenate([t.labels for t in tables]),
                   sample_ids=np.concatenate([t.sample_ids for t in tables]),
                   keys=[k for t in tables for k in t.keys], valid=np.concatenate([t.valid for t in tables]),
                   targets=targets, header_ids=None if any(t.header_ids is None for t in tables)
                   else np.concatenate([t.header_ids for t in tables]))

    def take(self, index: np.ndarray | slice) -> SampleTable:
        """The samples at ``index`` (positions or a slice), in that order; the buffers are shared."""
        keys = self.keys[index] if isinstance(index, slice) else [self.keys[i] for i in index.tolist()]
        return SampleTable(buffers=self.buffers, buffer=self.buffer[index], start=self.start[index],
                           size=self.size[index], labels=self.labels[index], sample_ids=self.sample_ids[index],
                           keys=keys, valid=self.valid[index],
                           targets=None if self.targets is None else self.targets.take(index),
                           header_ids=None if self.header_ids is None else self.header_ids[index])


def pack(samples: Sequence[Sample], valid: Iterable[bool], *, epoch: int = 0, chunk: int = -1, batch: int = -1,
         shared: bool = False, kinds: Sequence[str] = (), pad: float = 0.0) -> EncodedBatch:
    """Concatenate the samples' encoded images into one buffer; labels are the
    samples' parsed ``label`` (the stream checks and parses them); ``kinds``: the target
    kinds read from each sample's fields (:meth:`SampleTable.from_samples`).

    Shape: B samples → data (sum of image sizes,) uint8, offsets (B+1,) int64.
    ``shared=True`` (in DataLoader workers) builds the tensors in shared memory.
    """
    return pack_table(SampleTable.from_samples(samples, valid, kinds), epoch=epoch, chunk=chunk, batch=batch,
                      shared=shared, pad=pad)


def padded_stride(sizes: np.ndarray, pad: float) -> int:
    """The row length of a padded layout of images of ``sizes`` bytes (the largest), or 0 (packed)
    when that layout would take more than ``pad`` times the packed one (``pad`` 0: never)."""
    if pad <= 0 or not len(sizes):
        return 0
    stride, total = int(sizes.max()), int(sizes.sum())
    return stride if 0 < stride * len(sizes) <= pad * total else 0


def pack_table(table: SampleTable, *, epoch: int = 0, chunk: int = -1, batch: int = -1,
               shared: bool = False, pad: float = 0.0, slots: SlotTaker | None = None) -> EncodedBatch:
    """The table's images (and masks), copied once each into one buffer, as an :class:`EncodedBatch`.

    Shape: B samples → data uint8, offsets (B+1,) and sizes (B,) int64; with targets,
    :class:`EncodedTargets` whose tensors share that buffer and ``offsets``'s (a sample not
    valid carries no boxes and an empty mask).
    ``pad`` > 0: image i goes to ``i * stride`` (``stride`` the largest image) when that takes at
    most ``pad`` times the bytes of images one after another: a decoder is then fed the batch as
    one (B, stride) array with the sizes beside it (~1.5 us a sample in DALI's feed, against
    ~5.6 for a list of B arrays; shared/FEED.md). The bytes past an image are left as they are.
    ``shared=True`` (in DataLoader workers) builds the tensors in shared memory: in one of the
    worker's reused ``slots`` where given and one is free (:mod:`gpupipe.stream.slots`).
    """
    n = len(table)
    t = None if table.targets is None else table.targets.only(table.valid)
    rows = 4 + (t is not None and t.box_counts is not None) + (t is not None and t.mask_size is not None)
    nbox = 0 if t is None or t.boxes is None else len(t.boxes)
    head = 24 * nbox  # box labels (int64) and boxes (4 float32) before the images: aligned views
    stride = padded_stride(table.size, pad)
    images = stride * n if stride else int(table.size.sum())
    masks = 0 if t is None or t.mask_size is None else int(t.mask_size.sum())
    total = head + images + masks
    # One storage holds it all — the int64 columns, the bytes, the valid flags — so that a batch
    # crosses from a worker to the training process as one shared-memory segment: torch hands
    # over each storage with a connection to the worker (an authentication round trip and a
    # file descriptor), ~0.3-1 ms a storage, several microseconds a sample for three of them.
    at_bytes = 8 * rows * (n + 1)
    at_valid = at_bytes + total
    slot = -1
    if shared and slots is not None:  # a shared buffer the training process has let go, or a new one
        whole, slot = slots.take(at_valid + n)
    elif shared:  # allocate in shared memory and fill it: no second copy on the way to the main process
        whole = shared_bytes(at_valid + n)
    else:  # in this process: a buffer no earlier batch still holds, without fresh page faults
        whole = torch.from_numpy(_batch_buffer(at_valid + n))
    meta = whole[:at_bytes].view(torch.int64).view(rows, n + 1)
    buffer = whole[at_bytes:at_valid]
    valid = whole[at_valid:].view(torch.bool)
    columns = meta.numpy()
    columns[:] = 0
    if stride:
        columns[0] = np.arange(0, (n + 1) * stride, stride)
    else:
        np.cumsum(table.size, out=columns[0, 1:])
    columns[1, :n], columns[2, :n], columns[3, :n] = table.labels, table.sample_ids, table.size
    valid.numpy()[:] = table.valid
    data = buffer[head:head + images]
    if stride:
        _copy_rows(buffer.numpy()[head:head + images].reshape(n, stride), table)
    else:
        _copy(buffer.numpy().data[head:], table.buffers, table.buffer, table.start, table.size, columns[0, :n])
    targets = None if t is None else _pack_targets(t, table.buffers, buffer, meta, head, images)
    return EncodedBatch(
        data=data, offsets=meta[0], labels=meta[1, :n], sample_ids=meta[2, :n], valid=valid,
        keys=tuple(table.keys), epoch=epoch, chunk=chunk, batch=batch, targets=targets, sizes=meta[3, :n],
        stride=stride, slot=slot,
    )


_ROWS_AT_ONCE = 8 << 10  # rows up to this long are copied whole in one numpy gather (below)


def _copy_rows(rows: np.ndarray, table: SampleTable) -> None:
    """Image ``i`` of ``table`` to the start of ``rows[i]`` (B, stride). Short rows whose image lies
    in the buffer of the first image with a row's length of bytes after its start are copied whole
    in one gather of the buffer's windows (the bytes past an image are of no meaning: a row's tail
    may hold what followed the image where it was read); the others one by one."""
    n, stride = rows.shape
    has = table.size > 0
    rest = np.arange(n)
    if stride <= _ROWS_AT_ONCE and has.any():
        k = int(table.buffer[has][0])
        source = np.frombuffer(table.buffers[k], dtype=np.uint8)
        whole = has & (table.buffer == k) & (table.start + stride <= len(source))
        if whole.all():  # the usual case: one gather straight into the rows, no masks
            rows[...] = _windows(source, stride)[table.start]
            return
        if whole.any():
            rows[whole] = _windows(source, stride)[table.start[whole]]
        rest = np.flatnonzero(has & ~whole)
    _copy(rows.reshape(-1).data, table.buffers, table.buffer[rest], table.start[rest], table.size[rest], rest * stride)


def _windows(source: np.ndarray, width: int) -> np.ndarray:
    """Every ``width`` bytes of ``source`` from each place it has them: (len - width + 1, width), a
    view (numpy's ``sliding_window_view`` without its checks: ~1 us against ~25 us a call)."""
    return np.ndarray((len(source) - width + 1, width), np.uint8, buffer=source, strides=(1, 1))


def _copy(view: memoryview, buffers: tuple, buffer: np.ndarray, start: np.ndarray, size: np.ndarray,
          at: np.ndarray) -> None:
    """Copy pieces ``[start[i], start[i] + size[i])`` of ``buffers[buffer[i]]`` to ``view[at[i]:]``."""
    sources = {i: memoryview(buffers[i]).cast("B") for i in np.unique(buffer[size > 0]).tolist()}
    for i, a, z, to in zip(buffer.tolist(), start.tolist(), size.tolist(), at.tolist()):
        if z:
            view[to:to + z] = sources[i][a:a + z]


def _pack_targets(t: TargetColumns, buffers: tuple, buffer: torch.Tensor, meta: torch.Tensor, head: int,
                  images: int) -> EncodedTargets:
    """The targets' tensors: box labels and boxes at the start of ``buffer``, masks after the
    images, counts and mask offsets in the last rows of ``meta``."""
    n, row = meta.shape[1] - 1, 4
    out: dict[str, torch.Tensor] = {}
    if t.box_counts is not None:
        assert t.boxes is not None and t.box_labels is not None, "boxes come together"
        nbox = len(t.boxes)
        if nbox:
            labels = buffer[:8 * nbox].view(torch.int64)
            boxes = buffer[8 * nbox:24 * nbox].view(torch.float32).view(nbox, 4)
            labels.numpy()[:] = t.box_labels
            boxes.numpy()[:] = t.boxes
        else:  # (an empty slice has no stride to view with another dtype)
            labels, boxes = torch.zeros(0, dtype=torch.int64), torch.zeros(0, 4, dtype=torch.float32)
        meta.numpy()[row, :n] = t.box_counts
        out.update(box_counts=meta[row, :n], boxes=boxes, box_labels=labels)
        row += 1
    if t.mask_size is not None:
        assert t.mask_buffer is not None and t.mask_start is not None, "masks come together"
        offsets = meta.numpy()[row]
        np.cumsum(t.mask_size, out=offsets[1:])
        start = head + images
        _copy(buffer.numpy().data[start:], buffers, t.mask_buffer, t.mask_start, t.mask_size, offsets[:n])
        out.update(mask_data=buffer[start:start + int(offsets[n])], mask_offsets=meta[row])
    return EncodedTargets(**out)


_POOL_MIN = 1 << 20  # smaller batches are cheap to allocate
_POOL_KEEP = 4  # buffers kept per size class: the batches a consumer holds at once, and one more


def _batch_buffer(n: int) -> np.ndarray:
    """``n`` bytes for a batch packed in this process: from a pool of buffers (one pool per
    power-of-two size class), reused only once nothing refers to a batch made in it
    (:class:`~gpupipe.storage.buffers.BufferPool`). A fresh 6 MB buffer per batch of 256 cost
    ~3 us of page faults per sample (docs/benchmarks.md, "Host path (issue 28)")."""
    if n < _POOL_MIN:
        return np.empty(n, dtype=np.uint8)
    return BufferPool.take_sized(n, _POOL_KEEP)

