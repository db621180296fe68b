"""Argument types and groups every ``gpupipe`` command shares: ``--device``,
``--storage-option KEY=VALUE``, and the flags of loader settings (``--batch-size``,
``--image-size``, ``--workers``, ``--decode``), whose type, YAML key and declared default come from
the settings' one declaration (:data:`gpupipe.config.keywords.KEYWORDS`). Commands import them from
here, never from one another. The settings' declarations (which import torch) are read only by
the commands that have such flags, when their parser is built: ``gpupipe --help`` imports neither."""
from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["key_value", "device_option", "storage_arguments", "setting_argument", "decode_argument", "engine_arguments"]

_TYPES = {"int": int, "float": float, "str": str, "tuple[int, int]": int}  # an output size on the command line: a side


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → ``(KEY, value)``; the value is parsed as JSON when it is JSON
    (``true``, ``3``, ``{"a": 1}``), else kept as a string. Never echoes the value."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("expected KEY=VALUE (e.g. anon=true); the item given has no key or no '='")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def device_option(text: str) -> str:
    """argparse type of ``--device``: ``cpu``, ``cuda`` or ``cuda:N``; a CUDA device this
    machine does not have is refused at once (one line) instead of deep inside torch."""
    value = text.strip().lower()
    kind, colon, index = value.partition(":")
    if kind not in ("cpu", "cuda") or (colon and (kind == "cpu" or not index.isdigit())):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine "
                                             "(torch.cuda.is_available() is False); use --device cpu")
        if index and int(index) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {torch.cuda.device_count()} CUDA "
                                             f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return value


def storage_arguments(p: argparse.ArgumentParser, flag: str = "--storage-option", dest: str = "storage_options",
                       what: str = "the source") -> None:
    p.add_argument(flag, dest=dest, action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help=f"fsspec storage option for {what} (repeatable; values are JSON or strings)")


def setting_argument(p: argparse._ActionsContainer, name: str, *flags: str, default: Any = None, what: str = "",
                     default_text: str | None = None) -> None:
    """The flag of the loader setting ``name`` (a ``GpuLoader`` keyword, e.g. ``batch_size``): its type
    and YAML key come from the declaration; ``default`` is the command's own (None: the declared one
    applies; ``default_text`` says it in words). ``args.<name>`` holds the value."""
    from gpupipe.config.keywords import KEYWORDS

    keyword = KEYWORDS[name]
    kind = _TYPES[str(keyword.annotation).split("|")[0].strip()]
    shown = default_text or (default if default is not None else keyword.default)
    p.add_argument(*(flags or (f"--{name.replace('_', '-')}",)), dest=name, type=kind, default=default,
                   metavar="N" if kind is int else "X", help=f"{what or name} ({keyword.path}; default {shown})")


def decode_argument(p: argparse.ArgumentParser, default: str | None = "auto", what: str = "decode backend") -> None:
    """``--decode``: ``auto`` or one of the decode backends (``decode.backend``)."""
    shown = default or "the config's"
    from gpupipe.decode import BACKENDS

    p.add_argument("--decode", default=default, choices=["auto", *BACKENDS], help=f"{what} (decode.backend; default {shown})")


def engine_arguments(p: argparse.ArgumentParser, what: str, processes: str = "1") -> None:
    """``--engine``, ``--processes`` and ``--ray-address``: where a job's tasks run (:mod:`gpupipe.prepare.engines`).
    ``processes``: the default, a number or ``"cores"`` (the cores this process may use)."""
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help=f"{what}: this machine (default) or a Ray cluster")
    p.add_argument("--processes", type=_processes, default=_processes(processes), metavar="N",
                   help=f"--engine local: tasks run at once, each in its own process (default {processes})")
    p.add_argument("--ray-address", metavar="ADDR", help="--engine ray: the cluster (host:port, ray://host:port, "
                   "auto; default $RAY_ADDRESS, else a Ray instance started here)")


def _processes(text: str) -> int:
    """``--processes``: a count, or ``cores`` for the cores this process may use."""
    if text == "cores":
        from gpupipe.core.machine import usable_cores

        return usable_cores()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a count or 'cores', not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n
