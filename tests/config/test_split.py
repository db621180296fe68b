"""One home for every setting (issue 13): a split is one value, built one of four ways, and
every setting given is the setting used — read back from the built loader, its stream and
its decoder — none silently replaced; a setting given twice with two values raises."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from datagen import write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupipe.config.schema import load_config
from gpupipe.config.split import SplitConfig
from gpupipe.core.errors import ConfigError
from gpupipe.core.types import World
from gpupipe.decode import DecodeConfig
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.loader.gpu import GpuLoader
from gpupipe.stream.chunks import StreamConfig
from gpupipe.tools.synth import synthetic_jpeg

N = 24


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("split") / "ds")
    bad = {5}  # one undecodable image: on_error decides what happens to it
    write_dataset(root, [12, 12], image=lambda i: b"\xff\xd8\xff\xe0 not a jpeg" if i in bad
                  else synthetic_jpeg(np.random.default_rng(i), (24, 24)))
    return root


# -- the three cases of the issue, as regression tests --------------------------------------------
def test_encoded_loader_keeps_the_stream_config_it_is_given(shards):
    loader = EncodedLoader(shards, batch_size=5, num_workers=0, rank=0, world_size=1,
                           stream=StreamConfig(shuffle=False, drop_last=False))
    assert not loader.stream.shuffle and not loader.stream.drop_last
    batches = list(loader)
    ids = [i for b in batches for i in b.sample_ids.tolist()]
    assert ids == list(range(N)) and len(batches) == len(loader) == 5  # in order, the last batch short
    assert [len(b) for b in batches] == [5, 5, 5, 5, 4] and all(bool(v) for b in batches for v in b.valid)


def test_gpu_loader_with_a_decode_config_takes_image_size_and_seed(shards):
    loader = GpuLoader(shards, decode=DecodeConfig(backend="pil"), image_size=16, resize="random_resized_crop",
                       seed=7, batch_size=8, num_workers=0, device="cpu", on_error="skip")
    assert loader.decoder.config.image_size == (16, 16) and loader.decoder.config.seed == 7
    assert loader.decoder.config.resize.value == "random_resized_crop"
    assert loader.encoded.spec.seed == 7
    assert next(iter(loader)).images.shape[-2:] == (16, 16)


def test_stream_on_error_skip_is_the_policy_used(shards):
    loader = GpuLoader(shards, stream=StreamConfig(on_error="skip"), batch_size=8, image_size=8, decode="pil",
                       num_workers=0, device="cpu")
    assert loader.split.decode.on_error.value == loader.encoded.stream.on_error.value == "skip"
    assert sum(len(b) for b in loader) == N and loader.stats.skipped == 1  # sample 5 replaced, not raised


# -- given twice ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, names", [
    ({"image_size": 32, "decode": DecodeConfig(image_size=(16, 16))}, ["image_size=32", "decode.image_size=(16, 16)"]),
    ({"shuffle": True, "stream": StreamConfig(shuffle=False)}, ["shuffle=True", "stream.shuffle=False"]),
    ({"on_error": "raise", "stream": StreamConfig(on_error="skip")}, ["on_error='raise'", "stream.on_error='skip'"]),
    ({"seed": 3, "decode": DecodeConfig(seed=4)}, ["seed=3", "decode.seed=4"]),
])
def test_a_setting_given_twice_with_two_values_raises_naming_both(shards, kwargs, names):
    with pytest.raises(ConfigError) as info:
        GpuLoader(shards, batch_size=8, num_workers=0, device="cpu", **kwargs)
    for name in names:
        assert name in str(info.value)


def test_a_crop_without_an_output_size_is_refused_not_dropped():
    with pytest.raises(ConfigError, match="decode.resize: 'random_resized_crop' needs decode.image_size"):
        DecodeConfig(resize="random_resized_crop")
    with pytest.raises(ConfigError, match="decode.resize: 'shorter' needs decode.image_size"):
        load_config({"source": "x/", "decode": {"resize": "shorter"}})


def test_the_keyword_form_and_yaml_give_the_same_error(shards):
    with pytest.raises(ConfigError) as kw:
        GpuLoader(shards, batch_size=8, resize="sideways", image_size=8)
    with pytest.raises(ConfigError) as yaml:
        load_config({"source": shards, "decode": {"resize": "sideways", "image_size": [8, 8]}})
    assert str(kw.value) == str(yaml.value) and str(kw.value).startswith("decode.resize:")


def test_a_split_config_pickles_and_a_loader_takes_nothing_beside_it(shards):
    split = load_config({"source": shards, "augment": "simple", "decode": {"image_size": [8, 8]}}).split("train")
    assert pickle.loads(pickle.dumps(split)) == split
    with pytest.raises(ConfigError, match="batch_size"):
        GpuLoader(split, batch_size=4)
    with pytest.raises(ConfigError, match="disagree"):
        SplitConfig(source=split.source, stream=StreamConfig(on_error="skip"))


def test_colour_before_the_cast_is_torchvisions_meaning_not_an_error(shards):
    cfg = load_config({"source": shards, "augment": [{"name": "RandomHorizontalFlip"},
                                                     {"name": "ColorJitter", "brightness": 0.2},
                                                     {"name": "ToDtype", "dtype": "float32"}]})
    assert [s.name for s in cfg.split("train").augment] == ["RandomHorizontalFlip", "ColorJitter", "ToDtype"]


def test_a_plain_callable_takes_the_image_batch_alone(shards):
    loader = GpuLoader(shards, batch_size=8, image_size=8, decode="pil", num_workers=0, device="cpu",
                       on_error="skip", augment=lambda images: images.float() / 255)
    batch = next(iter(loader))
    assert batch.images.dtype == torch.float32 and float(batch.images.max()) <= 1.0


# -- every way to build a loader: what is given is what is used -----------------------------------
SETTINGS = st.fixed_dictionaries({
    "batch_size": st.sampled_from([2, 4, 8]),
    "shuffle": st.booleans(),
    "drop_last": st.booleans(),
    "seed": st.integers(0, 10_000),
    "on_error": st.sampled_from(["raise", "skip"]),
    "image_size": st.sampled_from([8, 12]),
    "backend": st.sampled_from(["pil", "dali"]),
    "shuffle_buffer": st.sampled_from([0, 16, 64]),
    "num_workers": st.sampled_from([0, 1]),
    "prefetch": st.sampled_from([1, 2]),
})


def _yaml(source: str, s: dict) -> dict:
    return {"source": source, "seed": s["seed"],
            "stream": {"shuffle": s["shuffle"], "drop_last": s["drop_last"], "shuffle_buffer": s["shuffle_buffer"]},
            "decode": {"backend": s["backend"], "image_size": [s["image_size"]] * 2, "on_error": s["on_error"]},
            "loader": {"batch_size": s["batch_size"], "num_workers": s["num_workers"], "prefetch": s["prefetch"],
                       "device": "cpu"}}


def _built(way: str, source: str, s: dict) -> GpuLoader:
    if way == "keywords":
        return GpuLoader(source, batch_size=s["batch_size"], shuffle=s["shuffle"], drop_last=s["drop_last"],
                         seed=s["seed"], on_error=s["on_error"], image_size=s["image_size"], decode=s["backend"],
                         stream=StreamConfig(shuffle_buffer=s["shuffle_buffer"]), num_workers=s["num_workers"],
                         prefetch=s["prefetch"], device="cpu", rank=0, world_size=1)
    if way == "split":
        return GpuLoader(load_config(_yaml(source, s)).split("train"), world=World())
    if way == "objects":
        stream = StreamConfig(shuffle=s["shuffle"], drop_last=s["drop_last"], shuffle_buffer=s["shuffle_buffer"])
        decode = DecodeConfig(backend=s["backend"], image_size=(s["image_size"],) * 2, on_error=s["on_error"])
        return GpuLoader(source, batch_size=s["batch_size"], stream=stream, decode=decode, seed=s["seed"],
                         num_workers=s["num_workers"], prefetch=s["prefetch"], device="cpu")
    from gpupipe.lightning import GpuDataModule

    y = _yaml(source, s)
    dm = GpuDataModule(source=y["source"], stream=y["stream"], decode=y["decode"], loader=y["loader"], seed=s["seed"])
    dm.setup("fit")
    return dm.train_dataloader().gpu


@pytest.mark.parametrize("way", ["keywords", "split", "objects", "datamodule"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=SETTINGS)
def test_every_setting_given_is_the_setting_used(shards, way, s):
    loader = _built(way, shards, s)
    stream, spec, decode = loader.encoded.stream, loader.encoded.spec, loader.split.decode
    assert (spec.batch_size, spec.shuffle, spec.drop_last, spec.seed) == \
        (s["batch_size"], s["shuffle"], s["drop_last"], s["seed"])
    assert (stream.shuffle, stream.drop_last, stream.shuffle_buffer) == (s["shuffle"], s["drop_last"], s["shuffle_buffer"])
    assert stream.on_error.value == decode.on_error.value == s["on_error"]
    assert (decode.backend, decode.image_size, decode.seed) == (s["backend"], (s["image_size"],) * 2, s["seed"])
    assert loader.encoded.num_workers == s["num_workers"] and loader.split.prefetch == s["prefetch"]
    assert loader.device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_without_cuda_is_a_config_error(shards):
    with pytest.raises(ConfigError, match="loader.device: 'cuda'.*CUDA is not available"):
        GpuLoader(load_config({"source": shards, "loader": {"device": "cuda"}}).split("train"))
