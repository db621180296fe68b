"""A transform from outside the package, in one module (issue 37): registered by name, a config
(YAML or the keyword form) names it like a built-in one, its arguments are checked against its
own signature, and a GpuLoader runs it — no edit inside gpupipe/."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gpupipe import GpuLoader
from gpupipe.augment.base import Transform
from gpupipe.augment.registry import _REGISTRY, register_transform
from gpupipe.config import parse_config
from gpupipe.core.errors import ConfigError
from gpupipe.formats.writer import ShardSink
from gpupipe.tools.synth import synthetic_jpeg


class ToyPosterize(Transform):
    """Keep the top ``bits`` of every uint8 value: a plugin's own transform."""

    keeps_targets = True

    def __init__(self, bits: int = 4) -> None:
        super().__init__()
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be in [1, 8], got {bits}")
        self.mask = 256 - 2 ** (8 - bits)

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return images & self.mask


@pytest.fixture
def toy():
    saved = dict(_REGISTRY)
    register_transform("ToyPosterize", f"{__name__}:ToyPosterize")
    yield
    _REGISTRY.clear()
    _REGISTRY.update(saved)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("plugin") / "shards")
    rng = np.random.default_rng(0)
    with ShardSink(root, shard_size=8, classes=("a", "b")) as sink:
        for i in range(16):
            sink.write(f"k{i:03d}", {"jpg": synthetic_jpeg(rng, (20, 24)), "cls": str(i % 2).encode()})
    return root


def test_a_registered_transform_runs_in_a_gpu_loader_by_name(toy, shards):
    loader = GpuLoader(shards, batch_size=8, image_size=(16, 16), decode="pil", device="cpu", num_workers=0,
                       augment=[{"name": "ToyPosterize", "bits": 3}, "RandomHorizontalFlip"])
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 16, 16)
    assert torch.equal(images & 0b11100000, images) and images.any()  # posterized to 3 bits


def test_a_registered_transform_is_checked_like_a_built_in_one(toy):
    config = parse_config({"source": "x/", "augment": [{"name": "ToyPosterize", "bits": 2}]})
    assert config.augment[0].name == "ToyPosterize"
    with pytest.raises(ConfigError, match=r"augment\[0\].bitz: unknown key; did you mean 'bits'"):
        parse_config({"source": "x/", "augment": [{"name": "ToyPosterize", "bitz": 2}]})
    with pytest.raises(ConfigError, match="bits must be in"):
        parse_config({"source": "x/", "augment": [{"name": "ToyPosterize", "bits": 9}]})


def test_without_registering_the_name_is_unknown():
    with pytest.raises(ConfigError, match="unknown 'ToyPosterize'"):
        parse_config({"source": "x/", "augment": [{"name": "ToyPosterize"}]})
