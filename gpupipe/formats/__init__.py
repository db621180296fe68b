"""Readers and writers of data at rest: WebDataset tar shards, image folders, Parquet.

The three built-in containers (:mod:`.containers`) register themselves in their modules, imported
here so that the registry always holds them."""
from gpupipe.formats import folder as _folder  # noqa: F401  (the image folder container)
from gpupipe.formats import rowgroups as _rowgroups  # noqa: F401  (Parquet)
from gpupipe.formats import tar as _tar  # noqa: F401  (tar shards)

__all__: list[str] = []
