"""A split given as a list of sources, mixed (docs/configuration.md, "Several sources")::

    source:
      train:
        - {url: data/photos/, weight: 3}
        - {url: data/sketches/, weight: 1}
        - {url: data/extra/, repeat: 0.5}

A list of URL strings stays one source made of several shard patterns; a list of mappings, each
with its ``url``, is a mix: :class:`SourceEntry` is one such mapping, :func:`parse_sources` reads
the list, :func:`mixed_source` makes the :class:`~gpupipe.sources.mixed.MixedSource` a loader reads.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpupipe.config.values import build
from gpupipe.core.errors import ConfigError
from gpupipe.sources.mixed import Drawn, MixedSource
from gpupipe.sources.resolved import Source

__all__ = ["SourceEntry", "DRAW_KEYS", "is_source_list", "parse_sources", "mixed_source"]

DRAW_KEYS = ("weight", "repeat", "samples")


@dataclass(frozen=True)
class SourceEntry:
    """One source of a mix: its ``url`` (a folder, a pattern or a list of them) and how many samples
    an epoch takes of it — one of ``weight`` (relative: the weighted sources share their total size
    in these proportions), ``repeat`` (its size times this: 0.5 is half of it a epoch, 2 all of it
    twice) or ``samples`` (absolute). None of them: ``repeat: 1``, each sample once."""

    url: str | tuple[str, ...]
    weight: float | None = None
    repeat: float | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        given = [k for k in DRAW_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ConfigError(f"give one of weight, repeat or samples, not {' and '.join(given)}")
        for k in given:
            if getattr(self, k) < 0:
                raise ConfigError(f"{k} must be >= 0, got {getattr(self, k)}")
        if not self.url:
            raise ConfigError("url is empty; give a folder, a pattern or a list of shard URLs")

    def drawn(self) -> Drawn:
        if self.weight is None and self.samples is None:
            return Drawn(repeat=1.0 if self.repeat is None else self.repeat)
        return Drawn(weight=self.weight, samples=self.samples)


def is_source_list(value: Any) -> bool:
    """Whether a split's value is a list of sources (mappings), not of URL patterns."""
    return isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, SourceEntry)) for v in value)


def parse_sources(value: Any, path: str) -> tuple[SourceEntry, ...]:
    """A list of source mappings → entries; errors name the source's index and the key."""
    out = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if isinstance(item, SourceEntry):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a mapping with a url (and one of weight, repeat or samples), got "
                              f"{item!r}; a list is either URL patterns (one source) or mappings (a mix), not both")
        if "url" not in item:
            known = {f.name for f in fields(SourceEntry)}
            others = sorted(set(item) - known)
            hint = f" (unknown key{'s' if len(others) > 1 else ''}: {', '.join(map(str, others))})" if others else ""
            raise ConfigError(f"{where}: no url{hint}; each source of a list is a mapping with its url and one of "
                              "weight, repeat or samples")
        out.append(build(SourceEntry, item, where))
    if not out:
        raise ConfigError(f"{path}: an empty list of sources")
    return tuple(out)


def mixed_source(entries: tuple[SourceEntry, ...], setting: str, *, storage_options: Mapping[str, Any],
                 classes: tuple[str, ...] | None, image_column: str | None, label_column: str | None,
                 targets: str | tuple[str, ...]) -> MixedSource:
    """The :class:`MixedSource` of a split's entries, each source with the split's settings."""
    parts = tuple(Source(url=e.url, storage_options=storage_options, image_column=image_column,
                         label_column=label_column, targets=targets) for e in entries)
    return MixedSource(parts=parts, draws=tuple(e.drawn() for e in entries), classes=classes, setting=setting)
