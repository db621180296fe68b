"""YAML configs: typed and frozen, safe loading, errors with the key path and a suggestion,
environment interpolation, secrets kept out of repr and to_dict."""
from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.config.schema import LIGHTNING_SECTIONS, PipelineConfig, Secrets, load_config, parse_config, preset
from gpupipe.core.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
GOOD = {"source": {"train": "data/train-{0000..0003}.tar", "val": "data/val.tar"},
        "stream": {"shuffle_buffer": 512, "fetch": {"concurrency": 4}},
        "decode": {"backend": "dali", "image_size": [128, 96], "resize": "random_resized_crop", "on_error": "skip"},
        "augment": [{"name": "RandomHorizontalFlip", "p": 0.5}, {"name": "ToDtype", "dtype": "bfloat16"},
                    {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}],
        "loader": {"batch_size": 32, "num_workers": 2},
        "seed": 11}


def test_a_full_config_is_typed_and_frozen():
    cfg = load_config(GOOD)
    assert cfg.decode.image_size == (128, 96) and cfg.decode.backend == "dali" and cfg.decode.seed == 11
    assert cfg.stream.fetch.concurrency == 4 and cfg.loader.num_workers == 2
    assert [s.name for s in cfg.augment] == ["RandomHorizontalFlip", "ToDtype", "Normalize"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # plain data: crosses process boundaries


def test_eval_splits_keep_only_deterministic_steps_and_centre_crop():
    cfg = load_config({**GOOD, "source": {"train": "shards/", "val": "val/", "test": "test/"}})
    val, train = cfg.split("val"), cfg.split("train")
    assert [s.name for s in val.augment] == ["ToDtype", "Normalize"]
    assert val.decode.resize.value == "shorter" and train.decode.resize.value == "random_resized_crop"
    assert not val.stream.shuffle and not val.stream.drop_last and train.stream.shuffle
    explicit = load_config({**GOOD, "source": {"train": "shards/", "test": "test/"}, "eval_augment": []})
    assert explicit.split("test").augment == ()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load_and_keep_the_image_range(path, monkeypatch):
    """Every shipped config loads, and its pipeline maps uint8 images to the range Normalize
    promises (not near-constant images from a cast in the wrong place)."""
    import torch

    from gpupipe.augment.base import AugKey

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    cfg = load_config(path)
    assert cfg.source.train is not None
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    out = cfg.split("train").augment_stage().transforms(images, AugKey(0, 0, torch.arange(8))).float()
    assert out.min() < -1.5 and out.max() > 1.5, (out.min(), out.max())  # ImageNet-normalised 0..1 spans ~-2.1..2.6


def test_shipped_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"quickstart.yaml", "imagenet_simple.yaml", "imagenet_complex.yaml", "s3.yaml", "parquet.yaml"} <= names


