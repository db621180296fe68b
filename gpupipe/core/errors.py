"""The gpupipe exception tree.

Every error a user can cause (bad data, bad config, unreachable storage) is a
:class:`GpupipeError`; each message names the bad value and, where there is one,
the way out.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "suggest",
    "GpupipeError",
    "ConfigError",
    "UnknownKeywordError",
    "ShardFormatError",
    "DecodeError",
    "StorageError",
    "StorageAuthError",
    "StorageEndpointError",
    "StorageNotFoundError",
    "PlanError",
    "MissingDependencyError",
    "WorkerError",
]


class GpupipeError(Exception):
    """Base class of every error gpupipe raises on purpose."""


class ConfigError(GpupipeError, ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


class UnknownKeywordError(ConfigError, TypeError):
    """A keyword the called class does not take (``GpuLoader(url, batch_szie=8)``); a TypeError
    too, as Python's own for an unexpected keyword argument."""


class ShardFormatError(GpupipeError):
    """A shard is not a valid WebDataset-layout tar (or disagrees with its manifest).

    ``shard`` is the shard URL and ``offset`` the byte offset in it where the
    problem was found (``None`` when it is not about one place).
    """

    def __init__(self, message: str, *, shard: str = "", offset: int | None = None):
        where = shard + (f" at byte {offset}" if offset is not None else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.shard = shard
        self.offset = offset
        self.reason = message


class DecodeError(GpupipeError):
    """An image could not be decoded (or failed the pre-decode header check)."""


class StorageError(GpupipeError, OSError):
    """Storage refused or failed a request for good (after retries, or a 403/404)."""

    def __init__(self, message: str, *, url: str = ""):
        super().__init__(f"{url}: {message}" if url else message)
        self.url = url


class StorageAuthError(StorageError):
    """No credentials were found, or storage refused them (403): not retried; the
    message says which variable or storage option to set."""


class StorageEndpointError(StorageError):
    """The storage endpoint cannot be reached: unknown host name, connection refused,
    network unreachable, or no connection within the connect timeout."""


class StorageNotFoundError(StorageError):
    """The bucket or object does not exist (404): not retried."""


class PlanError(GpupipeError):
    """The epoch plan cannot be made or resumed as asked (e.g. world size changed mid-epoch)."""


class MissingDependencyError(GpupipeError, ImportError):
    """An optional dependency is needed for the asked feature; the message says which extra."""

    def __init__(self, package: str, *, extra: str, feature: str):
        super().__init__(
            f"{feature} needs the '{package}' package: pip install 'gpupipe[{extra}]'"
        )
        self.package = package
        self.extra = extra


class WorkerError(GpupipeError, RuntimeError):
    """A DataLoader worker process died (killed, out of memory, crashed); the message
    names the worker, its pid and the shards it was reading."""


def suggest(word: str, choices: Iterable) -> str:
    """``"; did you mean 'brightness'?"`` for the choice closest to a mistyped ``word`` (case
    ignored), ``""`` when none is close: the one hint YAML keys, keywords, transform arguments and
    names all give."""
    lowered = {str(c).lower(): str(c) for c in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[match[0]]!r}?" if match else ""
