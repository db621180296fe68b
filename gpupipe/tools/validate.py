"""``gpupipe validate``: pre-flight a dataset before a long training run.

Reads every sample of a source — tar shards (a folder, pattern or list of them), an image
folder or Parquet files read in place, or a config's split — runs the same pre-decode header
checks the loader runs (magic bytes, declared size, ``max_pixels``, a complete file), then
really decodes each image with the backend training would use (``--decode auto|dali|pil``),
and collects everything that failed: unreadable tar data, objects or row groups, samples
without an image (a null Parquet cell) or with a non-integer label, checksum mismatches
against ``index.json``, bad headers and undecodable images. A native backend (DALI, nvJPEG)
decodes in a child process (:mod:`gpupipe.tools.validate_child`): if a file kills the decoder,
the command names the batch, narrows it to the file(s) that do it alone (kind ``decoder
crash``) and goes on, where it used to exit 139 with nothing printed. How each kind of source is read,
and what ``shard``/``key``/``offset`` name for it: :mod:`gpupipe.tools.validate_read`. Files of an
image folder that the loader does not read as images (``notes.txt``) are listed as skipped,
not quarantined: training never sees them.

Exit codes: ``0`` every sample is good; ``1`` something was quarantined (the summary says
what, by kind); ``2`` bad input, one line on stderr: a missing path, a bad config, or a
source the loader could not open at all (a Parquet file whose footer is damaged: no
``on_error: skip`` gets past that, so there is nothing to quarantine).

The quarantine list (``--quarantine FILE``) has one line per bad sample: JSON lines
(``{"shard", "key", "offset", "kind", "reason"}``) when FILE ends in ``.jsonl`` or
``.json``, else tab-separated ``shard<TAB>key<TAB>offset<TAB>kind<TAB>reason`` after one
``#`` header line. For tar shards ``offset`` is the byte offset of the sample's first tar
header in the shard, and a problem that ends a shard (damaged tar data) has an empty
``key``; for an image folder ``shard`` is the image's URL and ``key`` its sample key (its
path in the folder without the extension: what ``batch.keys`` and the loader's log say); for
Parquet ``shard`` is the file, ``key`` ``row <n>`` and ``offset`` ``n``. How to use it:

* training survives these samples with ``decode.on_error: skip`` (each is replaced, counted
  and its key logged); the list tells you up front which they are and why;
* :func:`read_quarantine` gives the ``(shard, key)`` pairs, e.g. to drop them while
  rewriting shards with :class:`gpupipe.formats.writer.ShardSink` and ``gpupipe index``,
  to move bad images out of a folder, or to fix the source images and run ``gpupipe
  ingest`` again.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpupipe.core.errors import ConfigError, DecodeError
from gpupipe.formats.imageheader import MAX_PIXELS
from gpupipe.prepare.engines import Job, UnitRange, results_in_order, unit_ranges
from gpupipe.tools.validate_child import Crash
from gpupipe.tools.validate_read import Good, Problem

if TYPE_CHECKING:
    from gpupipe.sources.source import Source

__all__ = ["Problem", "Report", "validate", "write_quarantine", "read_quarantine", "add_arguments", "run"]

log = logging.getLogger(__name__)

EXIT_CLEAN, EXIT_QUARANTINED = 0, 1
_DECODE_SIZE = (8, 8)  # the decode check resizes to this: every image is decoded in full, the batch stays dense
# (substring of a header-check message, kind) — the first match names the kind
_HEADER_KINDS = (("truncated", "truncated"), ("exceeds max_pixels", "too many pixels"), ("empty data", "empty"),
                 ("not an image", "not an image"), ("unsupported image format", "unsupported format"),
                 ("absurd", "bad size"), ("has no pixels", "bad size"))


@dataclass
class Report:
    """What :func:`validate` found: samples checked, units read (``shards``: tar shards,
    images or row groups; ``units`` says which, in words), the problems, the files of
    an image folder that the loader skips (``(path, why)``: not samples, not problems), and
    each death of the decoding child process (:class:`~gpupipe.tools.validate_child.Crash`)."""

    checked: int = 0
    shards: int = 0
    backend: str = ""
    problems: list[Problem] = field(default_factory=list)
    units: str = ""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)

    def by_kind(self) -> dict[str, int]:
        return dict(collections.Counter(p.kind for p in self.problems).most_common())


# ------------------------------------------------------------------------------------ stages

def _check_headers(items: Iterable[Good | Problem], max_pixels: int | None) -> Iterator[Good | Problem]:
    """The loader's pre-decode checks on each image: magic bytes, declared size, complete file."""
    from gpupipe.formats.imageheader import check_complete, probe

    for item in items:
        if isinstance(item, Good):
            try:
                check_complete(item.image, probe(item.image, max_pixels=max_pixels))
            except DecodeError as exc:
                reason = str(exc)
                kind = next((k for needle, k in _HEADER_KINDS if needle in reason), "bad header")
                item = Problem(item.shard, item.key, item.offset, kind, reason)
        yield item


