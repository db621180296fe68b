"""What one timed run costs besides time: CPU (process + children), peak RSS, GPU.

:class:`Sampler` polls in a thread every ``interval`` seconds: the resident set of
this process plus its child processes (Linux ``/proc``; the sum counts pages shared
between a parent and its forked workers more than once, so it is an upper bound), and
the GPU's utilisation (``torch.cuda.utilization()``, which needs ``pynvml``).
:func:`cpu_seconds` reads ``resource.getrusage`` for this process and its waited-for
children, and ``/proc`` for the children still running (persistent workers).
"""
from __future__ import annotations

import os
import resource
import threading
from typing import Any

__all__ = ["cpu_seconds", "thread_cpu", "threads_cpu", "children_cpu", "Sampler", "gpu_note", "tree_rss_mb", "environment"]


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children, running or ended
    (:func:`children_cpu`: a loader's persistent workers live on between passes, and
    ``RUSAGE_CHILDREN`` alone would leave them out)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu()


def _rss_kb(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> set[str]:
    out: set[str] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(f.read().split())
    except OSError:
        pass
    return out


def tree_rss_mb() -> float:
    """RSS of this process plus its children, MB (0 where /proc is missing)."""
    return (_rss_kb("self") + sum(_rss_kb(p) for p in _children())) / 1024


def gpu_note() -> str | None:
    """Why GPU utilisation is not reported, or None when it is."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: GPU utilisation and memory omitted"
    try:
        torch.cuda.utilization()
    except Exception as exc:  # noqa: BLE001 - ModuleNotFoundError (pynvml) or an NVML error
        return f"GPU utilisation omitted ({type(exc).__name__}: {exc}); install pynvml to report it"
    return None


class Sampler:
    """``with Sampler() as s:`` … then ``s.result()``: peak tree RSS and mean GPU utilisation."""

    def __init__(self, interval: float = 0.1, gpu_util: bool = False):
        self.interval, self.gpu_util = interval, gpu_util
        self.peak_mb = 0.0
        self.util: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpupipe-bench-sampler")

    def _run(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, tree_rss_mb())
            if self.gpu_util:
                import torch

                self.util.append(float(torch.cuda.utilization()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_rss_mb": round(self.peak_mb, 1)}
        if self.util:
            out["gpu_util_percent"] = round(sum(self.util) / len(self.util), 1)
        return out


def environment() -> dict[str, Any]:
    """The machine and the versions a result was measured with."""
    import datetime
    import platform
    import subprocess

    import torch

    env: dict[str, Any] = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                           "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
                           "cpu": _cpu_model(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                           "loadavg_at_end": [round(v, 2) for v in os.getloadavg()]}
    for module, attr in (("nvidia.dali", "__version__"), ("webdataset", "__version__"), ("PIL", "__version__"),
                         ("kornia", "__version__"), ("torchvision", "__version__"), ("numpy", "__version__")):
        try:
            env[module.split(".")[-1]] = getattr(__import__(module, fromlist=["_"]), attr)
        except Exception:  # noqa: BLE001 - missing, or a mismatched build (torchvision with this torch)
            env[module.split(".")[-1]] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    try:
        env["gpupipe_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                               text=True, timeout=5, cwd=os.path.dirname(__file__)).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["gpupipe_commit"] = None
    return env


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


_NATIVE_THREADS = ("[DALI]", "nvimgcodec", "nvjpeg")  # the native decoder's own threads, by name prefix


def threads_cpu() -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) of each thread of this process alive now, by (thread id, name)
    (``/proc/self/task/*/stat``; a thread that ended meanwhile is left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[(int(task), name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process so far: ``native`` in the native decoder's
    own threads (DALI names its ``[DALI] Executor``, ``[DALI][TPn]Exec``, ...; read from
    ``/proc/self/task/*/stat``), ``outside`` in all the others — the Python side that has to
    keep the decoder fed (the process's total from ``getrusage``, which keeps the CPU of
    threads that ended, less ``native``). A native decoder's threads live as long as its
    pipeline: take both readings while the decoder lives."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    native = sum(seconds for (_, name), seconds in threads_cpu().items() if name.startswith(_NATIVE_THREADS))
    return {"outside": own.ru_utime + own.ru_stime - native, "native": native}


def children_cpu() -> float:
    """CPU seconds of this process's child processes (DataLoader workers) so far: those waited
    for (``getrusage``) and those still running or not yet waited for (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = done.ru_utime + done.ru_stime
    for pid in _children():
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def time_epochs(loader: Any, epochs: int, each: Any = None) -> float:
    """Run one warm-up epoch of a ``GpuLoader`` (worker start, decoder build), reset its ``stats``
    (and its ``timeline``, where the bench installed one), then time ``epochs`` epochs, calling
    ``each(batch)`` on every timed batch when given: their wall seconds (``loader.stats`` holds
    their stages). Benchmark instrumentation: here, not in the loader."""
    import time

    from gpupipe.loader.gpu import StageStats

    for _ in loader:
        pass
    loader.stats = StageStats()
    if loader.timeline is not None:
        loader.timeline.clear()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            if each is not None:
                each(batch)
    return time.perf_counter() - t0
