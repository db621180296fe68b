"""Ranks agree before they start: one collective when a loader is built under torch.distributed.

Every rank plans the epoch by itself, from its own settings and its own copy of the index; the
plan gives each rank its part only if every rank computes the same plan. A rank with another
seed, batch size or shuffle window, or one that reads another copy of the data (a shard missing
on one node, an index rewritten on another), takes a part that overlaps its neighbours' and
leaves samples unread — with no error — or takes another number of steps and hangs in the next
collective. So when a loader is built under an initialised process group, each rank sends what
its plan depends on (:func:`facts_of`: a small dict, with a digest of the index) in one
``all_gather_object``, and :func:`check_agreement` — a pure function — names what differs and on
which ranks. Every rank gets the same answer, so every rank raises, at once: none is left
waiting in a later collective. A rank whose own setup failed (storage not found, a bad index)
still takes part, sending its error, so that the others raise too instead of waiting for it.

The check runs when the loader is built, not at its first ``iter()``: construction happens once
per rank, in the same order on every rank (Lightning builds loaders in ``setup``, after the
process group), while iteration runs in the decode thread and may be started on some ranks only
(validation on rank 0). A loader built before ``init_process_group`` cannot be checked (there is
no one to ask yet): it logs a warning saying so. A loader for one rank (``world_size=1``) in a
multi-rank job takes no part: it is one process's own, e.g. an evaluation on rank 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from gpupipe.core.errors import ConfigError
from gpupipe.core.types import World
from gpupipe.formats.folder import NameList
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.plan import plan_identity

__all__ = ["manifest_digest", "facts_of", "check_agreement", "device_clashes", "unindexed_under_ranks",
           "start_in_agreement"]

log = logging.getLogger(__name__)

# What the plan depends on, in the order a disagreement is reported, with the name it is reported by.
COMPARED: dict[str, str] = {
    "split": "the split being built (do the ranks build their loaders in the same order?)",
    "gpupipe": "the gpupipe version",
    "world_size": "world_size",
    "seed": "seed",
    "batch_size": "batch_size",
    "shuffle": "shuffle",
    "drop_last": "drop_last",
    "chunk_batches": "the shuffle window (stream.shuffle_buffer // batch_size batches)",
    "source": "the kind of source",
    "num_shards": "the number of units (shards, objects or row groups)",
    "num_samples": "the number of samples",
    "counts_crc32": "the samples per unit (CRC-32 of the counts)",
    "data": "the data (digest of the index: names, sizes, checksums, labels)",
}
# Not compared: stream.unit_batches (a worker's unit of work, issue 34) changes neither the batches
# nor their order, so ranks may differ in it, as in num_workers; a resume may change it too.
# A field left out of the message when one of these already differs (it says nothing more).
IMPLIED = {"counts_crc32": ("num_shards", "num_samples"), "data": ("num_shards", "num_samples", "counts_crc32")}
HEX = {"counts_crc32", "data"}
LOCAL_RANK_NAMES = "LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or PMI_LOCAL_RANK"

_warned_unchecked = False


# -- what a rank sends ---------------------------------------------------------------------------
def manifest_digest(manifest: Manifest | None) -> str:
    """16 hex digits over everything the index says: units, names, sizes, checksums, offsets,
    labels, classes. Names are relative to the index, so two copies of the same data at other
    URLs have the same digest."""
    if manifest is None:
        return "none"
    h = hashlib.blake2b(digest_size=8)
    _feed(h, manifest)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Add ``value`` to the hash ``h``, tagged with its type and length so that no two values
    collide by concatenation."""
    if value is None or isinstance(value, (bool, int, float)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(data) + data)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        h.update(b"b%d:" % len(value) + bytes(value))
    elif isinstance(value, np.ndarray):
        h.update(f"a{value.dtype.str}{value.shape}:".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"d{type(value).__name__}:".encode())
        for f in dataclasses.fields(value):
            _feed(h, f.name)
            _feed(h, getattr(value, f.name))
    elif isinstance(value, NameList):  # a million names: its blob, not an object per name
        _feed(h, "names")
        for part in value.packed():
            _feed(h, part)
    elif isinstance(value, Sequence):
        h.update(b"l%d:" % len(value))
        for v in value:
            _feed(h, v)
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def facts_of(loader: Any) -> dict[str, Any]:
    """What ``loader``'s plan depends on (plain data): the plan's inputs, the kind of source and a
    digest of its index; plus where it runs (not compared, but checked: each process its own
    rank of the plan and its own GPU)."""
    manifest = loader.source.manifest
    kind = loader.source.kind
    facts: dict[str, Any] = {
        "split": loader.split.name,
        "gpupipe": _version(),
        **plan_identity(loader.spec),
        "world_size": loader.spec.world_size,
        "source": f"{kind} shards without {MANIFEST_NAME}" if manifest is None else kind,
        "data": manifest_digest(manifest),
    }
    return {**facts, **_placement(loader)}


