"""The ``gpupipe`` command line.

Usage::

    gpupipe ingest SRC DST [--shard-size N] [--workers N] [--seed N] [--no-shuffle] [--engine local|ray]
                           [--max-pixels N] [--image-column NAME] [--label-column NAME] [--labels URL]
                           [--classes A,B,C | --classes-from URL] [--val-fraction F]
                           [--targets boxes,masks] [--annotations URL]
                           [--storage-option KEY=VALUE ...] [--dst-storage-option KEY=VALUE ...]
    gpupipe index URL [--workers N] [--checksums] [--image-column NAME] [--label-column NAME] [--labels URL]
                      [--engine local|ray] [--processes N] [--ray-address ADDR]
                      [--storage-option KEY=VALUE ...]
    gpupipe synth DST [--images N] [--size W[xH]] [--classes N] [--targets boxes,masks] [--shard-size N] [--seed N]
    gpupipe inspect URL [--keys N] [--json] [--storage-option KEY=VALUE ...]
                        [--shuffle [--batches N] [--batch-size N] [--shuffle-buffer N] [--seed N]]
    gpupipe demo [--root DIR] [--images N] [--size PX] [--batch-size N] [--epochs N] [--workers N]
                 [--image-size PX] [--decode BACKEND] [--augment simple|complex|none]
    gpupipe fit --config FILE [LightningCLI options ...]   (gpupipe/tools/fit.py)
    gpupipe validate (URL | --config FILE [--split S]) [--decode BACKEND] [--quarantine FILE]
                     [--max-pixels N] [--storage-option KEY=VALUE ...]   (gpupipe/tools/validate.py; exit 1: bad samples)
    gpupipe preview --config FILE [--split S] [--n N] [--out PNG] [--epoch N] [--seed-offset N]
                    [--compare]   (gpupipe/tools/preview.py)
    gpupipe bench CONFIG.yaml... | SOURCE [--compare baseline,webdataset,dali] [--workers 0,1,2]
                  [--batches N] [--repeat R] [--json [PATH]] [--plot PNG]   (gpupipe/tools/bench/cli.py)
    gpupipe bench --make-data paper|imagenet --images N --root DIR
    gpupipe bench SOURCE --stage host [--workers N] [--repeat R]    (the host path alone, beside DALI's reader)

Each subcommand is an entry of ``_COMMANDS``: ``name -> (help, add_arguments, run)``, where
``add_arguments(parser)`` declares its options and ``run(args) -> int`` does the work and
prints. Errors gpupipe raises on purpose, ``OSError`` (e.g. a missing source) and the storage
backends' own errors (botocore's "Unable to locate credentials", worded with what to set) become one
line ``gpupipe: error: <message>`` on stderr and exit code 2, without a traceback. Storage
options are passed on, never printed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import MappingProxyType

from gpupipe.core.errors import GpupipeError
from gpupipe.formats.imageheader import MAX_PIXELS
from gpupipe.tools.cliargs import (  # (light: see cliargs)
    decode_argument,
    engine_arguments,
    setting_argument,
    storage_arguments,
)

__all__ = ["COMMANDS", "main"]

EXIT_ERROR = 2
PASS_THROUGH = frozenset({"fit"})  # commands whose unknown options belong to another parser
AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


class _UsageError(Exception):
    """A bad command line, raised instead of argparse's print-usage-and-exit."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block; main() prints it
        raise _UsageError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------- ingest


