"""The data path's numbers where users already look: rates between two readings of a loader.

"Is data loading my bottleneck?" is answered by how long the training loop waited for its next
batch, as a share of the time that passed: :func:`rates` turns two :func:`reading` s of a
:class:`~gpupipe.loader.gpu.GpuLoader` (cumulative counters and a clock) into

* ``images_per_s``: images delivered per second of wall time;
* ``wait_ms_per_step``: the training loop's wait for a ready batch, per batch (ms);
* ``wait_share``: that wait over the wall time (0: data never held the step back; near 1: the
  GPU waited for data all the time);
* ``decode_busy`` / ``augment_busy``: the decode and augment threads' busy time over the wall time
  (their shares overlap: the stages run at once);
* ``bytes_per_s``: encoded bytes from the workers per second (the images and targets delivered);
* ``read_bytes_per_s``: bytes the workers read from storage per second (tar headers, members not
  used, re-reads and cache blocks included: against ``bytes_per_s``, what the reads cost over
  what they bring);
* ``io_wait_share``: the workers' wait for storage over the wall time, summed over workers;
* ``requests_per_s`` and ``cache_hit_rate``: storage requests per second, and the share of blocks
  the block cache (``fetch.cache_dir``) answered (0 without a cache);
* ``skipped``: samples replaced since the start (cumulative).

:class:`Meter` keeps the previous reading, so ``meter.read()`` is "since the last call": what
``GpuLoader.metrics()`` returns and the Lightning callback (:mod:`gpupipe.lightning`) logs under
``data/``; at each epoch's end :func:`gather_rows` and :func:`spread` compare the ranks (the
slowest rank's wait against the median's, named with its host). Plain data in, plain floats out:
nothing here touches a device.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Reading", "reading", "rates", "Meter", "RankRow", "spread", "gather_rows"]


class _Loader(Protocol):
    stats: Any
    encoded: Any


@dataclass(frozen=True)
class Reading:
    """A loader's cumulative counters at one moment (``t``: ``time.perf_counter()``)."""

    t: float
    batches: int
    images: int
    wait_s: float
    decode_s: float
    augment_s: float
    bytes: int
    io_wait_s: float
    skipped: int
    requests: int = 0
    cache_hits: int = 0
    read_bytes: int = 0


def reading(loader: _Loader) -> Reading:
    """The counters of a ``GpuLoader`` now (its stage stats and its workers' stream stats)."""
    s, e = loader.stats, loader.encoded.stats
    return Reading(t=time.perf_counter(), batches=s.batches, images=s.images, wait_s=s.handoff_wait_s,
                   decode_s=s.decode_s, augment_s=s.augment_s, bytes=e.bytes, io_wait_s=e.fetch.wait_s,
                   skipped=s.skipped, requests=e.fetch.requests, cache_hits=e.fetch.cache_hits,
                   read_bytes=e.fetch.bytes)


def rates(before: Reading, after: Reading) -> dict[str, float]:
    """The numbers of the module docstring between two readings (zeros when no time passed or
    no batch came: a counter that went back — stats reset — counts from zero)."""
    dt = after.t - before.t

    def delta(name: str) -> float:
        a, b = getattr(after, name), getattr(before, name)
        return a - b if a >= b else a

    batches, requests, hits = delta("batches"), delta("requests"), delta("cache_hits")
    per_s = (lambda x: x / dt) if dt > 0 else (lambda x: 0.0)
    return {"images_per_s": per_s(delta("images")),
            "wait_ms_per_step": 1000.0 * delta("wait_s") / batches if batches else 0.0,
            "wait_share": min(1.0, per_s(delta("wait_s"))),
            "decode_busy": per_s(delta("decode_s")),
            "augment_busy": per_s(delta("augment_s")),
            "bytes_per_s": per_s(delta("bytes")),
            "read_bytes_per_s": per_s(delta("read_bytes")),
            "io_wait_share": per_s(delta("io_wait_s")),
            "requests_per_s": per_s(requests),
            "cache_hit_rate": hits / (hits + requests) if hits + requests else 0.0,
            "skipped": float(after.skipped)}


class Meter:
    """Rates since the previous :meth:`read` (the first: since the meter was made)."""

    def __init__(self, loader: _Loader):
        self.loader = loader
        self.last = reading(loader)

    def read(self) -> dict[str, float]:
        now = reading(self.loader)
        out, self.last = rates(self.last, now), now
        return out


@dataclass(frozen=True)
class RankRow:
    """One rank's data path over an epoch, as every rank sends it to rank 0."""

    rank: int
    host: str
    wait_ms_per_step: float
    images_per_s: float


def spread(rows: list[RankRow], *, factor: float = 2.0, floor_ms: float = 1.0) -> tuple[dict[str, float], str | None]:
    """The ranks' spread (``wait_ms_max``, ``wait_ms_median``, ``slowest_rank``, ``images_per_s_min``)
    and a warning when the slowest rank waited more than ``factor`` times the median of the others
    (and more than ``floor_ms`` a step: microseconds apart are noise), naming it and its host; else
    ``None``. Under DDP every rank waits for the slowest at each step, so one slow node slows them all."""
    slow = max(rows, key=lambda r: (r.wait_ms_per_step, -r.rank))
    others = statistics.median(r.wait_ms_per_step for r in rows if r is not slow) if len(rows) > 1 else 0.0
    out = {"wait_ms_max": slow.wait_ms_per_step, "wait_ms_median": statistics.median(r.wait_ms_per_step for r in rows),
           "slowest_rank": float(slow.rank), "images_per_s_min": min(r.images_per_s for r in rows)}
    warn = None
    if len(rows) > 1 and slow.wait_ms_per_step > max(factor * others, floor_ms):
        warn = (f"rank {slow.rank} on {slow.host} waited {slow.wait_ms_per_step:.1f} ms a step for data, the other "
                f"ranks {others:.1f} ms (median): every rank waits for it at each step. Look at that machine's "
                f"storage, cores and load (docs/tuning.md, \"Is data my bottleneck?\")")
    return out, warn


def gather_rows(row: RankRow) -> list[RankRow]:
    """Every rank's row, on every rank (one collective); ``[row]`` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [row]
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return rows
