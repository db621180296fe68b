"""The keyword form is derived from the settings' one declaration (issue 24): every field of the
stage dataclasses that applies to one loader is a ``GpuLoader``/``EncodedLoader`` keyword of the
same name, type and default; ``help()``/``inspect.signature`` show them; an unknown keyword is
named with a did-you-mean in terms of the class called; every keyword given is the value used."""
from __future__ import annotations

import inspect
import pydoc
from dataclasses import MISSING, fields, replace
from pathlib import Path

import numpy as np
import pytest
from datagen import write_dataset

from gpupipe.config.keywords import _NOT_KEYWORDS, _SECTIONS, KEYWORDS
from gpupipe.core.errors import ConfigError, UnknownKeywordError
from gpupipe.decode import DecodeConfig
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.loader.gpu import GpuLoader
from gpupipe.sources.source import Source
from gpupipe.tools.synth import synthetic_jpeg

N = 16

# A valid value other than the default for every keyword that lands in a section. A new setting
# makes test_every_stage_keyword_has_a_value_here fail until it is added here and checked below.
NON_DEFAULT = {
    "batch_size": 4, "num_workers": 0, "prefetch": 3, "device": "cpu",
    "image_size": (8, 12), "resize": "random_resized_crop", "scale": (0.5, 1.0), "ratio": (0.5, 2.0),
    "max_pixels": 1 << 20, "num_threads": 2, "hw_decoder_load": 0.5, "fancy_upsampling": False,
    "shuffle": False, "shuffle_buffer": 8, "shuffle_block": 2, "unit_batches": 2, "drop_last": False,
    "batching": "per_source",
    "concurrency": 3, "object_concurrency": 5, "readahead_bytes": 1 << 20, "block_bytes": 1 << 19, "retries": 2,
    "backoff_s": 0.01, "backoff_max_s": 0.5, "request_timeout_s": 7.0, "cache_dir": None, "cache_bytes": 1 << 24,
    "refetch": 1, "classes": ("a", "b"), "image_column": None, "label_column": None, "targets": ("boxes",),
    "annotations": None,
    "storage_options": {"anon": False},
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("keywords") / "ds")
    write_dataset(root, [8, 8], image=lambda i: synthetic_jpeg(np.random.default_rng(i), (16, 16)), num_classes=2)
    index = Path(root) / MANIFEST_NAME
    index.write_text(replace(Manifest.from_json(index.read_text()), classes=("a", "b")).to_json())
    return root


def test_every_field_of_every_section_is_a_keyword_or_said_not_to_be():
    """A setting added to a stage dataclass becomes a keyword by itself; one that must not is listed
    in _NOT_KEYWORDS with the reason beside it."""
    for section, cls in _SECTIONS:
        for f in fields(cls):
            path = f"{section}.{f.name}"
            if path in _NOT_KEYWORDS:
                assert f.name not in KEYWORDS or KEYWORDS[f.name].path != path, path
                continue
            keyword = KEYWORDS[f.name]
            default = f.default if f.default is not MISSING else f.default_factory()  # as dataclasses does
            assert (keyword.path, keyword.annotation, keyword.default) == (path, f.type, default)


def test_every_stage_keyword_has_a_value_here():
    assert {k.name for k in KEYWORDS.values() if k.section} == set(NON_DEFAULT)


@pytest.mark.parametrize("cls", [GpuLoader, EncodedLoader])
def test_help_and_the_signature_show_every_keyword_with_its_default(cls):
    params = inspect.signature(cls).parameters
    assert list(params)[0] == "split"
    for keyword in KEYWORDS.values():
        assert params[keyword.name].default == keyword.default, keyword.name
        assert params[keyword.name].kind is inspect.Parameter.KEYWORD_ONLY
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert "shuffle_buffer: 'int' = 1024" in text and "shuffle_buffer=1024: stream.shuffle_buffer in YAML" in text


@pytest.mark.parametrize("cls", [GpuLoader, EncodedLoader])
def test_an_unknown_keyword_is_named_with_a_did_you_mean_for_the_class_called(shards, cls):
    with pytest.raises(UnknownKeywordError) as info:
        cls(shards, batch_size=4, shuffle_bufer=8)
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}(): unknown keyword 'shuffle_bufer'; did you mean 'shuffle_buffer'?")
    assert "split_from_options" not in message and f"(help({cls.__name__}) shows them all)" in message
    assert isinstance(info.value, TypeError) and isinstance(info.value, ConfigError)  # as Python's own, and ours
    with pytest.raises(UnknownKeywordError, match="; keywords: annotations, augment, backoff_max_s"):  # nothing close: the list
        cls(shards, zzzz=1)