@pytest.mark.parametrize("bad, message", [
    ({"augment": [{"name": "RandomHflip"}]}, r"augment\[0\]\.name: unknown 'RandomHflip'; did you mean 'RandomHorizontalFlip'\?"),
    ({"augment": [{"name": "RandomAffine", "degrees": 10}, {"name": "ColourJitter"}]}, r"augment\[1\]\.name: .*did you mean 'ColorJitter'"),
    ({"loader": {"batchsize": 3}}, r"loader\.batchsize: unknown key; did you mean 'batch_size'"),
    ({"augmnet": "simple"}, r"augmnet: unknown key; did you mean 'augment'"),
    ({"decode": {"image_size": "big"}}, r"decode\.image_size: expected a list"),
    ({"decode": {"image_size": 0}}, r"decode\.image_size: expected \(height, width\) > 0"),
    ({"decode": {"image_size": True}}, r"decode\.image_size: expected a list, got True"),
    ({"decode": {"backend": "turbo"}}, r"decode\.backend: unknown 'turbo'"),
    ({"decode": {"resize": "zoom"}}, r"decode\.resize: 'zoom' is not one of"),
    ({"loader": {"batch_size": "64"}}, r"loader\.batch_size: expected int, got str"),
    ({"loader": {"batch_size": True}}, r"loader\.batch_size: expected int, got bool"),
    ({"stream": {"fetch": {"retries": 1.5}}}, r"stream\.fetch\.retries: expected int"),
    ({"stream": {"on_error": "skip"}}, r"stream\.on_error: set decode\.on_error"),
    ({"decode": {"seed": 1}}, r"decode\.seed: set the top-level 'seed'"),
    ({"augment": [{"name": "RandomAffine", "degree": 3}]}, r"augment\[0\]\.degree: unknown key; did you mean 'degrees'"),
    ({"augment": [{"name": "RandomAffine", "degrees": -3}]}, r"augment\[0\] \(RandomAffine\): .*positive"),
    ({"augment": [{"name": "RandomHorizontalFlip", "p": 1.5}]}, r"augment\[0\] \(RandomHorizontalFlip\): `p` should be"),
    ({"augment": [{"name": "ToDtype", "dtype": "float8"}]}, r"augment\[0\] \(ToDtype\): dtype: unknown 'float8'"),
    ({"augment": [{"name": "Normalize", "mean": [0.5], "std": [0.5]}]}, r"augment\[0\] \(Normalize\): .*ToDtype"),
    ({"augment": [{"name": "RandomHorizontalFlip"}, {"name": "Normalize", "mean": [0.5], "std": [0.5]}]},
     r"augment\[1\] \(Normalize\): .*ToDtype"),
    ({"augment": "fancy"}, r"augment: unknown preset 'fancy'"),
    ({"decode": {"image_size": 128}, "augment": [{"name": "RandomCrop", "size": 256}]},
     r"augment\[0\] \(RandomCrop\): Required crop size \(256, 256\) is larger than input image size \(128, 128\); "
     r"pad_if_needed=True pads it; the images reaching it are 128x128"),
    ({"decode": {"image_size": 128}, "augment": [{"name": "Resize", "size": 64}, {"name": "RandomCrop", "size": 96}]},
     r"augment\[1\] \(RandomCrop\): .*reaching it are 64x64"),
    ({"decode": {"image_size": 128}, "eval_augment": [{"name": "RandomCrop", "size": 200}]},
     r"eval_augment\[0\] \(RandomCrop\)"),
    ({"augment": [{"name": "ToDtype", "dtype": "float32", "scale": True},
                  {"name": "Normalize", "mean": [0.5, 0.5], "std": [0.5, 0.5, 0.5]}]},
     r"augment\[1\] \(Normalize\): Normalize has 2 mean values for images of 3 channel\(s\); give 1 or 3"),
    ({"augment": [{"name": "Grayscale"}, {"name": "ToDtype", "dtype": "float32", "scale": True},
                  {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}]},
     r"augment\[2\] \(Normalize\): Normalize has 3 mean and 3 std values for images of 1 channel"),
    ({"augment": [{"p": 0.5}]}, r"augment\[0\]: expected a mapping with 'name'"),
    ({"source": 3}, r"source: expected a URL"),
    ({"data": {}, "modle": {}}, r"modle: unknown top-level key beside 'data'; did you mean 'model'"),
    ([1, 2], r"expected a mapping at the top level"),
])
def test_bad_values_name_the_key_path(bad, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(bad, environ={})


def test_environment_interpolation_and_defaults():
    cfg = load_config({"source": {"train": "s3://${BUCKET}/train-{0..3}.tar",
                                  "storage_options": {"key": "${KEY}", "endpoint_url": "${EP:-http://127.0.0.1:9000}"}}},
                      environ={"BUCKET": "b1", "KEY": "k"})
    assert cfg.source.train == "s3://b1/train-{0..3}.tar"
    assert dict(cfg.source.storage_options) == {"key": "k", "endpoint_url": "http://127.0.0.1:9000"}
    with pytest.raises(ConfigError, match=r"source\.storage_options\.key: environment variable KEY is not set"):
        load_config({"source": {"storage_options": {"key": "${KEY}"}}}, environ={})


def test_secrets_never_shown():
    secret = "SENTINEL-a81c-SECRET"
    cfg = load_config({"source": {"train": "s3://b/x.tar", "storage_options": {"secret": "${S}"}}}, environ={"S": secret})
    assert cfg.source.storage_options["secret"] == secret
    for text in (repr(cfg), str(cfg), repr(cfg.source), str(cfg.to_dict()), yaml.safe_dump(cfg.to_dict())):
        assert secret not in text
    assert pickle.loads(pickle.dumps(cfg.source.storage_options))["secret"] == secret


def test_yaml_with_python_tags_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match=r"evil\.yaml \(line 1, column 7\): invalid YAML"):
        load_config(path)
    assert not marker.exists()


