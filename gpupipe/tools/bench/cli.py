"""``gpupipe bench``: time gpupipe and the loaders users would otherwise pick, in one run.

    gpupipe bench CONFIG.yaml [CONFIG2.yaml ...] [--compare baseline,webdataset,dali]
                  [--workers 0,1,2] [--batches N] [--repeat R] [--json out.json] [--plot out.png]
    gpupipe bench SHARDS --augment simple,complex --image-size 128 --batch-size 128 [same options]
    gpupipe bench --make-data paper|imagenet --images N --root DIR [--seed S]
    gpupipe bench SOURCE --stage host [--workers N] [--repeat R] [--batches N] [--json out.json]

A positional argument ending in ``.yaml``/``.yml`` is a pipeline config (its train
source, decode size, augment list and batch size); anything else is a shard folder or
pattern, benched with ``--augment`` sets. Without ``--compare``, ``--plot``,
``--batches``, ``--repeat`` or several worker counts, a source is timed the old way:
gpupipe alone, one warm-up epoch then ``--epochs`` epochs.
"""
from __future__ import annotations

import argparse
import json
import sys

from gpupipe.core.errors import ConfigError

__all__ = ["add_arguments", "run"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpupipe.tools.cliargs import decode_argument, device_option, setting_argument

    p.add_argument("targets", nargs="*", metavar="CONFIG|SOURCE",
                   help="pipeline config(s) (.yaml) or a shard folder, pattern or list (any fsspec URL)")
    p.add_argument("--compare", default=None, metavar="LIST", help="baselines to run too: baseline,webdataset,dali")
    p.add_argument("--workers", type=_int_list, default=None, metavar="N[,N...]",
                   help="worker counts to sweep (gpupipe: stream workers; baselines: decode workers; dali: threads); "
                        "default: each loader's own (gpupipe: the config's or its automatic choice; baselines: "
                        "one per core)")
    p.add_argument("--batches", type=int, default=None, metavar="N", help="timed batches per run (default: one epoch)")
    p.add_argument("--repeat", type=int, default=None, metavar="R", help="rounds over all loaders (default 3)")
    p.add_argument("--warmup", type=int, default=4, metavar="N", help="warm-up batches per loader and worker count")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the result as JSON to PATH (alone: print it)")
    p.add_argument("--plot", default=None, metavar="PNG", help="images/s against workers, per loader and set")
    p.add_argument("--augment", default="none", metavar="SET[,SET]",
                   help="with a SOURCE: transform set(s) simple, complex or none (default none)")
    setting_argument(p, "batch_size", what="samples per batch", default_text="256, or the config's")
    setting_argument(p, "image_size", what="decoded side in px", default_text="224, or the config's")
    decode_argument(p, what="gpupipe's decoder")
    p.add_argument("--device", default=None, type=device_option, help="cuda, cuda:N or cpu (default: cuda when present)")
    p.add_argument("--epochs", type=int, default=None,
                   help="single-run mode: timed epochs after one warm-up epoch (default 2)")
    p.add_argument("--timeline", default=None, metavar="JSON",
                   help="single-run mode: write each batch's decode/augment span as a Chrome trace "
                        "(open in ui.perfetto.dev or chrome://tracing) to see which stage bounds the run")
    p.add_argument("--per-sample", default="auto", choices=["auto", "torchvision", "pil"],
                   help="the baselines' per-sample transforms (auto: torchvision where importable)")
    p.add_argument("--images-dir", default=None, metavar="DIR",
                   help="the baseline's image folder (default: images/ beside the shard folder, else tar members)")
    p.add_argument("--stage", choices=["pipeline", "host"], default="pipeline",
                   help="host: time only the host path (shards to encoded batches, nothing decoded) beside DALI's "
                        "reader on the same shards, with CPU time per sample, to size the cores a GPU needs")
    p.add_argument("--make-data", choices=["paper", "imagenet"], default=None,
                   help="generate a dead-leaves dataset (images/ + shards/ under --root) and exit")
    p.add_argument("--images", type=int, default=None, help="--make-data: number of images")
    p.add_argument("--root", default=None, help="--make-data: output folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data and of the loaders")
    p.add_argument("--storage-option", dest="storage_options", action="append", type=_key_value, default=[],
                   metavar="KEY=VALUE", help="fsspec storage option for a SOURCE (repeatable)")


def _key_value(text: str):
    from gpupipe.tools.cliargs import key_value as parse

    return parse(text)


def run(args: argparse.Namespace) -> int:
    if args.make_data:
        return _make_data(args)
    if not args.targets:
        raise ConfigError("bench: give a CONFIG.yaml or a SOURCE (or --make-data paper|imagenet)")
    if args.stage == "host":
        return _host(args)
    configs = [t for t in args.targets if t.endswith((".yaml", ".yml"))]
    if configs and len(configs) != len(args.targets):
        raise ConfigError("bench: give either config files (.yaml) or one SOURCE, not both")
    if not configs and len(args.targets) > 1:
        raise ConfigError(f"bench: one SOURCE at a time (got {len(args.targets)}); use a pattern or a config")
    legacy = not configs and args.compare is None and args.plot is None and args.batches is None \
        and args.repeat is None and len(args.workers or ()) <= 1
    if legacy:
        from gpupipe.tools.bench.single import run_single

        args.epochs = 2 if args.epochs is None else args.epochs
        return run_single(args)
    given = [flag for flag, value in (("--timeline", args.timeline), ("--epochs", args.epochs)) if value is not None]
    if given:
        raise ConfigError(f"bench: {' and '.join(given)} time gpupipe alone on a SOURCE (single-run mode); with "
                          f"{'a config' if configs else '--compare, --plot, --batches, --repeat or several --workers'}"
                          " bench compares loaders instead. Give the config's shard folder as the SOURCE")
    return _compare(args, configs)


def _host(args: argparse.Namespace) -> int:
    from gpupipe.tools.bench.host import print_host, run_host
    from gpupipe.tools.bench.measure import environment

    result = run_host(args)
    result["meta"] = {"command": "gpupipe bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
                      "environment": environment()}
    if args.json == "-":
        print(json.dumps(result, indent=2))
        return 0
    print_host(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _make_data(args: argparse.Namespace) -> int:
    from gpupipe.tools.bench.data import describe, make_dataset

    if args.images is None or args.root is None:
        raise ConfigError("bench --make-data: --images N and --root DIR are required")
    print(describe(make_dataset(args.make_data, args.images, args.root, seed=args.seed)))
    return 0


def _compare(args: argparse.Namespace, configs: list[str]) -> int:
    from gpupipe.tools.bench.cases import config_cases, describe_case, source_cases
    from gpupipe.tools.bench.measure import environment, gpu_note
    from gpupipe.tools.bench.runner import RunSpec, run_benchmark, validate

    compare = tuple(n.strip() for n in (args.compare or "").split(",") if n.strip())
    spec = RunSpec(loaders=("gpupipe", *[c for c in compare if c != "gpupipe"]),
                   workers=args.workers or (None,), batches=args.batches,
                   repeat=args.repeat or 3, warmup=args.warmup, device=_device(args.device),
                   per_sample=args.per_sample)
    if spec.repeat < 1 or (spec.batches is not None and spec.batches < 1):
        raise ConfigError("bench: --repeat and --batches must be >= 1")
    targets = config_cases(configs, args) if configs else source_cases(args.targets[0], args)
    validate(targets, spec)
    result = run_benchmark(targets, spec, progress=None if args.json == "-" else _print_row)
    if args.json != "-" and spec.workers == (None,):
        print("w=N*: each loader at its own default worker count (gpupipe: the config's or its automatic "
              "choice; baselines: one per core); --workers 0,2 sweeps them alike")
    note = gpu_note()
    result["meta"] = {"command": "gpupipe bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
                      "environment": environment(), "spec": {**vars(spec), "loaders": list(spec.loaders)},
                      "targets": [describe_case(t) for t in targets], "notes": [note] if note else []}
    _write(result, args)
    return 0


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _print_row(row: dict) -> None:
    stages = row.get("stages_per_image_ms")
    extra = (" | ms/img: wait bytes {wait_bytes_ms:.3f}, decode {decode_ms:.3f}, augment {augment_ms:.3f}, "
             "loop waiting {handoff_wait_ms:.3f}".format(**stages)) if stages else ""
    gpu = f" | GPU {row['gpu_util_percent']:.0f}%" if "gpu_util_percent" in row else ""
    mem = f", {row['gpu_max_memory_allocated_mb']:.0f} MB" if "gpu_max_memory_allocated_mb" in row else ""
    skipped = f" | skipped {row['skipped']} bad image(s)" if row.get("skipped") else ""
    own = "*" if row.get("workers_chosen_by") == "loader default" else ""
    us = (f" | CPU us/img: training process {row['cpu_us_per_image_outside']:.1f} + native decoder "
          f"{row['cpu_us_per_image_native']:.1f}, workers {row['cpu_us_per_image_workers']:.1f}"
          if "cpu_us_per_image_outside" in row else "")
    print(f"{row['set']:>10} {row['loader']:>10} w={str(row['workers']) + own:<3} {row['images_per_s']:9,.0f} images/s "
          f"({row['images_per_s_min']:,.0f}-{row['images_per_s_max']:,.0f}) | CPU {row['cpu_percent']:.0f}% | "
          f"RSS {row['peak_rss_mb']:,.0f} MB{gpu}{mem}{skipped}{us}{extra}", flush=True)


def _write(result: dict, args: argparse.Namespace) -> None:
    if args.plot:
        from gpupipe.tools.bench.plot import plot

        plot(result, args.plot)
    text = json.dumps(result, indent=2)
    if args.json == "-":
        print(text)
    elif args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    out = sys.stderr if args.json == "-" else sys.stdout  # stdout is the JSON then
    for note in result["meta"]["notes"]:
        print(f"note: {note}", file=out)
    if args.json and args.json != "-":
        print(f"wrote {args.json}", file=out)
    if args.plot:
        print(f"wrote {args.plot}", file=out)
