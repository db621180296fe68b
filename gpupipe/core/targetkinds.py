"""What a source's ``targets`` setting may name, and the ragged-row arithmetic packed targets use:
plain Python and numpy, so that reading a config or a manifest never imports torch (the tensors
themselves are :mod:`gpupipe.core.targets`)."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpupipe.core.errors import ConfigError

__all__ = ["TARGET_KINDS", "target_kinds", "ragged_rows"]

TARGET_KINDS = ("boxes", "masks")


def ragged_rows(counts: np.ndarray, index: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """Items ``index`` of a ragged array whose item i owns ``counts[i]`` consecutive rows:
    ``(counts[index], rows)``, ``rows`` the flat positions of their rows, in that order (one
    ``np.repeat``, no loop over items). How packed boxes, polygons and the like are reordered."""
    counts = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(counts) - counts
    picked, starts = counts[index], first[index]
    before = np.cumsum(picked) - picked
    return picked, np.repeat(starts - before, picked) + np.arange(int(picked.sum()), dtype=np.int64)


def target_kinds(value: str | Iterable[str] | None, setting: str = "source.targets") -> tuple[str, ...]:
    """The target kinds a setting names, in :data:`TARGET_KINDS` order: ``None``, ``"none"`` or
    ``[]`` → ``()``; ``"boxes"``, ``"masks"``, ``"boxes+masks"``, ``"boxes,masks"`` or a list."""
    if value is None:
        return ()
    names = value.replace("+", ",").split(",") if isinstance(value, str) else list(value)
    out = set()
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"{setting}: expected target kinds ({', '.join(TARGET_KINDS)}), got {value!r}")
        name = name.strip().lower()
        if name in ("", "none"):
            continue
        if name not in TARGET_KINDS:
            raise ConfigError(f"{setting}: unknown target kind {name!r}; choose from {', '.join(TARGET_KINDS)} "
                              "(or both: 'boxes+masks')")
        out.add(name)
    return tuple(k for k in TARGET_KINDS if k in out)
