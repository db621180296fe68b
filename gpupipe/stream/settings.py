"""How samples are streamed and split (:class:`StreamConfig`), as plain settings: no torch here, so
that reading a config or a command line's flags does not import the stream's machinery."""
from __future__ import annotations

from dataclasses import dataclass, field

from gpupipe.core.errors import ConfigError
from gpupipe.core.types import ErrorPolicy
from gpupipe.storage.fetch import FetchConfig

__all__ = ["StreamConfig"]

BATCHING = ("mixed", "per_source")  # stream.batching: how a mix of sources fills a batch


@dataclass(frozen=True)
class StreamConfig:
    """How samples are streamed and split. ``shuffle_buffer`` is the shuffle window in
    samples (rounded to whole batches); ``shuffle_block`` the samples of one shard the epoch's
    order keeps together (a window holds blocks of many shards, so that shards written in class
    order still mix; 0: shards whole; None: 4 for tar shards where short reads are cheap, else 0,
    see :func:`gpupipe.loader.encoded.block_for`); ``unit_batches`` the batches of a window a worker
    reads at once (its unit of work; None: one batch where short reads are cheap — files on this
    machine, or object storage behind ``fetch.cache_dir`` — else the whole window: see
    :func:`gpupipe.loader.encoded.unit_batches_for`); ``on_error`` is ``raise`` or ``skip``;
    ``batching``, with several sources (``source.train`` a list): ``mixed`` batches draw from every
    source at random, ``per_source`` batches each hold one source's samples, a source's share of
    the batches its share of the epoch (each source's epoch count rounded down to whole batches)."""

    shuffle: bool = True
    shuffle_buffer: int = 1024
    shuffle_block: int | None = None
    unit_batches: int | None = None
    drop_last: bool = True
    batching: str = "mixed"
    on_error: ErrorPolicy = ErrorPolicy.RAISE
    fetch: FetchConfig = field(default_factory=FetchConfig)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "on_error", ErrorPolicy(self.on_error))
        except ValueError:
            raise ConfigError(f"stream.on_error: {self.on_error!r} is not one of 'raise', 'skip'") from None
        if self.shuffle_buffer < 0:
            raise ConfigError(f"stream.shuffle_buffer: must be >= 0, got {self.shuffle_buffer}")
        if self.shuffle_block is not None and self.shuffle_block < 0:
            raise ConfigError(f"stream.shuffle_block: must be >= 0 (0: shards whole), got {self.shuffle_block}")
        if self.batching not in BATCHING:
            raise ConfigError(f"stream.batching: {self.batching!r} is not one of {', '.join(map(repr, BATCHING))}")
        if self.unit_batches is not None and self.unit_batches < 1:
            raise ConfigError(f"stream.unit_batches: must be >= 1, got {self.unit_batches}")
