"""Decode batches of encoded images into uint8 tensors on the device.

``make_decoder(config, device)`` returns a :class:`Decoder` for one backend:

* ``dali`` — an NVIDIA DALI pipeline fed by ``external_source``: nvJPEG (``mixed``,
  with the A100/H100/H200 hardware decoder through ``hw_decoder_load``) on a GPU,
  DALI's CPU decoders (``device_id=None``) without one;
* ``nvjpeg`` — ``torchvision.io.decode_jpeg(device="cuda")`` where torchvision is
  installed and DALI is not;
* ``pil`` — Pillow, the reference;
* ``auto`` — DALI on a GPU, else nvjpeg on a GPU, else DALI on the CPU, else Pillow;
  the choice is logged.

Every backend passes one contract suite (tests/decode/test_decode_contract.py): the same
shapes, pixels close to Pillow's, EXIF orientation applied (the image comes out
upright, as a viewer shows it), grayscale/CMYK/palette/RGBA/16-bit become 8-bit
RGB, and bad images handled by ``on_error`` identically.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from gpupipe.core.errors import ConfigError, MissingDependencyError
from gpupipe.decode.settings import BACKENDS, BackendSpec, DecodeConfig, ResizeMode, register_backend

if TYPE_CHECKING:
    import torch

    from gpupipe.decode.base import DecodedBatch, Decoder, DecodeStats

__all__ = ["ResizeMode", "DecodeConfig", "DecodedBatch", "DecodeStats", "Decoder", "BACKENDS", "BackendSpec",
           "register_backend", "make_decoder", "available_backends", "preload"]

log = logging.getLogger(__name__)
_TENSOR_VALUES = ("DecodedBatch", "Decoder", "DecodeStats")  # gpupipe.decode.base's (torch), imported on first use


def __getattr__(name: str) -> Any:
    if name in _TENSOR_VALUES:
        return getattr(importlib.import_module("gpupipe.decode.base"), name)
    raise AttributeError(f"module 'gpupipe.decode' has no attribute {name!r}")


def _device(device: torch.device | str | None) -> torch.device:
    import torch

    return torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (``nvidia``) is missing
        return False


def available_backends(device: torch.device) -> list[str]:
    """Backends usable on ``device``, best first (the order ``auto`` tries)."""
    return [b.name for b in BACKENDS.values() if device.type in b.devices and _importable(b.module)]


def make_decoder(config: DecodeConfig, device: torch.device | str | None = None) -> Decoder:
    """A decoder for ``config.backend`` on ``device`` (default: CUDA if present, else CPU)."""
    dev = _device(device)
    name = config.backend
    if name == "auto":
        found = available_backends(dev)
        if not found:
            raise MissingDependencyError("nvidia-dali or Pillow", extra="dali", feature="decoding images")
        name = found[0]
        log.info("decode backend: %s on %s (auto)", name, dev)
    spec = BACKENDS[name]
    if dev.type not in spec.devices:
        here = " or ".join(repr(b.name) for b in BACKENDS.values() if dev.type in b.devices)
        raise ConfigError(f"decode.backend: {name!r} decodes on a {' or '.join(d.upper() for d in spec.devices)} "
                          f"device; use {here} on the {dev.type.upper()}")
    if not _importable(spec.module):
        raise MissingDependencyError(spec.package, extra=spec.extra, feature=f"the {name!r} decode backend")
    mod, attr = spec.decoder.split(":")
    return getattr(importlib.import_module(mod), attr)(config, dev)


def preload(config: DecodeConfig, device: torch.device | str | None = None) -> None:
    """Import now what the decoder ``make_decoder(config, device)`` would import on its first batch
    (its module and its library: DALI's Python side is 0.3-0.45 s of CPU), so that a loader made
    now does not pay it inside its first epoch (docs/benchmarks.md, issue 28). Touches no device
    and never raises: a backend that is missing says so in :func:`make_decoder`, as before."""
    dev = _device(device)
    name = config.backend
    if name == "auto":
        name = next(iter(available_backends(dev)), "")
    spec = BACKENDS.get(name)
    if spec is None or not _importable(spec.module):
        return
    for module in (spec.decoder.split(":")[0], *spec.first_use):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 -- a broken install is make_decoder's to report, with its own message
            log.debug("preload: importing %s failed; the decoder will say why when it is made", module, exc_info=True)
            return
