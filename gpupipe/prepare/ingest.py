"""Make a shard dataset: ``gpupipe ingest``.

:func:`ingest` turns an image folder (class sub-folders, or flat with a ``labels.csv``),
Parquet files or a Delta table into WebDataset-layout tar shards plus the ``index.json``
manifest, on any fsspec filesystem. It reads the source exactly as the loader reads it in
place -- :func:`~gpupipe.sources.source.resolve` describes it, and the format modules'
readers (:func:`~gpupipe.formats.folder.object_sample`,
:func:`~gpupipe.formats.rowgroups.row_group_samples`) give each sample its key, fields and
label -- so the shards hold the samples (and refuse the sources) that reading in place
gives. Each image's header is then checked with :func:`~gpupipe.formats.imageheader.probe`;
what fails, and every sample the reader finds unusable (a null cell, a label that numbers
no class, an unreadable file), is skipped, logged and listed in the :class:`IngestReport`
-- never dropped silently. The output order is a permutation drawn from ``seed`` (readers
shuffle only within a window, so the order at rest matters) and the same inputs and seed
give byte-identical shards.

The work is cut into tasks of one shard each (:mod:`gpupipe.prepare.tasks`), run on this machine or
on Ray (:mod:`gpupipe.prepare.engines`) — the same bytes either way — and merged into ``index.json``
last. A job interrupted anywhere (its driver or a task killed) is finished by running it again:
the tasks whose shards are whole are not run twice.

:func:`gpupipe.prepare.indexer.index` writes the manifest for shards made elsewhere (e.g. by
``webdataset``) and :func:`gpupipe.tools.sourceinfo.inspect` summarises a dataset. Nothing here prints.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupipe.core.errors import ConfigError, GpupipeError, StorageError
from gpupipe.formats.imageheader import MAX_PIXELS
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.writer import ShardSink
from gpupipe.prepare.engines import ENGINES, Job, run_tasks
from gpupipe.prepare.reencode import Reencode
from gpupipe.prepare.tasks import (
    PARTS_DIR,
    IngestContext,
    IngestTask,
    TaskResult,
    fingerprint,
    in_val_split,
    part_name,
    plan_tasks,
    run_task,
)
from gpupipe.sources.classes import CLASSES_NAME, check_class_names, class_list
from gpupipe.sources.source import ResolvedSource, Source, resolve
from gpupipe.storage.fetch import FetchConfig, Fetcher, is_plain_local, open_filesystem, storage_errors

__all__ = ["IngestReport", "ingest", "in_val_split"]

log = logging.getLogger(__name__)



@dataclass
class IngestReport:
    """What :func:`ingest` wrote, and every input it skipped as ``(path, reason)``; ``tasks`` and
    ``resumed``: the job's tasks and those an interrupted run had finished; ``task_samples`` the
    samples each task wrote, ``slowest`` the slowest task's name and seconds."""

    num_samples: int
    num_shards: int
    bytes: int
    classes: tuple[str, ...]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)  # samples per carved split ({} without one)
    indexes: list[str] = field(default_factory=list)  # the index.json files written
    tasks: int = 0
    resumed: int = 0
    task_samples: list[int] = field(default_factory=list)
    slowest: tuple[str, float] = ("", 0.0)

    def summary(self, max_skipped: int = 10) -> str:
        """A few lines for people: counts, size, speed, the tasks, and the first skipped inputs."""
        rate = self.num_samples / self.seconds if self.seconds > 0 else 0.0
        lines = [f"{self.num_samples} samples in {self.num_shards} shards ({self.bytes / 2**20:.1f} MiB), "
                 f"{len(self.classes)} classes, {len(self.skipped)} skipped, "
                 f"{self.seconds:.1f} s ({rate:.0f} samples/s)"]
        if self.tasks:
            done = f" ({self.resumed} finished by an interrupted run, kept)" if self.resumed else ""
            counts = f", {min(self.task_samples)}-{max(self.task_samples)} samples each" if self.task_samples else ""
            slow = f", slowest {self.slowest[0]} {self.slowest[1]:.1f} s" if self.slowest[0] else ""
            lines.append(f"  {self.tasks} tasks{done}{counts}{slow}")
        if self.splits:
            lines.append("  split: " + ", ".join(f"{name} {n}" for name, n in self.splits.items()))
        lines += [f"  skipped {path}: {reason}" for path, reason in self.skipped[:max_skipped]]
        if len(self.skipped) > max_skipped:
            lines.append(f"  ... and {len(self.skipped) - max_skipped} more skipped")
        return "\n".join(lines)