def test_every_keyword_given_is_the_value_used(shards):
    # batching: per_source needs a mix of sources (tests/loader/test_mixed_sources.py gives it so)
    given = {k: v for k, v in NON_DEFAULT.items() if k not in ("device", "batching")}
    loader = GpuLoader(shards, device="cpu", **given)
    split = loader.split
    where = {"loader": split, "decode": split.decode, "stream": split.stream, "stream.fetch": split.stream.fetch,
             "source": split.source}
    for name, value in given.items():
        keyword = KEYWORDS[name]
        got = getattr(where[keyword.section], name)
        got = dict(got) if name == "storage_options" else getattr(got, "value", got)
        assert got == value, (name, got, value)
    assert str(loader.device) == "cpu" and EncodedLoader(shards, device="cpu", batch_size=4).split.device == "cpu"
    assert loader.classes == ("a", "b")


def test_a_keyword_and_a_stage_object_that_disagree_raise_naming_both(shards):
    with pytest.raises(ConfigError, match=r"hw_decoder_load=0.5 and decode.hw_decoder_load=0.25"):
        GpuLoader(shards, batch_size=4, decode=DecodeConfig(hw_decoder_load=0.25), hw_decoder_load=0.5)
    loader = GpuLoader(shards, batch_size=4, decode=DecodeConfig(hw_decoder_load=0.25), image_size=8)
    assert (loader.split.decode.hw_decoder_load, loader.split.decode.image_size) == (0.25, (8, 8))


def test_a_section_given_as_a_mapping_is_read_as_its_yaml_section(shards):
    """``stream={"shuffle_block": 0}`` as users write it from a YAML habit: the section's keys,
    checked as in a config file; anything else names what was expected."""
    loader = EncodedLoader(shards, batch_size=4, stream={"shuffle_block": 0, "fetch": {"concurrency": 3}},
                           decode={"backend": "pil", "image_size": [8, 8]})
    assert (loader.split.stream.shuffle_block, loader.split.stream.fetch.concurrency) == (0, 3)
    assert (loader.split.decode.backend, loader.split.decode.image_size) == ("pil", (8, 8))
    with pytest.raises(ConfigError, match=r"stream.shuffle_blok: unknown key; did you mean 'shuffle_block'"):
        EncodedLoader(shards, batch_size=4, stream={"shuffle_blok": 0})
    with pytest.raises(ConfigError, match=r"stream=...\): expected a StreamConfig or a mapping of its keys, got int"):
        EncodedLoader(shards, batch_size=4, stream=4)


def test_source_keywords_fill_a_source_object_and_refuse_a_second_value(shards):
    loader = EncodedLoader(Source(shards), batch_size=4, classes=["a", "b"])
    assert isinstance(loader.split.source, Source) and loader.split.source.classes == ("a", "b")
    with pytest.raises(ConfigError, match="classes: given twice"):
        EncodedLoader(Source(shards, classes=("a", "b")), batch_size=4, classes=["b", "a"])
    with pytest.raises(ConfigError, match="source.classes|classes"):  # the index numbers a, b: b, a disagrees
        EncodedLoader(shards, batch_size=4, classes=["b", "a"])


def test_command_line_flags_of_settings_take_type_path_and_default_from_the_declaration(capsys):
    import argparse

    from gpupipe.tools.cliargs import setting_argument

    p = argparse.ArgumentParser(prog="x")
    setting_argument(p, "hw_decoder_load")
    setting_argument(p, "batch_size", default=128)
    assert vars(p.parse_args(["--hw-decoder-load", "0.5"])) == {"hw_decoder_load": 0.5, "batch_size": 128}
    text = p.format_help()
    assert "(decode.hw_decoder_load; default 0.9)" in text and "(loader.batch_size; default 128)" in text
    with pytest.raises(SystemExit):
        p.parse_args(["--batch-size", "many"])
    assert "invalid int value: 'many'" in capsys.readouterr().err
