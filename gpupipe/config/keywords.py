"""The keyword form: ``GpuLoader(url, batch_size=256, image_size=224, ...)`` → a :class:`SplitConfig`.

The keywords are not a second list of settings: they are derived from the dataclasses that
declare each setting once (:class:`LoaderConfig`, :class:`DecodeConfig`, :class:`StreamConfig`,
:class:`FetchConfig`, :class:`SourceConfig`) — every field that applies to one loader is a
keyword of the same name, type and default (:data:`KEYWORDS`), plus a few of the keyword form's
own (``decode=``/``stream=`` objects, ``augment``, ``mix``, ``on_error``, ``seed``, ``rank``,
``world_size``). :func:`split_from_options` writes the keywords into the same mapping a YAML file
gives and parses it, so a bad value gets the same ``ConfigError`` either way; an unknown keyword
is named with a did-you-mean in terms of the class the user called (``GpuLoader``). A setting
given twice with two values (``image_size=32`` and a ``DecodeConfig`` with another size) raises
naming both; a setting given once is the one used.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields, replace
from typing import Any

from gpupipe.config.augment import TransformSpec
from gpupipe.config.schema import LoaderConfig, SourceConfig, parse_config
from gpupipe.config.split import SplitConfig
from gpupipe.config.values import build, plain, suggest
from gpupipe.core.errors import ConfigError, UnknownKeywordError
from gpupipe.core.types import World
from gpupipe.decode import DecodeConfig
from gpupipe.sources.source import Source
from gpupipe.storage.fetch import FetchConfig
from gpupipe.stream.settings import StreamConfig

__all__ = ["Keyword", "KEYWORDS", "IGNORED", "split_from_options", "keyword_form", "keyword_signature",
           "keyword_help", "check_keywords", "python_transforms"]

log = logging.getLogger(__name__)
# torch DataLoader keywords a port keeps that mean nothing here: taken, said once per process, ignored
IGNORED = {"pin_memory": "GpuLoader's batches are decoded on its device already, and EncodedLoader's are encoded "
                         "bytes its decoder stages itself: there is no batch in host memory to pin"}
_SAID: set[str] = set()


@dataclass(frozen=True)
class Keyword:
    """One keyword of the keyword form: where it goes in the YAML mapping (``path``), its
    declared type and default (read from the declaring dataclass), and what it says."""

    name: str
    path: str
    annotation: Any
    default: Any
    doc: str = ""

    @property
    def section(self) -> str:
        return self.path.rpartition(".")[0]


# Sections whose fields are keywords; fields that are not: the splits' URLs (the positional
# ``source``), Lightning-only settings, settings derived from another (decode.seed, stream.on_error),
# and the ones the keyword form spells its own way (decode.backend → decode=, decode.on_error → on_error=).
_SECTIONS = (("loader", LoaderConfig), ("decode", DecodeConfig), ("stream", StreamConfig),
             ("stream.fetch", FetchConfig), ("source", SourceConfig))
_NOT_KEYWORDS = frozenset({"loader.eval_batch_size", "loader.batch_format", "loader.augment_in", "loader.log_metrics",
                           "decode.backend",
                           "decode.seed", "decode.on_error", "stream.on_error", "stream.fetch", "source.train",
                           "source.val", "source.test", "source.predict"})
_OWN = (  # the keyword form's own keywords: (name, annotation, default, doc)
    ("decode", "str | DecodeConfig | None", None, "the decode backend (auto, dali, nvjpeg, pil) or a DecodeConfig"),
    ("stream", "StreamConfig | None", None, "a StreamConfig (the plain keywords fill in what it leaves at defaults)"),
    ("augment", "Any", None, "a preset name, transform specs, a transform or a list of transforms (composed)"),
    ("mix", "Any", None, "MixUp/CutMix: a spec or a built transform"),
    ("on_error", "str | None", None, "raise or skip (decode.on_error; one policy for stream and decode)"),
    ("seed", "int", 0, "keys the plan, the decode crops and every augmentation draw"),
    ("rank", "int | None", None, "this process's rank (default: from the environment)"),
    ("world_size", "int | None", None, "the number of ranks (default: from the environment)"),
)


def declared_default(f: Field) -> Any:
    """A dataclass field's default, made by its factory where it has one."""
    return f.default_factory() if callable(f.default_factory) else f.default


def _declared() -> tuple[Keyword, ...]:
    own = [Keyword(name, name, annotation, default, doc) for name, annotation, default, doc in _OWN]
    out = []
    for section, cls in _SECTIONS:
        for f in fields(cls):
            path = f"{section}.{f.name}"
            if path not in _NOT_KEYWORDS:
                out.append(Keyword(f.name, path, f.type, declared_default(f), f"{path} in YAML"))
        if section == "loader":  # batch_size first, then the keyword form's own, then the stages'
            out += own
    names = [k.name for k in out]
    assert len(names) == len(set(names)), f"two settings would share a keyword: {names}"
    return tuple(out)