def ingest(src: str, dst: str, *, shard_size: int = 1000, workers: int = 4,
           storage_options: Mapping[str, Any] | None = None,
           dst_storage_options: Mapping[str, Any] | None = None, seed: int = 0, shuffle: bool = True,
           max_pixels: int | None = MAX_PIXELS, progress: bool = True,
           image_column: str | None = None, label_column: str | None = None, labels: str | None = None,
           classes: Sequence[str] | None = None, classes_from: str | None = None,
           val_fraction: float = 0.0, targets: str | Sequence[str] | None = None,
           annotations: str | None = None, reencode: Reencode | None = None,
           engine: str = "local", processes: int = 1, ray_address: str | None = None) -> IngestReport:
    """Write the images of ``src`` as shards + ``index.json`` (+ ``classes.txt``) under ``dst``.

    ``src``: whatever the loader reads in place -- an image folder (``<class>/<image>``,
    classes sorted by name give the label index; or flat, labelled by its ``labels.csv`` /
    ``labels.json`` or the mapping file ``labels``), a ``.parquet`` file, a folder of them,
    a glob, or a Delta table (``table@v<N>`` for a version) -- read by the same rules
    (:mod:`gpupipe.formats.folder`, :mod:`gpupipe.formats.rowgroups`), ``image_column`` and
    ``label_column`` naming Parquet columns. ``dst_storage_options=None`` reuses
    ``storage_options`` when ``dst`` has the same protocol. A sample keeps the key and fields
    reading in place gives it: ``<path without extension>`` or ``<file>/<row>``, and
    ``{jpg|png|webp|bmp|gif: bytes, "cls": b"<label>"}`` (no ``cls``: unlabelled), and the
    ``json`` (boxes) and ``mask.png`` members a reader gives (:mod:`gpupipe.formats.annotations`),
    copied as they are; ``index.json`` records the target kinds written.

    ``classes`` (or ``classes_from``: an ``index.json``, its folder or a ``classes.txt``, see
    :func:`~gpupipe.sources.classes.class_list`) fixes the class list and so the numbering, e.g. val's from train's
    index; a class of the source that is not in it is refused.

    ``targets`` (``boxes``, ``masks``, both: :func:`~gpupipe.core.targets.target_kinds`) carries
    each image's boxes and mask as the members ``<key>.json`` and ``<key>.mask.png``
    (:mod:`gpupipe.formats.annotations`): an image folder's from its COCO file (``annotations``,
    or found as :func:`~gpupipe.sources.source.resolve` finds it), Parquet's from its ``boxes`` /
    ``box_labels`` and ``mask`` columns. A sample whose targets are unusable is skipped and listed.

    ``val_fraction`` > 0 carves a validation split: ``dst/train/`` and ``dst/val/`` each get
    shards, ``index.json`` and ``classes.txt`` (one class list). Whether an input goes to val
    is :func:`in_val_split` of ``seed`` and its path under ``src``: the same on every run.

    ``reencode`` (:class:`~gpupipe.prepare.reencode.Reencode`: ``max_side`` or ``short_side``, and
    ``quality``) stores larger images smaller, upright and as JPEG, their boxes and masks scaled;
    images small enough already are copied unchanged; ``index.json`` records it (``prepared``).

    Each shard is a task (:mod:`gpupipe.prepare.tasks`: ``shard_size`` inputs of the plan; one
    that skips inputs writes a shorter shard), reading with ``workers`` threads; ``engine``
    ``"local"`` runs them here, ``processes`` at once, ``"ray"`` on the Ray cluster at
    ``ray_address`` (:mod:`gpupipe.prepare.engines`). A rerun after an interruption keeps the
    tasks that finished. Raises ``StorageError`` for a missing source and ``ConfigError`` for bad
    arguments or a source that reading in place refuses too; a task's error stops the job, naming it.
    """
    start = time.perf_counter()
    if shard_size < 1 or workers < 1 or processes < 1:
        raise ConfigError(f"ingest: shard_size, workers and processes must be >= 1, got {shard_size}, {workers} "
                          f"and {processes}")
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"ingest: val_fraction must be in [0, 1) (e.g. 0.1 for 10% validation), got {val_fraction}")
    if engine not in ENGINES:
        raise ConfigError(f"ingest: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    fs, root = open_filesystem(src, storage_options)
    _check_not_inside(src, dst)
    dst_options = _dst_options(src, dst, storage_options, dst_storage_options)
    given = _given_classes(classes, classes_from, _options_like(classes_from, (dst, dst_options),
                                                                (src, storage_options)))
    source = Source(src, dict(storage_options or {}), image_column=image_column, label_column=label_column,
                    labels=labels, classes=given, targets=targets, annotations=annotations)
    fetcher = Fetcher(fs, FetchConfig(concurrency=workers))
    try:
        with storage_errors(src):  # a storage backend's error becomes one line naming src
            resolved = _resolve(fetcher, src, root, source)
    finally:
        fetcher.close()
    manifest = resolved.manifest
    assert manifest is not None, "_resolve gives a source read in place, which a manifest describes"
    skipped: list[tuple[str, str]] = []
    for path, reason in resolved.skipped:
        _skip(skipped, path, reason)
    tasks = plan_tasks(resolved, seed=seed, shuffle=shuffle, shard_size=shard_size, val_fraction=val_fraction)
    settings = {"src": src, "seed": seed, "shuffle": shuffle, "shard_size": shard_size, "val_fraction": val_fraction,
                "max_pixels": max_pixels, "reencode": reencode, "classes": manifest.classes,
                "targets": resolved.targets, "image_column": image_column, "label_column": label_column,
                "annotations": annotations, "labels": labels}
    context = IngestContext(src, resolved, dst, dst_options, manifest.classes, seed, shuffle, max_pixels, reencode,
                            workers, fingerprint(resolved, settings, tasks))
    splits = ("train", "val") if val_fraction else ("",)
    with storage_errors(dst):  # a storage backend's error (no credentials, say) becomes one line naming dst
        release = _claim(dst, dst_options)  # before anything is written: a second run refuses, naming this one
    try:
        with storage_errors(dst):
            results = _finished(context, tasks)
        resumed = len(results)
        if resumed:
            log.info("ingest: %d of %d tasks finished by an interrupted run into %s: kept", resumed, len(tasks), dst)
        _run(tasks, results, context, engine=engine, processes=processes, ray_address=ray_address, progress=progress)
        with storage_errors(dst):
            return _merge(context, tasks, results, splits, skipped, start, resumed)
    finally:
        release()


def _run(tasks: Sequence[IngestTask], results: dict[tuple[str, int], TaskResult], context: IngestContext, *,
         engine: str, processes: int, ray_address: str | None, progress: bool) -> None:
    """The tasks not finished yet, run on ``engine``, with a progress bar (images/s, ETA) over all inputs."""
    from tqdm import tqdm

    pending = [t for t in tasks if (t.split, t.number) not in results]
    total = sum(len(t) for t in tasks)
    with tqdm(total=total, initial=total - sum(len(t) for t in pending), disable=not progress, file=sys.stderr,
              unit="img", desc="ingest") as bar:
        def on_result(task: IngestTask, result: TaskResult) -> None:
            results[(task.split, task.number)] = result
            bar.update(len(task))
            bar.set_postfix_str(f"{len(results)}/{len(tasks)} tasks")

        job = Job(run_task, context, "ingest", "What the finished tasks wrote is kept: run the same command again "
                  "to finish the rest", local=context.dst.startswith("memory://"))
        run_tasks(job, pending, engine=engine, processes=processes, ray_address=ray_address, on_result=on_result)


def _finished(context: IngestContext, tasks: Sequence[IngestTask]) -> dict[tuple[str, int], TaskResult]:
    """The tasks an interrupted run of this very job finished (their part files, for the same plan,
    and their shards there, whole); parts of another plan are removed, and so is what a killed
    writer left under a temporary name."""
    fs, root = open_filesystem(context.dst, context.dst_options)
    root = root.rstrip("/")
    parts = f"{root}/{PARTS_DIR}"
    if not fs.exists(parts):
        return {}
    wanted = {part_name(t.split, t.number): t for t in tasks}
    out: dict[tuple[str, int], TaskResult] = {}
    stale = 0
    for path in sorted(fs.ls(parts, detail=False)):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if ".partial-" in name:
            fs.rm_file(path)
            continue
        try:
            plan, result = TaskResult.from_json(fs.cat_file(path))
        except (ValueError, KeyError, TypeError, GpupipeError):
            plan, result = "", None
        task = wanted.get(name)
        if result is None or plan != context.fingerprint or task is None or _shard_gone(fs, root, result):
            stale += 1
            fs.rm_file(path)
            continue
        out[(task.split, task.number)] = result
    if stale:
        log.warning("ingest: %d task results in %s were of another run (other settings or source) or lost their "
                    "shard: those tasks run again", stale, parts)
    for folder in [root] + [f"{root}/{s}" for s in ("train", "val")]:
        if is_plain_local(fs) and os.path.isdir(folder):
            for leftover in os.listdir(folder):
                if leftover.startswith(".") and ".partial-" in leftover:
                    os.unlink(os.path.join(folder, leftover))
    return out


def _shard_gone(fs: Any, root: str, result: TaskResult) -> bool:
    """Whether a finished task's shard is missing, or not the size its part says."""
    if result.entry is None:
        return False
    path = f"{root}/{result.split + '/' if result.split else ''}{result.entry.name}"
    try:
        return int(fs.size(path)) != result.entry.size
    except FileNotFoundError:
        return True


def _merge(context: IngestContext, tasks: Sequence[IngestTask], results: Mapping[tuple[str, int], TaskResult],
           splits: tuple[str, ...], skipped: list[tuple[str, str]], start: float, resumed: int) -> IngestReport:
    """Each split's shards, in plan order, as its ``index.json`` (after its ``classes.txt``); then the
    job's own files go. The report of it all."""
    done = [results[(t.split, t.number)] for t in tasks]
    reencode = context.reencode
    prepared = {"reencode": reencode.record(sum(r.changed for r in done), sum(r.kept for r in done))} \
        if reencode is not None else None
    dst = context.dst.rstrip("/")
    manifests = {}
    for split in splits:
        sink = ShardSink(f"{dst}/{split}" if split else dst, storage_options=context.dst_options)
        entries = tuple(r.entry for r in done if r.split == split and r.entry is not None)
        if context.classes:
            sink.put(CLASSES_NAME, "".join(c + "\n" for c in context.classes).encode())
        manifests[split] = Manifest(shards=entries, classes=context.classes, prepared=prepared)
        sink.put(MANIFEST_NAME, manifests[split].to_json().encode())
    fs, root = open_filesystem(context.dst, context.dst_options)
    try:
        fs.rm(f"{root.rstrip('/')}/{PARTS_DIR}", recursive=True)
    except FileNotFoundError:
        pass
    for r in done:
        skipped.extend(r.skipped)
    slow = max(done, key=lambda r: r.seconds, default=None)
    return IngestReport(sum(m.num_samples for m in manifests.values()), sum(len(m.shards) for m in manifests.values()),
                        sum(m.total_bytes for m in manifests.values()), tuple(context.classes), skipped,
                        time.perf_counter() - start, {s: m.num_samples for s, m in manifests.items() if s},
                        [f"{dst}/{s + '/' if s else ''}{MANIFEST_NAME}" for s in manifests], tasks=len(tasks),
                        resumed=resumed, task_samples=[0 if r.entry is None else r.entry.num_samples for r in done],
                        slowest=(slow.name, slow.seconds) if slow is not None else ("", 0.0))


LOCK_NAME = ".gpupipe-ingest.lock"  # in the destination while a run writes it


def _claim(dst: str, options: Any) -> Callable[[], None]:
    """Make ``dst`` this run's alone, until the returned call: a lock file naming the run (host,
    pid, start) made before anything is written. A lock there already refuses the run, naming
    the one that holds it — unless that run is gone (on this host, its process no longer exists):
    then it is taken over, with a warning. On object storage the check and the put are two
    requests (a run starting in between is not seen); on a local disk the file is made exclusively."""
    fs, root = open_filesystem(dst, options)
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    path = f"{root}/{LOCK_NAME}"
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    held = _lock_of(fs, path)
    if held is not None:
        if not _gone(held):
            raise ConfigError(f"ingest: {dst} is being written by another `gpupipe ingest` (pid {held.get('pid')} on "
                              f"{held.get('host')}, since {held.get('started')}); wait for it to end, or delete "
                              f"{path} if that run is gone")
        log.warning("ingest: taking over %s: the run it names (pid %s on %s) is gone", path, held.get("pid"),
                    held.get("host"))
        fs.rm_file(path)
    data = json.dumps(me).encode()
    if is_plain_local(fs):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:  # another run made it since we looked
            return _claim(dst, options)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    else:
        fs.pipe_file(path, data)

    def release() -> None:
        try:
            fs.rm_file(path)
        except OSError:
            log.warning("ingest: could not remove %s; delete it before the next run", path)

    return release


def _lock_of(fs: Any, path: str) -> dict | None:
    """The run a lock file names (``{}`` when it cannot be read), or None when there is none."""
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        held = json.loads(raw)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def _gone(held: Mapping[str, Any]) -> bool:
    """Whether the run a lock names has ended: only knowable on this host (its pid no longer runs)."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def _dst_options(src: str, dst: str, src_options, dst_options):
    if dst_options is not None:
        return dst_options
    return src_options if _protocol(src) == _protocol(dst) else None


def _options_like(url: str | None, *known: tuple[str, Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """The storage options of the first ``(url, options)`` on ``url``'s protocol."""
    for other, options in known:
        if url is not None and _protocol(url) == _protocol(other):
            return options
    return None


def _check_not_inside(src: str, dst: str) -> None:
    """Refuse a destination inside the source: a second run would ingest the shards."""
    if _protocol(src) != _protocol(dst):
        return
    s, d = _bare(src), _bare(dst)
    if d == s or d.startswith(s + "/"):
        raise ConfigError(f"ingest: the destination {dst!r} is inside the source {src!r}; write it elsewhere")


def _bare(url: str) -> str:
    path = url.split("://", 1)[-1].rstrip("/")
    return os.path.abspath(path) if _protocol(url) == "file" else path


def _resolve(fetcher: Fetcher, src: str, root: str, source: Source) -> ResolvedSource:
    """The source as the loader reads it in place, described afresh (an ``index.json`` in it is
    not trusted); tar shards, other files and a missing source are refused."""
    resolved = resolve(source, fetcher.config, use_index=False)
    if resolved.manifest is not None and resolved.manifest.table is not None:
        return resolved
    if any(ch in root for ch in "*?["):
        raise ConfigError(f"ingest: a glob source must match .parquet files only ({src!r}); "
                          "for images give the folder that holds them")
    if not fetcher.call(src, "exists"):
        raise StorageError("no such folder or .parquet file", url=src)
    raise ConfigError(f"ingest: {src!r} is not an image folder, Parquet files or a Delta table (it reads as tar "
                      "shards, which is what ingest writes: read them as they are)")


def _given_classes(classes: Sequence[str] | None, classes_from: str | None,
                   options: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    if classes is not None and classes_from is not None:
        raise ConfigError("ingest: give the class list or where to read it from (--classes or --classes-from), "
                          "not both")
    if classes_from is not None:
        return class_list(classes_from, storage_options=options)
    return None if classes is None else check_class_names(classes, "ingest: --classes")


def _skip(skipped: list, name: str, reason: str) -> None:
    log.warning("skipping %s: %s", name, reason)
    skipped.append((name, reason))
