"""Typed reading of plain data (what YAML gives) into frozen dataclasses, with errors that
name the key path: ``build(StreamConfig, {"shuffle_bufer": 3}, "stream")`` raises
``ConfigError("stream.shuffle_bufer: unknown key; did you mean 'shuffle_buffer'? ...")``."""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from gpupipe.core.errors import ConfigError, suggest

__all__ = ["build", "coerce", "check_keys", "suggest", "join_path", "plain"]


def build(cls: type, data: Any, path: str) -> Any:
    """Build the frozen dataclass ``cls`` from a mapping, checking keys and types."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls) if f.init}
    check_keys(data, names, path)
    kwargs = {k: coerce(v, hints[k], join_path(path, k)) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(path) else f"{path}: {message}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def coerce(value: Any, hint: Any, path: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, path)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in hint)
            raise ConfigError(f"{path}: {value!r} is not one of {choices}") from None
    if origin is tuple:
        return _tuple(value, args, path)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return value
    return _scalar(value, hint, path)


def _tuple(value: Any, args: tuple, path: str) -> tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{path}: expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{path}: expected {len(args)} values, got {len(value)}")
    return tuple(coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _scalar(value: Any, hint: Any, path: str) -> Any:
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    if hint in (int, float, str, bool):
        raise ConfigError(f"{path}: expected {hint.__name__}, got {type(value).__name__} {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_keys(data: Mapping[str, Any], known: set | frozenset | Mapping, path: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(f"{join_path(path, str(key))}: unknown key{suggest(str(key), known)} "
                              f"(known: {', '.join(sorted(known))})")


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def plain(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings as plain YAML-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "plain_form"):  # a dataclass with a shorter written form (TransformSpec)
            return value.plain_form()
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value