KEYWORDS: Mapping[str, Keyword] = {k.name: k for k in _declared()}


def keyword_signature(*leading: inspect.Parameter) -> inspect.Signature:
    """``leading`` parameters, then every keyword with its declared type and default: what
    ``help(GpuLoader)`` and ``inspect.signature`` show for the keyword form."""
    kw = [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=k.default, annotation=k.annotation)
          for k in KEYWORDS.values() if k.name not in {p.name for p in leading}]
    return inspect.Signature([*leading, *kw])


def keyword_help() -> str:
    """The keywords as a docstring section: name, default and where the setting is in YAML."""
    lines = ["Keywords (each a setting of the YAML config; docs/configuration.md says what it does):"]
    lines += [f"    {k.name}={k.default!r}: {k.doc}" for k in KEYWORDS.values()]
    return "\n".join(lines)


def keyword_form(cls: type) -> type:
    """Class decorator of a loader whose ``__init__(split, ..., **options)`` takes the keyword form:
    its signature and docstring list the keywords (``help(GpuLoader)``, IDEs, ``inspect``)."""
    init = cls.__init__  # type: ignore[misc]
    leading = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    init.__signature__ = keyword_signature(*leading)
    cls.__doc__ = f"{cls.__doc__ or ''}\n\n{keyword_help()}\n"
    return cls


def check_keywords(options: Mapping[str, Any], caller: str) -> None:
    """Refuse a keyword that is not one, naming it in terms of the class the user called."""
    for name in options:
        if name not in KEYWORDS:
            hint = suggest(name, KEYWORDS) or f"; keywords: {', '.join(sorted(KEYWORDS))}"
            raise UnknownKeywordError(f"{caller}(): unknown keyword {name!r}{hint} (help({caller}) shows them all)")


def split_from_options(source, *, caller: str = "GpuLoader", **options: Any) -> tuple[SplitConfig, World]:
    """The keyword form → (the training split it describes, the ``World`` it runs in).

    ``source``: a URL, a list of them or a :class:`~gpupipe.sources.source.Source`. ``decode`` is
    a backend name or a :class:`DecodeConfig`; ``stream`` a :class:`StreamConfig`; the plain
    keywords (:data:`KEYWORDS`) fill in what those leave at their defaults and must agree with
    what they set. ``caller`` names the class in errors.
    """
    for name in IGNORED.keys() & options.keys():
        value = options.pop(name)
        if value and name not in _SAID:
            _SAID.add(name)
            log.info("%s(%s=%r): ignored: %s", caller, name, value, IGNORED[name])
    check_keywords(options, caller)
    decode, stream = options.pop("decode", None), options.pop("stream", None)
    if isinstance(decode, Mapping):  # decode={"backend": "pil", ...}, as the YAML section
        decode = build(DecodeConfig, decode, "decode")
    if isinstance(stream, Mapping):
        stream = build(StreamConfig, stream, "stream")
    for name, value, cls in (("decode", decode, DecodeConfig), ("stream", stream, StreamConfig)):
        if value is not None and not isinstance(value, cls) and not (name == "decode" and isinstance(value, str)):
            raise ConfigError(f"{caller}({name}=...): expected a {cls.__name__} or a mapping of its keys, "
                              f"got {type(value).__name__}")
    sections: dict[str, dict[str, Any]] = {
        "decode": {"backend": decode} if isinstance(decode, str) else _non_default(decode),
        "stream": _non_default(stream), "stream.fetch": _non_default(stream.fetch if stream else None),
        "loader": {}, "source": {}}
    sections["stream"].pop("fetch", None)
    for name, value in options.items():
        keyword = KEYWORDS[name]
        if keyword.section in sections and value is not None:
            _merge_one(sections[keyword.section], keyword.section, name, value)
    policy = _one_value("on_error", [("on_error", options.get("on_error")),
                                     ("decode.on_error", sections["decode"].pop("on_error", None)),
                                     ("stream.on_error", sections["stream"].pop("on_error", None))])
    seed = _one_value("seed", [("seed", options.get("seed")), ("decode.seed", sections["decode"].pop("seed", None))])
    if policy is not None:
        sections["decode"]["on_error"] = policy
    if sections["loader"].get("device") is not None:
        sections["loader"]["device"] = str(sections["loader"]["device"])
    given_source, source_section = _source_section(source, sections["source"])
    stream_section = {**sections["stream"], **({"fetch": sections["stream.fetch"]} if sections["stream.fetch"] else {})}
    mapping: dict[str, Any] = {"source": source_section, "stream": plain(stream_section),
                               "decode": plain(sections["decode"]), "loader": sections["loader"],
                               "seed": 0 if seed is None else seed}
    objects: dict[str, Any] = {}  # transforms given as Python objects skip the parser and are set as they are
    for name in ("augment", "mix"):
        value = options.get(name)
        if _yaml_able(value, TransformSpec):
            if value is not None:
                mapping[name] = plain(value)
        else:
            objects[name] = python_transforms(value) if name == "augment" else value
    split = parse_config(mapping, origin=caller).split("train")
    if given_source is not None:
        objects["source"] = given_source
    split = replace(split, **objects).with_decode_from_augment()  # a torchvision crop without image_size: its size
    return split, World.detect(options.get("rank"), options.get("world_size"))