def _decode_all(items: Iterable[Good | Problem], check: Callable[[list[tuple[str, bytes]]], list[str | None]],
                batch_size: int) -> Iterator[Good | Problem]:
    """Decode the images that passed so far, a batch at a time (``check``: their verdicts,
    :func:`gpupipe.tools.validate_child.verdicts` in this process or in a child)."""
    pending: list[Good] = []
    for item in items:
        if isinstance(item, Problem):
            yield item
            continue
        pending.append(item)
        if len(pending) == batch_size:
            yield from _decoded(pending, check)
            pending = []
    yield from _decoded(pending, check)


def _decoded(goods: Sequence[Good], check) -> Iterator[Good | Problem]:
    if not goods:
        return
    for good, reason in zip(goods, check([(g.key, g.image) for g in goods])):
        if reason is None:
            yield good
        else:
            kind = "decoder crash" if reason.startswith("decoder crash") else "decode failed"
            yield Problem(good.shard, good.key, good.offset, kind, reason)


def _checker(decode: str, device, max_pixels: int | None, crashes: list) -> tuple[Callable, Callable[[], None], str]:
    """(verdicts of a batch, close, "backend on device") for ``decode``: Pillow in this process;
    a native backend (DALI, nvJPEG) in a child process, where its crash costs one batch."""
    from dataclasses import replace

    from gpupipe.core.types import ErrorPolicy
    from gpupipe.decode import BACKENDS, DecodeConfig, make_decoder
    from gpupipe.tools.validate_child import ChildDecoder, contained_verdicts, verdicts

    config = DecodeConfig(backend=decode, image_size=_DECODE_SIZE, on_error=ErrorPolicy.RAISE, max_pixels=max_pixels)
    decoder = make_decoder(config, device or "cpu")  # resolves auto, refuses what cannot run here; builds nothing yet
    decoder.stats.warn_stretched = False  # its 8x8 resize is the check's, not the user's (the child does the same)
    where = f"{decoder.name} on {decoder.device}"
    if not BACKENDS[decoder.name].native:  # it cannot take the process down: no child needed
        return functools.partial(verdicts, decoder), decoder.close, where
    decoder.close()
    child = ChildDecoder(replace(config, backend=decoder.name), str(decoder.device))
    return functools.partial(contained_verdicts, child, crashes=crashes), child.close, f"{where}, in a child process"


# ------------------------------------------------------------------------------------ driver

def validate(url: str | Sequence[str] | Source, *, storage_options: Mapping | None = None, decode: str = "auto",
             device=None, max_pixels: int | None = MAX_PIXELS, batch_size: int = 32,
             progress: bool = False, engine: str = "local", processes: int = 1,
             ray_address: str | None = None) -> Report:
    """Check every sample under ``url`` (a URL, a list of them, or a
    :class:`~gpupipe.sources.source.Source` naming Parquet columns, a labels file or classes);
    returns a :class:`Report` (nothing is raised for bad samples; a missing source or bad
    arguments raise ``GpupipeError``/``OSError``). With ``processes`` > 1 or ``engine="ray"`` the
    units are checked as tasks (:class:`UnitRange`: a shard, a row group or 1,000 images each) where
    they run (:mod:`gpupipe.prepare.engines`), each with its own decoder: the same report."""
    from tqdm import tqdm

    from gpupipe.sources.source import Source, resolve
    from gpupipe.storage.fetch import Fetcher
    from gpupipe.tools.validate_read import skipped_files

    if batch_size < 1 or processes < 1:
        raise ConfigError(f"--batch-size and --processes: must be >= 1, got {batch_size} and {processes}")
    source = url if isinstance(url, Source) else Source(url, dict(storage_options or {}))
    resolved = resolve(source)
    _refuse_empty(source.url, resolved)
    report = Report(shards=len(resolved.shard_urls), units=_units(resolved))
    context = ValidateContext(resolved, decode, device, max_pixels, batch_size)
    fetcher = Fetcher.for_url(resolved.shard_urls[0], resolved.storage_options)
    try:
        report.skipped = skipped_files(fetcher, resolved)
    finally:
        fetcher.close()
    with tqdm(total=resolved.num_samples, disable=not progress, file=sys.stderr, unit="img", desc="validate") as bar:
        if engine == "local" and processes == 1:
            _check_units(context, None, report, bar.update)
        else:
            _check_tasks(context, report, bar.update, engine=engine, processes=processes, ray_address=ray_address)
    order = {u: i for i, u in enumerate(resolved.shard_urls)}
    report.problems.sort(key=lambda p: (order.get(p.shard, -1), p.offset))  # batches decode out of order
    return report


