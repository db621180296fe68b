"""``gpupipe fit --config FILE``: train through LightningCLI with a model from an allowlist.

FILE is either a pipeline config (``source:``, ``decode:``, ``augment:`` ... at the top;
it becomes LightningCLI's ``--data``) or a LightningCLI file with ``data:``, ``model:``
and ``trainer:`` sections. The model is :class:`~gpupipe.lightning.models.ImageClassifier` with
``model.arch`` from :data:`~gpupipe.lightning.models.ARCHITECTURES`, or, for data with masks
(``source.targets: masks``), :class:`~gpupipe.lightning.models.MaskSegmenter`; a ``class_path`` anywhere in
the file or the overrides must name a Lightning callback or logger, or a gpupipe class —
a config file never imports arbitrary code.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from gpupipe.config.schema import parse_config, read_yaml
from gpupipe.core.errors import ConfigError

__all__ = ["add_arguments", "run", "check_class_paths", "ALLOWED_CLASS_PREFIXES"]

ALLOWED_CLASS_PREFIXES = ("lightning.pytorch.callbacks.", "lightning.pytorch.loggers.", "gpupipe.")
_NO_VAL_WARNING = "You defined a `validation_step` but have no `val_dataloader`"
_CLASS_KEYS = ("class_path", "callbacks", "logger", "plugins", "strategy", "profiler")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE",
                   help="pipeline config (configs/*.yaml) or a LightningCLI file with data/model/trainer sections")
    p.epilog = ("Other options go to LightningCLI, e.g. --trainer.max_epochs 2 --trainer.accelerator cpu "
                "--model.arch small_cnn (--model.num_classes: from the data's index.json unless given)")


def run(args: argparse.Namespace) -> int:
    raw = read_yaml(args.config)
    pipeline = parse_config(raw, origin=args.config)  # the pipeline's errors, with key paths, before Lightning starts
    check_class_paths(raw)
    check_overrides(args.overrides)
    from lightning.pytorch.cli import LightningCLI

    from gpupipe.lightning import GpuDataModule
    from gpupipe.lightning.models import ImageClassifier, MaskSegmenter

    targets = pipeline.source.targets
    if targets and "masks" not in targets:
        raise ConfigError(f"gpupipe fit: the data's targets are {'+'.join(targets)}; its models are a classifier and a "
                          "mask segmenter (source.targets: masks). Train a detection model on GpuDataModule from "
                          "Python (docs/targets.md)")
    model = MaskSegmenter if "masks" in targets else ImageClassifier

    data_flag = "--config" if isinstance(raw, dict) and "data" in raw else "--data"
    cli_args = ["fit", data_flag, str(args.config), *args.overrides]
    for name in ("lightning.pytorch", "lightning.fabric"):  # Lightning prints its own lines, once
        logging.getLogger(name).propagate = False
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI reads args=, not the gpupipe command line
    try:
        with warnings.catch_warnings():
            if pipeline.source.val is None:  # a train-only dataset is fine: no "no val_dataloader" warning
                warnings.filterwarnings("ignore", message=_NO_VAL_WARNING)
            LightningCLI(model, GpuDataModule, subclass_mode_model=False, subclass_mode_data=False,
                         args=cli_args, save_config_kwargs={"overwrite": True})
    except SystemExit as exc:  # jsonargparse has printed what was wrong
        return exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.argv = argv
    return 0


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def check_class_paths(raw: Any) -> None:
    """Refuse any ``class_path`` (or class-valued trainer option) outside the allowlist."""
    for path, value in _walk(raw):
        leaf = path.rsplit(".", 1)[-1].split("[")[0]
        if leaf in _CLASS_KEYS and isinstance(value, str) and "." in value:
            _check_class(path, value)


def check_overrides(overrides: Sequence[str]) -> None:
    tokens = list(overrides)
    for i, token in enumerate(tokens):
        key, _, value = token.partition("=")
        if not value and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
        leaf = key.lstrip("-").rstrip("+").rsplit(".", 1)[-1]
        if token.startswith("--") and (leaf in _CLASS_KEYS or "class_path" in value) and "." in value:
            _check_class(key.lstrip("-"), value)


def _check_class(path: str, value: str) -> None:
    for name in re.findall(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+", value):
        if not name.startswith(ALLOWED_CLASS_PREFIXES):
            raise ConfigError(f"{path}: class path {name!r} is not allowed (a config never imports arbitrary code); "
                              f"allowed: {', '.join(p + '*' for p in ALLOWED_CLASS_PREFIXES)}, "
                              f"and model.arch from gpupipe.lightning.models.ARCHITECTURES")