def _placement(loader: Any) -> dict[str, Any]:
    device, gpu = loader.split.device, None
    if device is not None and torch.cuda.is_available():
        d = torch.device(device)
        if d.type == "cuda":
            gpu = _gpu_identity(d.index if d.index is not None else torch.cuda.current_device())
    return {"rank": loader.world.rank, "local_rank": loader.world.local_rank, "host": socket.gethostname(),
            "device": None if device is None else str(device), "gpu": gpu}


def _gpu_identity(index: int) -> str:
    """The physical GPU behind ``cuda:index`` in this process: its UUID, else its entry of
    ``CUDA_VISIBLE_DEVICES``, else the index."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        return f"GPU-{uuid}" if not str(uuid).startswith("GPU-") else str(uuid)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return f"GPU {visible[index]}" if index < len(visible) else f"GPU {index}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpupipe")
    except PackageNotFoundError:
        return "unknown"


# -- pure checks -------------------------------------------------------------------------------------
def check_agreement(facts: Sequence[Mapping[str, Any]]) -> str | None:
    """``facts[r]`` is what process-group rank ``r`` sent (:func:`facts_of`, or ``{"error": ...}``
    when its own setup failed). ``None`` when the ranks can plan together; else one message
    naming every difference and the ranks on each side."""
    failed = {r: f["error"] for r, f in enumerate(facts) if "error" in f}
    if failed:
        first = min(failed)
        return (f"{_ranks(list(failed))} could not build the loader, so no rank starts; "
                f"rank {first}: {failed[first]}")
    problems = []
    differs = {k for k in COMPARED if len({_key(f.get(k)) for f in facts}) > 1}
    for key, name in COMPARED.items():
        if key in differs and not any(k in differs for k in IMPLIED.get(key, ())):
            problems.append(f"{name}: {_sides([f.get(key) for f in facts], hexed=key in HEX)}")
    if problems:
        return ("ranks disagree on " + "; ".join(problems) + ". Every rank must build its loader with the same "
                "settings over the same data (the same copy, with the same index), or the ranks' parts of the "
                "epoch overlap and leave samples out")
    return rank_coverage(facts) or device_clashes(facts)


def rank_coverage(facts: Sequence[Mapping[str, Any]]) -> str | None:
    """Every rank of the plan is some process's (a plan rank with none: its samples are never
    read). Several processes may share one (e.g. tensor-parallel peers reading the same data)."""
    world_size = int(facts[0]["world_size"])
    taken: dict[int, list[int]] = {}
    for process, f in enumerate(facts):
        taken.setdefault(int(f["rank"]), []).append(process)
    missing = [r for r in range(world_size) if r not in taken]
    if not missing:
        return None
    shared = "; ".join(f"{_ranks(p, 'process')} all build it as rank {r}" for r, p in sorted(taken.items()) if len(p) > 1)
    return (f"no process builds the loader as {_ranks(missing)} of world_size {world_size}, so those parts of the "
            f"epoch are never read{': ' + shared if shared else ''}. Give each process its own rank (or leave "
            "rank and world_size unset: they come from torch.distributed)")


def device_clashes(facts: Sequence[Mapping[str, Any]]) -> str | None:
    """Two processes on one host decoding on one GPU: usually every rank on ``cuda:0`` because
    the launcher's local rank was not found. ``facts[r]`` needs ``host``, ``gpu`` (the physical
    GPU, ``None`` off CUDA), ``device`` and ``local_rank``."""
    on: dict[tuple[str, str], list[int]] = {}
    for process, f in enumerate(facts):
        if f.get("gpu") is not None:
            on.setdefault((str(f["host"]), str(f["gpu"])), []).append(process)
    clashes = [(host, gpu, ps) for (host, gpu), ps in on.items() if len(ps) > 1]
    if not clashes:
        return None
    parts = []
    for host, gpu, ps in clashes:
        devices = sorted({str(facts[p]["device"]) for p in ps})
        locals_ = sorted({int(facts[p]["local_rank"]) for p in ps})
        parts.append(f"{_ranks(ps)} on host {host} would all decode on {gpu} ({', '.join(devices)}; local "
                     f"rank{'s' if len(locals_) > 1 else ''} {', '.join(map(str, locals_))})")
    return ("; ".join(parts) + f". Each process needs its own GPU: the local rank picks it ({LOCAL_RANK_NAMES}, "
            "whichever the launcher sets), or give each process its device (device='cuda:N')")


def unindexed_under_ranks(world_size: int, has_index: bool, url: Any) -> str | None:
    """Tar shards without ``index.json`` on more than one rank: refused, with the way out."""
    if world_size <= 1 or has_index:
        return None
    where = url if isinstance(url, str) else (url[0] if url else "")
    return (f"{where}: tar shards without {MANIFEST_NAME} cannot be split evenly across {world_size} ranks (whole "
            "shards per rank give each rank another number of steps, and DDP then hangs or crashes). Write the "
            f"index once: `gpupipe index {shlex.quote(str(where))}` (it reads each shard once and writes {MANIFEST_NAME} beside "
            "them); without it, read the shards in one process only")


def _key(value: Any) -> str:
    return repr(value)


def _sides(values: Sequence[Any], *, hexed: bool) -> str:
    """``rank 0 has 0, ranks 1-3 have 1``: the ranks holding each value, in order of first rank."""
    groups: dict[str, list[int]] = {}
    shown: dict[str, str] = {}
    for rank, v in enumerate(values):
        k = _key(v)
        groups.setdefault(k, []).append(rank)
        shown[k] = f"{v:08x}" if hexed and isinstance(v, int) else repr(v) if isinstance(v, str) and not hexed \
            else str(v)
    return ", ".join(f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {shown[k]}" for k, rs in groups.items())


def _ranks(ranks: Sequence[int], word: str = "rank") -> str:
    """``rank 3``, ``ranks 0, 1``, ``ranks 0-5, 8`` (runs of three or more as a range)."""
    rs = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts += [f"{rs[i]}-{rs[j]}"] if j - i >= 2 else [str(r) for r in rs[i:j + 1]]
        i = j + 1
    if len(parts) > 12:
        parts = parts[:12] + [f"... ({len(rs)} in all)"]
    plural = word + ("es" if word.endswith("s") else "s")
    return f"{plural if len(rs) > 1 else word} {', '.join(parts)}"


# -- the collective ----------------------------------------------------------------------------------
def start_in_agreement(loader: Any, start: Callable[[], None]) -> None:
    """Run ``start`` (the loader's own setup) and, when ranks start together under
    torch.distributed, check in one ``all_gather_object`` that they agree; raise
    ``ConfigError`` on every rank where they do not. Tar shards without an index are refused
    on more than one rank."""
    dist = _group_for(loader.world)
    if dist is None:
        start()
        _refuse_unindexed(loader)
        return
    failure: Exception | None = None
    try:
        start()
        mine = facts_of(loader)
    except Exception as exc:  # sent to the others, raised here after the collective
        failure, mine = exc, {"error": f"{type(exc).__name__}: {exc}"}
    gathered: list[Any] = [None] * dist.get_world_size()
    try:
        with _object_device(dist, loader):
            dist.all_gather_object(gathered, mine)
    except Exception:
        if failure is not None:
            raise failure from None
        raise
    if failure is not None:
        raise failure
    problem = check_agreement(gathered)
    if problem is not None:
        raise ConfigError(problem)
    _refuse_unindexed(loader)


def _refuse_unindexed(loader: Any) -> None:
    problem = unindexed_under_ranks(loader.world.world_size, loader.source.manifest is not None,
                                    loader.split.source.url)
    if problem is not None:
        raise ConfigError(problem)


def _group_for(world: World) -> Any:
    """``torch.distributed`` when this loader's ranks are the group's (initialised, more than one
    rank on both sides); else ``None``, with a warning once when several ranks cannot be checked."""
    import torch.distributed as dist

    up = dist.is_available() and dist.is_initialized()
    if up and world.world_size > 1 and dist.get_world_size() > 1:
        return dist
    global _warned_unchecked
    if not up and world.world_size > 1 and not _warned_unchecked:
        _warned_unchecked = True
        log.warning("gpupipe: rank %d of %d built its loader before torch.distributed was initialised, so the ranks "
                    "cannot check that they agree on the seed, the settings and the data; build loaders after "
                    "init_process_group", world.rank, world.world_size)
    return None


def _object_device(dist: Any, loader: Any) -> contextlib.AbstractContextManager:
    """A group that carries objects on CUDA only (NCCL alone) uses the current device: make it
    this rank's decode device, so that ranks do not all meet on ``cuda:0``."""
    backend = str(dist.get_backend())
    if "gloo" in backend or "cpu" in backend or not torch.cuda.is_available():
        return contextlib.nullcontext()
    device = torch.device(loader.split.device) if loader.split.device is not None else None
    if device is None or device.type != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return torch.cuda.device(device.index)