def _ingest_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="image folder (SRC/<class>/<image>, or flat with a labels.csv), a .parquet file, a "
                               "folder of them, a glob or a Delta table: what the loader reads in place")
    p.add_argument("dst", help="folder (any fsspec URL) for the shards and index.json")
    p.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default 1000)")
    p.add_argument("--workers", type=int, default=4, metavar="N", help="concurrent reads (default 4)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the shuffled order (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the sorted source order")
    p.add_argument("--max-pixels", type=int, default=MAX_PIXELS, metavar="N",
                   help=f"skip images declaring more pixels than this (default {MAX_PIXELS})")
    p.add_argument("--image-column", metavar="NAME", help="Parquet image-bytes column (default: detected)")
    p.add_argument("--label-column", metavar="NAME", help="Parquet label column (default: label/labels/cls/class/target)")
    p.add_argument("--labels", metavar="URL", help="labels file of a flat image folder (default: its labels.csv/.json)")
    p.add_argument("--classes", type=lambda t: t.split(","), metavar="A,B,C",
                   help="the class list, in label order (default: the source's classes, sorted)")
    p.add_argument("--classes-from", metavar="URL",
                   help="take the class list from another split's index.json (or its folder, or a classes.txt)")
    p.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="carve a validation split: DST/train/ and DST/val/, each input in val with probability F, "
                        "a pure function of --seed and its path (default 0: no split)")
    p.add_argument("--targets", metavar="KINDS", help="carry boxes and/or masks (boxes, masks, boxes+masks): from a "
                   "COCO instances_*.json of an image folder, or Parquet's boxes/box_labels and mask columns; "
                   "written as <key>.json and <key>.mask.png")
    p.add_argument("--annotations", metavar="URL", help="the COCO instances_*.json of an image folder (default: the "
                   "one in it, or <parent>/annotations/instances_<folder>.json)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--max-side", type=int, metavar="N", help="re-encode images whose longer side exceeds N to N "
                      "(upright, JPEG, boxes and masks scaled); smaller ones are copied unchanged")
    size.add_argument("--short-side", type=int, metavar="N", help="the same for the shorter side (e.g. 256 for "
                      "training at 224)")
    p.add_argument("--quality", type=int, default=90, metavar="Q", help="JPEG quality of re-encoded images (default 90)")
    engine_arguments(p, "where the tasks (a shard each) run", processes="cores")
    storage_arguments(p)
    storage_arguments(p, "--dst-storage-option", "dst_storage_options",
                       "the destination (default: those of the source, for the same protocol)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _ingest_run(args: argparse.Namespace) -> int:
    from gpupipe.prepare.ingest import ingest

    report = ingest(args.src, args.dst, shard_size=args.shard_size, workers=args.workers, seed=args.seed,
                    shuffle=not args.no_shuffle, max_pixels=args.max_pixels, progress=not args.quiet,
                    storage_options=dict(args.storage_options),
                    dst_storage_options=dict(args.dst_storage_options) if args.dst_storage_options else None,
                    image_column=args.image_column, label_column=args.label_column, labels=args.labels,
                    classes=args.classes,
                    classes_from=args.classes_from, val_fraction=args.val_fraction, targets=args.targets,
                    annotations=args.annotations, reencode=_reencode(args), engine=args.engine,
                    processes=args.processes, ray_address=args.ray_address)
    print(report.summary())
    print("wrote " + ", ".join(report.indexes))
    return 0


def _reencode(args: argparse.Namespace):
    if args.max_side is None and args.short_side is None:
        return None
    from gpupipe.prepare.reencode import Reencode

    return Reencode(max_side=args.max_side, short_side=args.short_side, quality=args.quality)


# ---------------------------------------------------------------- index


def _index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="folder of *.tar shards, images or .parquet files, a brace pattern or a glob (one folder)")
    p.add_argument("--workers", type=int, default=4, metavar="N", help="concurrent block reads (default 4)")
    p.add_argument("--checksums", action="store_true", help="images/Parquet: read every byte once for CRC-32 checks")
    p.add_argument("--image-column", metavar="NAME", help="Parquet image column (default: detected)")
    p.add_argument("--label-column", metavar="NAME", help="Parquet label column (default: label/labels/cls/class/target)")
    p.add_argument("--labels", metavar="URL", help="labels file of a flat image folder (default: its labels.csv/.json)")
    engine_arguments(p, "where each tar shard is scanned, or with --checksums each 1,000 images or row group read")
    storage_arguments(p, what="the shards")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _index_run(args: argparse.Namespace) -> int:
    from gpupipe.prepare.indexer import index, index_in_place

    options = dict(args.storage_options)
    manifest = index_in_place(args.url, storage_options=options, workers=args.workers, checksums=args.checksums,
                              image_column=args.image_column, label_column=args.label_column, labels=args.labels,
                              progress=not args.quiet, engine=args.engine, processes=args.processes,
                              ray_address=args.ray_address) or index(args.url, storage_options=options,
                                                                workers=args.workers, progress=not args.quiet,
                                                                engine=args.engine, processes=args.processes,
                                                                ray_address=args.ray_address)
    units = manifest.container.units
    print(f"indexed {manifest.num_samples} samples in {manifest.num_units} {units} "
          f"({manifest.total_bytes / 2**20:.1f} MiB), {len(manifest.classes)} classes")
    return 0


# ---------------------------------------------------------------- inspect