def test_broken_yaml_and_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("source:\n  train: [a, b\nloader: {}\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml \(line \d+, column \d+\): invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_lightning_cli_file_reads_its_data_section():
    cfg = parse_config({"model": {"arch": "small_cnn"}, "trainer": {"max_epochs": 1}, "data": GOOD})
    assert cfg == load_config(GOOD)
    assert {"model", "trainer"} <= LIGHTNING_SECTIONS


def test_presets_match_the_transform_sets():
    assert [s.name for s in preset("simple")] == ["RandomAffine", "RandomHorizontalFlip", "ToDtype", "RepeatChannels",
                                                  "Normalize"]
    assert "ColorJitter" in [s.name for s in preset("complex")] and preset("none") == ()


# -- properties ---------------------------------------------------------------------------------

sizes = st.lists(st.integers(1, 4096), min_size=2, max_size=2)
configs = st.fixed_dictionaries({
    "seed": st.integers(0, 2**31),
    "decode": st.fixed_dictionaries({"image_size": sizes, "backend": st.sampled_from(["auto", "dali", "pil", "nvjpeg"]),
                                     "resize": st.sampled_from(["fixed", "shorter", "random_resized_crop"])}),
    "loader": st.fixed_dictionaries({"batch_size": st.integers(1, 1024),
                                     "num_workers": st.one_of(st.none(), st.integers(0, 16))}),
    "augment": st.sampled_from(["simple", "complex", "none"]),
    "source": st.fixed_dictionaries({"train": st.text(st.characters(codec="ascii", exclude_characters="$"), min_size=1)}),
})


@settings(max_examples=60, deadline=None)
@given(configs)
def test_to_dict_round_trips(data):
    cfg = load_config(data, environ={})
    again = load_config(cfg.to_dict(), environ={})
    assert again == cfg


@settings(max_examples=60, deadline=None)
@given(configs, st.sampled_from(["decode", "loader", "source", ""]),
       st.text(st.characters(codec="ascii", categories=["Ll"]), min_size=1, max_size=12))
def test_any_unknown_key_raises_with_its_path(data, section, key):
    known = {f.name for f in dataclasses.fields(PipelineConfig)} | {"storage_options", "train", "val", "test", "predict"}
    from gpupipe.config.schema import LoaderConfig
    from gpupipe.decode import DecodeConfig
    known |= {f.name for f in dataclasses.fields(LoaderConfig)} | {f.name for f in dataclasses.fields(DecodeConfig)}
    if key in known or key == "data":
        return
    bad = {**data, section: {**data[section], key: 1}} if section else {**data, key: 1}
    with pytest.raises(ConfigError, match=rf"^{(section + '.') if section else ''}{key}: unknown key"):
        load_config(bad, environ={})


def test_secrets_mapping_compares_and_hides():
    s = Secrets({"a": 1})
    assert s == {"a": 1} and "1" not in repr(s) and len(s) == 1


def test_mix_mixes_labels_in_training_only(tmp_path):
    import torch
    from lightning_util import write_split

    root = write_split(str(tmp_path / "d"), 16, shard_size=8)
    cfg = load_config({"source": {"train": root, "val": root}, "decode": {"image_size": [16, 16]}, "augment": "simple",
                       "mix": {"name": "CutMix", "alpha": 1.0, "num_classes": 4},
                       "loader": {"batch_size": 8, "num_workers": 0}})
    from gpupipe.core.types import World
    from gpupipe.loader.gpu import GpuLoader

    train = list(GpuLoader(cfg.split("train"), world=World(), device="cpu"))
    assert all(b.labels.shape == (8, 4) and b.labels.dtype == torch.float32 for b in train)
    assert all(torch.allclose(b.labels.sum(1), torch.ones(8)) for b in train)
    val = list(GpuLoader(cfg.split("val"), world=World(), device="cpu"))
    assert all(b.labels.shape == (8,) for b in val)


@pytest.mark.parametrize("mix, message", [
    ({"name": "MixUp"}, r"mix \(MixUp\): .*num_classes"),
    ({"name": "Mixup", "num_classes": 3}, r"mix\.name: unknown 'Mixup'; did you mean 'MixUp'"),
])
def test_bad_mix(mix, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"augment": "simple", "mix": mix}, environ={})
    with pytest.raises(ConfigError, match="needs float images"):
        load_config({"mix": {"name": "MixUp", "num_classes": 3}}, environ={})


def test_reading_a_config_imports_no_heavy_stack():
    """Checking a config builds its transforms (Kornia) but never starts DALI or Lightning."""
    import subprocess
    import sys

    code = ("import sys, gpupipe; cfg = gpupipe.load_config({'augment': 'complex'}); "
            "print(sorted(m for m in ('nvidia.dali', 'lightning', 's3fs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_one_int_image_size_is_a_square_as_in_python():
    """YAML ``image_size: 96`` reads as GpuLoader(image_size=96) does: 96 x 96."""
    assert load_config({"decode": {"image_size": 96}}).decode.image_size == (96, 96)
    assert load_config({"decode": {"image_size": [96, 64]}}).decode.image_size == (96, 64)


def test_normalize_values_follow_the_channel_count():
    """One value broadcasts; after Grayscale + RepeatChannels(3) three fit again; behind a
    container that may change channels the count is not known and nothing is refused."""
    to_float = {"name": "ToDtype", "dtype": "float32", "scale": True}
    norm3 = {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}
    for augment in ([to_float, {"name": "Normalize", "mean": [0.5], "std": [0.2]}],
                    [{"name": "Grayscale"}, {"name": "RepeatChannels", "num_channels": 3}, to_float, norm3],
                    [{"name": "RandomGrayscale", "p": 0.5}, to_float, norm3]):
        assert len(load_config({"augment": augment}).augment) == len(augment)


def test_crops_that_fit_or_pad_are_accepted():
    for augment in ([{"name": "RandomCrop", "size": 128}], [{"name": "RandomCrop", "size": 160, "pad_if_needed": True}],
                    [{"name": "RandomCrop", "size": 140, "padding": 8}], [{"name": "CenterCrop", "size": 200}]):
        assert load_config({"decode": {"image_size": 128}, "augment": augment}).augment
    assert load_config({"augment": [{"name": "RandomCrop", "size": 256}]}).augment  # size unknown: decided later
