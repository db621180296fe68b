"""Storage room: bytes from any fsspec filesystem — ranged, retried, optionally cached.

* :mod:`~gpupipe.storage.fetch` — :class:`Fetcher`: concurrent, bounded, retried byte-range reads;
* :mod:`~gpupipe.storage.objects` — many small whole objects at once (an image folder);
* :mod:`~gpupipe.storage.faults` — what a failed request means, and the error a user sees;
* :mod:`~gpupipe.storage.cache` — the optional local cache of fetched blocks, bounded across processes;
* :mod:`~gpupipe.storage.identity` — what an object's bytes are known by (checksum, ETag, mtime), so
  that no cache entry outlives them.

Imports only :mod:`gpupipe.core` (the layer table in ``tests/test_layout.py``).
"""
from gpupipe.storage.cache import BlockCache
from gpupipe.storage.fetch import FetchConfig, Fetcher, FetchStats, is_transient, open_filesystem, refuse_commands
from gpupipe.storage.identity import ObjectVersion, identity_of
from gpupipe.storage.objects import fetch_objects

__all__ = ["FetchConfig", "FetchStats", "Fetcher", "open_filesystem", "is_transient", "refuse_commands",
           "fetch_objects", "BlockCache", "ObjectVersion", "identity_of"]