def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    from gpupipe.tools.sourceinfo import SHUFFLE_BATCHES

    p.add_argument("url", help="dataset folder (tar shards, images or Parquet), index.json, shard pattern or glob")
    p.add_argument("--keys", type=int, default=5, metavar="N", help="how many first keys to show (default 5)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    storage_arguments(p, what="the data")
    g = p.add_argument_group(
        "shuffle quality", "--shuffle reads the first batches the loader gives with these settings (shuffled, rank 0, "
        "epoch 0) and prints the most common label's mean share of a batch and the mean number of labels in a "
        "batch, each beside a uniform shuffle of the same labels (those of the batches read: classes they never "
        "reach do not count). Shards written in class order with too small a shuffle window show e.g. 66 % "
        "(uniform: 13 %) and 2.8 labels (uniform: 10.0); the loader then warns. Set stream.shuffle_block "
        "to a few samples (the default for tar shards read cheaply), raise stream.shuffle_buffer, or write the "
        "shards shuffled (docs/tuning.md, \"Is my shuffle mixing classes?\").")
    g.add_argument("--shuffle", action="store_true", help="measure how well the shuffle mixes labels (reads samples)")
    g.add_argument("--batches", type=int, default=SHUFFLE_BATCHES, metavar="N",
                   help=f"batches to read for --shuffle (default {SHUFFLE_BATCHES})")
    setting_argument(g, "batch_size", what="batch size for --shuffle")
    setting_argument(g, "shuffle_buffer", what="shuffle window in samples for --shuffle")
    setting_argument(g, "shuffle_block", what="samples of a shard kept together for --shuffle (0: shards whole)",
                     default_text="4 for tar shards read cheaply, else 0")
    setting_argument(g, "seed", what="seed of the shuffle for --shuffle")


def _inspect_run(args: argparse.Namespace) -> int:
    from gpupipe.formats.containers import container
    from gpupipe.tools.sourceinfo import inspect, shuffle_lines, shuffle_mixing

    info = inspect(args.url, storage_options=dict(args.storage_options), keys=args.keys)
    if args.shuffle:
        info["shuffle"] = shuffle_mixing(args.url, storage_options=dict(args.storage_options), batches=args.batches,
                                         batch_size=args.batch_size, shuffle_buffer=args.shuffle_buffer,
                                         shuffle_block=args.shuffle_block, seed=args.seed)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    unknown = "unknown (no index.json; run `gpupipe index`)"
    classes = info["classes"]
    kind = container(info["kind"])
    print(f"url:      {info['url']}")
    print(f"kind:     {kind.title}" + (" (read in place)" if kind.in_place else ""))
    print(_inspect_units(info))
    print(f"samples:  {info['samples'] if info['samples'] is not None else unknown}")
    print(f"bytes:    {_inspect_size(info['bytes']) if info['bytes'] is not None else unknown}")
    print(f"classes:  {len(classes)}" + (f" ({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''})" if classes else ""))
    if "image_column" in info:  # Parquet
        print(f"columns:  image={info['image_column']}, label={info['label_column'] or 'none (labels are -1)'}")
    if info["fields"]:
        print(f"fields:   {', '.join(info['fields'])}")
    if info["targets"] is not None:
        print(f"targets:  {', '.join(info['targets']) or 'none'} (in every shard, says index.json)")
    print("first objects:" if kind.reads == "objects" else f"first keys ({info['first_shard']}):")
    for key, targets in itertools.zip_longest(info["first_keys"], info["first_targets"]):
        print(f"  {key}" + (f"  {_inspect_targets(targets)}" if targets is not None else ""))
    if "shuffle" in info:
        print("\n".join(shuffle_lines(info["shuffle"])))
    return 0


def _inspect_targets(targets: dict) -> str:
    if "error" in targets:
        return f"(bad .json: {targets['error']})"
    return f"({targets['boxes']} box{'es' if targets['boxes'] != 1 else ''}{', mask' if targets['mask'] else ''})"


def _inspect_units(info: dict) -> str:
    """``shards:   8``, ``units:    10 images`` or ``units:    4 row groups in 2 files``."""
    if "units" not in info:  # tar shards
        return f"shards:   {info['shards']}"
    n, unit = info["units"], info["unit"]
    files = f" in {info['files']} file{'s' if info['files'] != 1 else ''}" if "image_column" in info else ""
    return f"units:    {n} {unit}{'s' if n != 1 else ''}{files}"


def _inspect_size(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front: ``43.0 MiB``, ``5.2 KiB``, ``310 B``."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"


# ---------------------------------------------------------------- synth


def _synth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", help="folder (any fsspec URL) for the shards and index.json")
    p.add_argument("--images", type=int, default=64, metavar="N", help="samples to write (default 64)")
    p.add_argument("--size", default="64x48", metavar="W[xH]", help="image width x height in pixels (default 64x48)")
    p.add_argument("--classes", type=int, default=3, metavar="N", help="object classes (default 3)")
    p.add_argument("--targets", default="boxes,masks", metavar="KINDS",
                   help="what each sample carries beside its image: boxes (.json), masks (.mask.png), both "
                        "(default boxes,masks), or none (a .cls label: classification)")
    p.add_argument("--shard-size", type=int, default=100, metavar="N", help="samples per shard (default 100)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="the same seed writes the same bytes (default 0)")
    storage_arguments(p, what="the destination")


def _synth_run(args: argparse.Namespace) -> int:
    from gpupipe.core.targetkinds import target_kinds
    from gpupipe.tools.synth import write_detection_shards

    try:
        w, _, h = args.size.lower().partition("x")
        size = (int(w), int(h or w))
    except ValueError:
        raise GpupipeError(f"--size: {args.size!r} is not W or WxH in pixels, e.g. 64x48") from None
    if min(size) < 4 or args.images < 1 or args.classes < 1 or args.classes > 254 or args.shard_size < 1:
        raise GpupipeError("synth: --size needs sides >= 4, --images and --shard-size >= 1, --classes 1..254")
    kinds = target_kinds(args.targets, "--targets")
    m = write_detection_shards(args.dst, num_images=args.images, size=size, num_classes=args.classes, targets=kinds,
                               seed=args.seed, shard_size=args.shard_size, storage_options=dict(args.storage_options))
    print(f"wrote {m.num_samples} samples ({size[0]}x{size[1]}, {args.classes} classes, targets: "
          f"{', '.join(kinds) or 'none'}) in {len(m.shards)} shards under {args.dst}")
    return 0


# ---------------------------------------------------------------- demo

def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="demo-data", help="folder for the sample images and shards (kept between runs)")
    p.add_argument("--images", type=int, default=2000, help="number of sample JPEGs to generate")
    p.add_argument("--size", type=int, default=250, help="side of the square sample images, in pixels")
    setting_argument(p, "batch_size", default=128, what="samples per batch")
    p.add_argument("--epochs", type=int, default=3, help="epochs to stream (the first one is a warm-up)")
    setting_argument(p, "num_workers", "--workers", what="DataLoader workers", default_text="chosen from the machine")
    setting_argument(p, "image_size", default=128, what="side of the decoded square images")
    decode_argument(p)
    p.add_argument("--augment", default="simple", choices=["simple", "complex", "none"],
                   help="transform set applied after decode (the docs' simple or complex set)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="run this pipeline config's training loader (e.g. configs/quickstart.yaml) instead of "
                        "--batch-size/--image-size/--decode/--augment")


def _demo_run(args: argparse.Namespace) -> int:
    from gpupipe.tools.demo import run_demo

    if args.epochs < 2:
        raise GpupipeError("--epochs must be >= 2 (the first epoch is a warm-up)")
    config = None
    if args.config is not None:
        from gpupipe.config.schema import load_config

        config = load_config(args.config)
    r = run_demo(args.root, images=args.images, size=args.size, batch_size=args.batch_size,
                 image_size=args.image_size, epochs=args.epochs, num_workers=args.num_workers, decode=args.decode,
                 augment=None if args.augment == "none" else args.augment, config=config)
    print(f"gpupipe demo: {r.images} JPEGs ({args.size}x{args.size}) in {r.shards} shards under {args.root}/shards")
    if config is not None:
        h, w = config.decode.image_size or ("?", "?")
        steps = ", ".join(s.name for s in config.augment) or "none"
        size, augment = f"{h}x{w}", f" -> augment ({steps})"
    else:
        size = f"{args.image_size}x{args.image_size}"
        augment = "" if args.augment == "none" else f" -> augment ({args.augment} set, float32)"
    print(f"pipeline: stream ({r.num_workers} worker(s)) -> decode ({r.backend} on {r.device}, "
          f"{size}){augment}, batches of {r.batch_size}")
    _print_stages(r.stages, r.seconds)
    return 0


def _print_stages(stages: dict, seconds: float) -> None:
    print(f"throughput: {stages['images'] / seconds:,.0f} images/s ({stages['images']} images in {seconds:.2f} s)")
    print(f"stages (s): waiting for bytes {stages['wait_bytes_s']:.2f} | decode {stages['decode_s']:.2f} | "
          f"augment {stages['augment_s']:.2f} | training loop waiting {stages['handoff_wait_s']:.2f} | "
          f"skipped images {stages['skipped']}")


# ---------------------------------------------------------------- bench

def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from gpupipe.tools.bench.cli import add_arguments

    add_arguments(p)


def _bench_run(args: argparse.Namespace) -> int:
    from gpupipe.tools.bench.cli import run

    return run(args)


# ---------------------------------------------------------------- main

_COMMANDS: dict[str, tuple[str, AddArguments, Run]] = {
    "ingest": ("turn an image folder or Parquet files into shards + index.json", _ingest_arguments, _ingest_run),
    "index": ("write index.json for tar shards, an image folder or Parquet files", _index_arguments, _index_run),
    "inspect": ("summarise a dataset and show its first keys; --shuffle: how well the shuffle mixes labels",
                _inspect_arguments, _inspect_run),
    "synth": ("write generated detection/segmentation shards (images, boxes, masks)", _synth_arguments, _synth_run),
    "demo": ("generate sample images, ingest, stream and decode them, printing throughput", _demo_arguments, _demo_run),
    "bench": ("time the loader on a dataset: images/s and seconds per stage", _bench_arguments, _bench_run),
}


def _lazy(module: str, attr: str) -> Callable:
    """A command implemented in its own module, imported when the command runs."""
    def call(arg):
        import importlib

        return getattr(importlib.import_module(module), attr)(arg)
    return call


_COMMANDS.update({
    "fit": ("train with Lightning from a config (LightningCLI; models from an allowlist)",
            _lazy("gpupipe.tools.fit", "add_arguments"), _lazy("gpupipe.tools.fit", "run")),
})
_COMMANDS.update({
    "validate": ("read and decode every image; list the bad ones (exit 1 if any)",
                 _lazy("gpupipe.tools.validate", "add_arguments"), _lazy("gpupipe.tools.validate", "run")),
    "preview": ("write a PNG grid of a config's augmented samples",
                _lazy("gpupipe.tools.preview", "add_arguments"), _lazy("gpupipe.tools.preview", "run")),
})
COMMANDS = MappingProxyType(_COMMANDS)


def _parser(argv: Sequence[str] | None = None) -> _Parser:
    """The command line's parser, with the options of the command ``argv`` names (of every
    command when ``argv`` is None): ``gpupipe --help`` then builds none, and imports neither torch
    nor the settings' declarations (issue 38: an answer at once, not after 2 s of imports)."""
    parser = _Parser(prog="gpupipe", description="Stream encoded images from any storage to GPU batches.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details (INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    named = None if argv is None else next((a for a in argv if a in _COMMANDS), "")
    for name, (help_text, add_arguments, _) in _COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if named is None or name == named:
            add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    A reader that stops early (``gpupipe inspect URL | head``) ends the command quietly
    with exit code 0: stdout goes to ``os.devnull`` (the Python docs' recipe for SIGPIPE),
    so neither a message nor the interpreter's flush at exit complains."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # a broken pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: Sequence[str] | None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = _parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra and args.command not in PASS_THROUGH:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = extra  # the options `fit` hands to LightningCLI
    except _UsageError as exc:
        return _fail(str(exc))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="gpupipe: %(levelname)s: %(message)s")
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            return _COMMANDS[args.command][2](args)
    except GpupipeError as exc:
        return _fail(str(exc) or type(exc).__name__)
    except KeyboardInterrupt:
        return _fail("interrupted", code=130)
    except BrokenPipeError:  # the reader of stdout is gone: main() ends quietly
        raise
    except Exception as exc:  # a storage backend's own error (botocore, s3fs, aiohttp), or a bug
        return _fail(_storage_message(exc))


def _storage_message(exc: Exception) -> str:
    """One line for an error of storage (worded with what to set) or of the OS; a bug re-raises."""
    from gpupipe.storage.faults import from_backend, storage_error

    if from_backend(exc):
        return str(storage_error(exc, ""))
    if isinstance(exc, OSError):
        return str(exc) or type(exc).__name__
    raise exc


def _fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"gpupipe: error: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
