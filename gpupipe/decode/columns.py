"""What a decode needs that does not need the pixels, worked out where the bytes are read.

In a DataLoader worker, :func:`annotate` probes every image's header
(:func:`~gpupipe.formats.headers.probe_batch`: magic bytes, the strict gate's input, upright
size and EXIF orientation, ``max_pixels``, completeness) and, for ``random_resized_crop``,
draws each sample's keyed crop box; both travel with the encoded batch as columns. The
training process then reads them (:func:`probed`, :func:`keyed_crops`) instead of doing that
work per image in the one thread that has to keep the decoder fed. A batch made elsewhere, or
annotated for other settings, is worked out on the spot by the same functions: the answers
are the same either way (tested).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpupipe.decode.base import DecodeConfig, ResizeMode
from gpupipe.decode.crops import crop_boxes
from gpupipe.formats.headers import ProbedHeaders, probe_batch, probed_from_ids

__all__ = ["annotate", "probed", "keyed_crops", "crop_key"]


def crop_key(config: DecodeConfig, epoch: int) -> tuple:
    """What a keyed crop box depends on besides the sample (and its upright size)."""
    return (config.resize.value, config.seed, epoch, tuple(config.scale), tuple(config.ratio))


def annotate(batch, config: DecodeConfig, header_ids: np.ndarray | None = None):
    """``batch`` with its images' headers probed and, under ``random_resized_crop``, its crop
    boxes drawn (in a DataLoader worker, for the decoder with ``config``). ``header_ids``: the
    probe's verdicts the stream kept for these very bytes (:func:`~gpupipe.formats.headers.header_ids`),
    taken instead of a probe when every image has one under ``config.max_pixels``."""
    headers = None if header_ids is None else probed_from_ids(header_ids, config.max_pixels)
    if headers is None:
        padded = _padded(batch)
        headers = probe_batch(None if padded is not None else batch.images(), config.max_pixels, padded)
    crops = None
    if config.resize is ResizeMode.RANDOM_CROP:
        crops = (crop_key(config, batch.epoch),
                 crop_boxes(headers.headers(), batch.sample_ids.tolist(), batch.epoch, config))
    return replace(batch, probed=headers, crops=crops)


def probed(batch, max_pixels: int | None) -> ProbedHeaders:
    """The batch's probed headers: those it carries when probed under ``max_pixels``, else
    probed now."""
    carried = getattr(batch, "probed", None)
    if carried is not None and carried.max_pixels == max_pixels and len(carried) == len(batch):
        return carried
    padded = _padded(batch)
    return probe_batch(None if padded is not None else batch.images(), max_pixels, padded)


def _padded(batch) -> tuple[np.ndarray, np.ndarray] | None:
    """A padded batch's (B, stride) rows and image sizes (:func:`~gpupipe.formats.headers.probe_batch`)."""
    rows = batch.padded_rows() if hasattr(batch, "padded_rows") else None
    return None if rows is None else (rows, batch.image_sizes())


def keyed_crops(batch, config: DecodeConfig) -> np.ndarray | None:
    """The ``random_resized_crop`` boxes the batch carries for ``config``, or None."""
    crops = getattr(batch, "crops", None)
    if crops is None or crops[0] != crop_key(config, batch.epoch) or len(crops[1]) != len(batch):
        return None
    return crops[1]
