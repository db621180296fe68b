"""What gpupipe decides from the machine: worker counts from the cores, a stage
thread's own torch threads, and the allocator setting that keeps long-running workers' memory flat."""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from gpupipe.core.types import World

__all__ = ["default_num_workers", "warn_if_more_workers_than_cores", "limit_this_threads_intraop",
           "this_threads_intraop", "fix_malloc_mmap_threshold", "usable_cores"]

log = logging.getLogger(__name__)
_WARNED: set[tuple[int, int]] = set()  # (num_workers, cores per rank) already warned about


def default_num_workers(world: World, *, decode_on_cpu: bool = False) -> int:
    """Workers per rank, chosen from the machine (the rule the docs describe).

    The cores this process may use are shared among the ranks of the node
    (``LOCAL_WORLD_SIZE``). One stays with the training process; the rest stream,
    up to 8 (workers only fetch and parse; raise it for high-latency storage).
    When images are also decoded on the CPU and a rank has 4 cores or fewer, the
    answer is 0: the stream then runs in the decode thread. Worker processes there
    take cores from the decoder, and even an idle one slowed DALI CPU decode in the
    training process (2 cores: 2,050 images/s with 0 workers against 1,376 with 1;
    docs/benchmarks.md, benchmarks/probes.py fork).
    """
    per_rank = _cores()[0] // _local_ranks()
    if decode_on_cpu and per_rank <= 4:
        return 0
    return max(1, min(8, per_rank - 1))


def warn_if_more_workers_than_cores(num_workers: int, world: World, *, decode_on_cpu: bool = False) -> None:
    """Log one warning line (once per count and machine) when ``num_workers`` exceeds the cores
    this rank may use: the workers then take turns on the cores with decoding and the training
    step, and a pass gets no faster, often slower. The line says what the default would pick,
    and why."""
    cores, how = _cores()
    ranks = _local_ranks()
    per_rank = cores // ranks
    if num_workers <= max(1, per_rank) or (num_workers, per_rank) in _WARNED:
        return
    _WARNED.add((num_workers, per_rank))
    default = default_num_workers(world, decode_on_cpu=decode_on_cpu)
    share = f", {per_rank} per rank for the {ranks} ranks of this node (LOCAL_WORLD_SIZE)" if ranks > 1 else ""
    why = ("images are decoded on the CPU and a rank has 4 cores or fewer, so the stream runs in the decode "
           "thread: worker processes would take cores from the decoder" if decode_on_cpu and per_rank <= 4 else
           "one core stays with the training process, the others stream, at most 8")
    log.warning("gpupipe: num_workers=%d, but this process may use %d cores (%s)%s: the workers take turns on "
                "them with decoding and the training step, so a pass gets no faster, and often slower. Leave "
                "num_workers unset: the default picks %d here (%s).", num_workers, cores, how, share, default, why)


def usable_cores() -> int:
    """The cores this process may run on (its affinity; all of the machine's where that is not told)."""
    return _cores()[0]


def _cores() -> tuple[int, str]:
    """The cores this process may run on, and where that number comes from."""
    try:
        return len(os.sched_getaffinity(0)), "os.sched_getaffinity"
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1, "os.cpu_count"


def _local_ranks() -> int:
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@contextlib.contextmanager
def this_threads_intraop(threads: int) -> Iterator[None]:
    """:func:`limit_this_threads_intraop` for a block; the calling thread's count is restored after."""
    import torch

    before = torch.get_num_threads()
    limit_this_threads_intraop(threads)
    try:
        yield
    finally:
        limit_this_threads_intraop(before)


def limit_this_threads_intraop(threads: int | None) -> None:
    """Run torch's CPU ops in the *calling* thread on ``threads`` threads; other threads
    (the training loop's) keep theirs. ``torch.set_num_threads`` would not do: it also
    sets MKL's process-wide count and the default every later thread starts with. With
    torch's OpenMP backend the count is the thread's own OpenMP setting; elsewhere
    (another backend, no OpenMP runtime found) nothing changes."""
    if threads is None:
        return
    import ctypes

    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return
    torch.get_num_threads()  # torch sets this thread's OpenMP count on first use: let it, then override
    try:
        ctypes.CDLL(None).omp_set_num_threads(int(threads))  # the runtime torch loaded; this thread only
    except (OSError, AttributeError):
        pass


def fix_malloc_mmap_threshold(threshold: int = 1 << 20) -> None:
    """Keep large buffers (fetched blocks, batches) out of the glibc heap.

    glibc raises its mmap threshold each time a large mmapped block is freed, after
    which multi-megabyte blocks come from the heap and fragment it: a worker's RSS
    then creeps up over a long epoch. Fixing the threshold stops that. No-op where
    glibc is not the allocator.
    """
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, threshold)  # M_MMAP_THRESHOLD; the process's own libc, no lookup
    except (OSError, AttributeError):
        pass
