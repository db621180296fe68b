"""Decode backends are one record each (issue 37): a backend registered from outside the package is
a ``decode.backend`` like the built-in ones — chosen by name, refused where it cannot run, its
facts (on the host or not, native or not) read from its record, not from its name."""
from __future__ import annotations

import dataclasses

import decode_corpus as corpus
import pytest
import torch

from gpupipe.core.errors import ConfigError
from gpupipe.core.types import Sample
from gpupipe.decode import BACKENDS, BackendSpec, DecodeConfig, available_backends, make_decoder, register_backend
from gpupipe.decode.pil import PilDecoder
from gpupipe.decode.settings import _BACKENDS
from gpupipe.stream.batch import pack


class ToyDecoder(PilDecoder):
    """Pillow under another name: what a plugin's backend module would hold."""

    name = "toy"


@pytest.fixture
def toy():
    saved = dict(_BACKENDS)
    register_backend(BackendSpec("toy", f"{__name__}:ToyDecoder", "PIL", "Pillow", "pil", ("cpu",), on_host=True,
                                 native=False, rank=50))
    yield BACKENDS["toy"]
    _BACKENDS.clear()
    _BACKENDS.update(saved)


def test_a_registered_backend_decodes_by_name_and_takes_its_place_in_auto(toy):
    images = corpus.natural_jpegs(3, (30, 20))
    batch = pack([Sample(key=f"k{i}", fields={"jpg": d}, shard="s", offset=0, sample_id=i, label=i)
                  for i, d in enumerate(images)], [True] * 3)
    config = DecodeConfig(backend="toy", image_size=(16, 16))
    decoder = make_decoder(config, "cpu")
    assert isinstance(decoder, ToyDecoder)
    pil = make_decoder(dataclasses.replace(config, backend="pil"), "cpu").decode(batch)
    assert torch.equal(decoder.decode(batch).images, pil.images)
    assert available_backends(torch.device("cpu"))[-2:] == ["pil", "toy"]  # its rank: after Pillow
    assert "toy" not in available_backends(torch.device("cuda"))


def test_a_backend_is_refused_where_its_record_says_it_cannot_run(toy):
    with pytest.raises(ConfigError, match="'toy' decodes on a CPU device; use .*'pil' on the CUDA"):
        make_decoder(DecodeConfig(backend="toy"), "cuda")
    with pytest.raises(ConfigError, match="'nvjpeg' decodes on a CUDA device; use 'dali' or 'pil' or 'toy' on the CPU"):
        make_decoder(DecodeConfig(backend="nvjpeg"), "cpu")


def test_an_unregistered_name_is_refused_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="unknown 'toy'; choose from auto, dali, nvjpeg, pil"):
        DecodeConfig(backend="toy")