@dataclass(frozen=True)
class ValidateContext:
    """What every task of a validate needs: the source as described at start, and how to check."""

    resolved: Any
    decode: str
    device: Any
    max_pixels: int | None
    batch_size: int

    @property
    def unit_urls(self) -> Any:
        return self.resolved.shard_urls


def validate_units(context: ValidateContext, task: UnitRange | None) -> Report:
    """Check the samples of ``task``'s units (all, for ``None``) with a decoder of its own: a
    report of them (``checked``, ``problems``, ``crashes``, ``backend``)."""
    report = Report()
    _check_units(context, task, report, lambda n: None)
    return report


def _check_units(context: ValidateContext, task: UnitRange | None, report: Report, tick: Callable[[int], Any]) -> None:
    from gpupipe.storage.fetch import Fetcher
    from gpupipe.tools.validate_read import read_samples

    resolved = context.resolved
    check, close, report.backend = _checker(context.decode, context.device, context.max_pixels, report.crashes)
    fetcher = Fetcher.for_url(resolved.shard_urls[0], resolved.storage_options)
    try:
        units = None if task is None else range(task.start, task.stop)
        items = _decode_all(_check_headers(read_samples(fetcher, resolved, units), context.max_pixels), check,
                            context.batch_size)
        for item in items:
            if isinstance(item, Problem):
                report.problems.append(item)
            if isinstance(item, Good) or item.key:
                report.checked += 1
                tick(1)
    finally:
        fetcher.close()
        close()


def _check_tasks(context: ValidateContext, report: Report, tick: Callable[[int], Any], *, engine: str,
                 processes: int, ray_address: str | None) -> None:
    parts = results_in_order(
        Job(validate_units, context, "validate", local=context.resolved.shard_urls[0].startswith("memory://")),
        unit_ranges(len(context.resolved.shard_urls), context.resolved.kind), engine=engine, processes=processes,
        ray_address=ray_address, tick=lambda task, part: tick(part.checked))
    for part in parts:
        report.checked += part.checked
        report.problems += part.problems
        report.crashes += part.crashes
        report.backend = report.backend or part.backend


def _refuse_empty(url, resolved) -> None:
    if resolved.manifest is None or resolved.manifest.table is None:  # tar shards
        if resolved.shard_urls and resolved.num_samples != 0:
            return
        raise ConfigError(f"{url}: the dataset is empty: its index.json lists {len(resolved.shard_urls)} shard(s) and "
                          "no samples (an ingest that found no images?); ingest a folder of <class>/<image> files "
                          "again")
    if resolved.num_samples == 0:
        raise ConfigError(f"{url}: the dataset is empty: {_units(resolved)} hold no samples; give data with "
                          "images in it")


def _units(resolved) -> str:
    """What was read, in words: ``3 shard(s)``, ``1 image folder``, ``4 row group(s) in 2 Parquet file(s)``."""
    m = resolved.manifest
    if m is None or m.table is None:
        return f"{len(resolved.shard_urls)} shard(s)"
    if m.parquet is not None:
        return f"{len(resolved.shard_urls)} row group(s) in {len(m.parquet.files)} Parquet file(s)"
    return f"1 {m.container.title}" if m.container.reads == "objects" else \
        f"{len(resolved.shard_urls)} {m.container.unit}(s) of {m.container.title}"


def write_quarantine(path: str, problems: Sequence[Problem]) -> None:
    """Write the quarantine list (format by suffix: ``.jsonl``/``.json`` JSON lines, else TSV)."""
    import fsspec

    with fsspec.open(path, "w", encoding="utf-8") as f:
        if _is_json(path):
            f.writelines(p.to_json() + "\n" for p in problems)
            return
        f.write("# shard\tkey\toffset\tkind\treason\n")
        for p in problems:
            f.write("\t".join((p.shard, p.key, str(p.offset), p.kind, " ".join(p.reason.split()))) + "\n")


def read_quarantine(path: str) -> list[Problem]:
    """The problems a quarantine file lists (either format); ``{(p.shard, p.key) for p in ...}``
    is the set to exclude."""
    import fsspec

    out: list[Problem] = []
    with fsspec.open(path, "r", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            try:
                if _is_json(path):
                    d = json.loads(line)
                    out.append(Problem(d["shard"], d["key"], int(d["offset"]), d["kind"], d["reason"]))
                else:
                    shard, key, offset, kind, reason = line.rstrip("\n").split("\t", 4)
                    out.append(Problem(shard, key, int(offset), kind, reason))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}, line {n}: not a quarantine entry ({exc})") from None
    return out