def _source_section(source: Any, given: dict[str, Any]) -> tuple[Source | None, dict[str, Any]]:
    """The ``source`` section from the positional source and the source keywords; a
    :class:`Source` object is kept whole (it may name a labels file) and must agree with them."""
    if not isinstance(source, Source):
        url = list(source) if isinstance(source, (list, tuple)) else source
        return None, {"train": url, **given, "storage_options": dict(given.get("storage_options") or {})}
    for name, value in given.items():
        held = getattr(source, name)
        if not held:  # the Source left it unset: the keyword sets it
            source = replace(source, **{name: value})
        elif _normal(name, _plain_map(value)) != _normal(name, _plain_map(held)):
            raise ConfigError(f"{name}: given twice, as {name}= and in the Source; give it once")
    section = {"train": source.url, "storage_options": dict(source.storage_options)}
    section.update({k: getattr(source, k) for k in ("classes", "image_column", "label_column", "annotations")
                    if getattr(source, k) is not None})
    if source.targets:
        section["targets"] = list(source.targets)
    return source, section


def _non_default(config) -> dict[str, Any]:
    """The fields of a stage config that differ from the defaults (what the caller set)."""
    if config is None:
        return {}
    default = type(config)()
    return {f.name: getattr(config, f.name) for f in fields(config)
            if getattr(config, f.name) != getattr(default, f.name)}


def _plain_map(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


def _merge_one(section: dict[str, Any], where: str, name: str, value: Any) -> None:
    """Set ``name`` in ``section`` unless the section object already set another value: then
    raise naming both."""
    if name in section and _normal(name, section[name]) != _normal(name, value):
        raise ConfigError(f"{name}: given twice, {name}={value!r} and {where}.{name}={section[name]!r}; "
                          "give it once")
    section[name] = _normal(name, value)


def _one_value(name: str, given: list[tuple[str, Any]]) -> Any:
    """The one value among the places a setting may be given; two different ones raise."""
    found = [(where, _normal(name, v)) for where, v in given if v is not None]
    if len({v for _, v in found}) > 1:
        raise ConfigError(f"{name}: given twice, " + " and ".join(f"{w}={v!r}" for w, v in found) + "; give it once")
    return found[0][1] if found else None


def _normal(name: str, value: Any) -> Any:
    """A value in one comparable form: enums by value, an int image size as (h, w)."""
    value = getattr(value, "value", value)
    if name == "image_size" and isinstance(value, int):
        return (value, value)
    return tuple(value) if isinstance(value, list) else value


def python_transforms(value: Any) -> Any:
    """``augment`` given as Python objects, ready for a :class:`SplitConfig`: a transform or any
    callable as it is, a list of transform objects (``augment=[T.RandomHorizontalFlip(), ...]``)
    as the ``Compose`` a torchvision user would have wrapped it in; ``None`` when ``value`` is
    the config's form (a preset name, specs, mappings), which the YAML parser reads."""
    if _yaml_able(value, TransformSpec):
        return None
    if not isinstance(value, (list, tuple)):
        if value is not None and not callable(value):
            raise ConfigError("augment: expected a transform, a list of transforms, a preset name or specs; "
                              f"got {type(value).__name__}")
        return value
    from gpupipe.augment.compose import Compose

    try:
        return Compose(list(value))
    except TypeError as exc:
        raise ConfigError(f"augment: {exc} (torchvision transforms: gpupipe.transforms.from_torchvision)") from None


def _yaml_able(value: Any, spec_type: type) -> bool:
    """Whether ``augment``/``mix`` can go through the YAML parser (a preset name, specs,
    mappings) rather than being a transform object given in Python."""
    if value is None or isinstance(value, (str, spec_type, Mapping)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, (str, spec_type, Mapping)) for v in value)
