"""Sources room: where the data is — a URL pattern resolved into units and a manifest.

* :mod:`~gpupipe.sources.source` — :class:`Source` → :class:`ResolvedSource` (tar shards with an
  ``index.json``, or a folder / Parquet files / a Delta table read in place); the two values
  themselves are :mod:`~gpupipe.sources.resolved`'s;
* :mod:`~gpupipe.sources.inplace` — the manifest of a source read in place, from one listing;
* :mod:`~gpupipe.sources.classes` — one class list for every split.

Imports storage, formats and core only.
"""
from gpupipe.sources.source import ResolvedSource, Source, UnitURLs, expand_pattern, resolve

__all__ = ["Source", "ResolvedSource", "UnitURLs", "expand_pattern", "resolve"]