def _is_json(path: str) -> bool:
    return path.lower().endswith((".jsonl", ".json"))


# ------------------------------------------------------------------------------------ command

def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpupipe.tools.cliargs import device_option, engine_arguments, storage_arguments

    p.add_argument("url", nargs="?", help="shard folder, image folder, Parquet folder or glob, index.json, shard "
                                          "pattern (or give --config)")
    p.add_argument("--config", metavar="FILE", help="validate a split of this pipeline config instead of URL")
    p.add_argument("--split", default="train", help="the config's split (default train)")
    p.add_argument("--decode", default=None, choices=["auto", "dali", "nvjpeg", "pil"],
                   help="decode backend for the check (default: the config's, else auto)")
    p.add_argument("--device", default=None, type=device_option, help="decode device: cpu (default) or cuda[:N]")
    p.add_argument("--max-pixels", type=int, default=None, metavar="N",
                   help=f"refuse images declaring more pixels (default: the config's, else {MAX_PIXELS})")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="images decoded at once (default 32)")
    p.add_argument("--quarantine", metavar="FILE",
                   help="write the bad samples here (.jsonl: JSON lines; else tab-separated)")
    p.add_argument("--show", type=int, default=10, metavar="N", help="bad samples to list (default 10)")
    engine_arguments(p, "where the units (a shard, a row group or 1,000 images each) are checked")
    storage_arguments(p, what="the data")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.epilog = "exit status: 0 all good, 1 some samples quarantined, 2 bad input"


def _target(args: argparse.Namespace) -> tuple[str | Sequence[str] | Source, dict, str, int | None]:
    """(url or Source, storage options, backend, max_pixels) from the command line or the config."""
    if (args.url is None) == (args.config is None):
        raise ConfigError("give a dataset URL or --config FILE (one of them)")
    if args.config is None:
        max_pixels = args.max_pixels if args.max_pixels is not None else MAX_PIXELS
        return args.url, dict(args.storage_options), args.decode or "auto", max_pixels
    from dataclasses import replace

    from gpupipe.config.schema import load_config
    from gpupipe.sources.annotated import first_url
    from gpupipe.sources.mixed import MixedSource

    config = load_config(args.config)
    source = config.split(args.split).source  # with the config's classes and Parquet columns
    if isinstance(source, MixedSource):
        raise ConfigError(f"source.{args.split} is a mix of {len(source.parts)} sources; validate each on its own: "
                          + "; ".join(f"gpupipe validate {first_url(s.url)}" for s in source.parts))
    options = {**source.storage_options, **dict(args.storage_options)}
    max_pixels = args.max_pixels if args.max_pixels is not None else config.decode.max_pixels
    return replace(source, storage_options=options), options, args.decode or config.decode.backend, max_pixels


def run(args: argparse.Namespace) -> int:
    url, options, backend, max_pixels = _target(args)
    report = validate(url, storage_options=options, decode=backend, device=args.device, max_pixels=max_pixels,
                      batch_size=args.batch_size, progress=not args.quiet, engine=args.engine,
                      processes=args.processes, ray_address=args.ray_address)
    bad = sum(1 for p in report.problems if p.key)
    print(f"gpupipe validate: {report.checked} samples in {report.units}, decoded with {report.backend}: "
          f"{report.checked - bad} good, {len(report.problems)} quarantined")
    for kind, count in report.by_kind().items():
        print(f"  {kind:<18} {count}")
    for p in report.problems[:max(0, args.show)]:
        print(f"  {_where(p)}: {p.reason}")
    if len(report.problems) > args.show > 0:
        print(f"  ... and {len(report.problems) - args.show} more")
    for crash in report.crashes:
        print(f"  {crash.describe()}")
    if report.skipped:
        print(f"skipped {len(report.skipped)} file(s) that are not images (the loader skips them too; not "
              "quarantined):")
        for path, why in report.skipped[:3]:
            print(f"  {path}: {why}")
    if args.quarantine:
        write_quarantine(args.quarantine, report.problems)
        print(f"quarantine list: {args.quarantine} ({len(report.problems)} entries)")
    return EXIT_QUARANTINED if report.problems else EXIT_CLEAN


def _where(p: Problem) -> str:
    """Where a problem is, for a person: an image's URL, a Parquet file and row, a tar shard,
    key and offset."""
    from gpupipe.formats.folder import object_key

    if p.key and any(object_key(p.shard, keep).endswith("/" + p.key) for keep in (False, True)):
        return p.shard  # an image of a folder (its key is its path without, or with, the extension)
    if p.key.startswith("row "):
        return f"{p.shard}, {p.key}"
    return f"{p.shard}#{p.key or '(rest of shard)'} @{p.offset}"
