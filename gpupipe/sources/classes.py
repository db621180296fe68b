"""One class list for every split of a dataset.

A label in a shard is a number; what it means is the class list in the split's
``index.json`` (written by ``gpupipe ingest``). Splits ingested on their own get their
lists from their own folders, so a val folder that lacks a class numbers the others
differently. :func:`agreed_classes` is the check that such splits are never trained and
validated together: every split's list must equal the declared ``source.classes`` (when
given) and each other's. :func:`class_list` reads the list another split was ingested with
(``gpupipe ingest --classes-from``), :func:`check_class_names` validates one given by hand.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.formats.containers import container

__all__ = ["CLASSES_NAME", "agreed_classes", "check_class_names", "class_list", "class_lines", "describe"]

CLASSES_NAME = "classes.txt"  # one class name per line, beside the shards

_SHOWN = 8  # class names shown in a message before "..."


def check_class_names(names: Sequence[str], what: str) -> tuple[str, ...]:
    """``names`` as a tuple; raises naming ``what`` when it is empty, repeats a name, or holds
    a name that cannot be a class folder (empty, or with a ``/``)."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{what}: expected a list of class names, got {names!r}")
    names = tuple(names)
    if not names:
        raise ConfigError(f"{what}: the class list is empty; give at least one class name")
    bad = [n for n in names if not n.strip() or "/" in n or n != n.strip()]
    if bad:
        raise ConfigError(f"{what}: {bad[0]!r} is not a class name (a class is a folder name: not empty, no '/', "
                          "no surrounding spaces)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{what}: {repeated[0]!r} is listed more than once; each class has one number")
    return names


def describe(classes: Sequence[str]) -> str:
    """``3 classes [ant, cat, dog]``, shortened for long lists."""
    shown = ", ".join(classes[:_SHOWN]) + (", ..." if len(classes) > _SHOWN else "")
    return f"{len(classes)} classes [{shown}]"


def agreed_classes(found: Mapping[str, Sequence[str]], declared: Sequence[str] | None = None,
                   urls: Mapping[str, str] | None = None, kinds: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The one class list of a dataset: ``declared`` when given, else the splits' own.

    ``found`` maps a split name to the class list its index carries (``()``: the index
    lists none, which agrees with anything). ``urls`` (split → URL) makes the way out in
    the message concrete; ``kinds`` (split → its container's name: a
    :attr:`~gpupipe.sources.source.ResolvedSource.kind`; tar where not given) keeps it true: a
    split read in place has no shards to re-ingest, and maybe no index.json to point at.
    Raises :class:`ConfigError` naming both lists where two differ.
    """
    urls, kinds = urls or {}, kinds or {}
    known = {split: tuple(c) for split, c in found.items() if c}
    if declared is not None:
        declared = tuple(declared)
        for split, classes in known.items():
            if classes != declared:
                raise ConfigError(
                    f"source.classes lists {describe(declared)} but the {split} index lists {describe(classes)}"
                    f"{_first_difference(declared, classes)}: its labels would mean other classes. "
                    f"{_way_out(split, urls, '--classes ' + ','.join(declared))} (or correct the list: classes= in "
                    "Python, source.classes in YAML)")
        return declared
    splits = sorted(known, key=lambda s: (s != "train", s))  # train's list is the reference
    for split in splits[1:]:
        first = splits[0]
        if known[split] != known[first]:
            in_place = [s for s in (first, split) if container(kinds.get(s, "tar")).in_place]
            what = "indexes" if not in_place else f"splits ({' and '.join(in_place)} read in place)"
            message = (f"the {first} and {split} {what} list different classes: {first} {describe(known[first])}, "
                       f"{split} {describe(known[split])}{_first_difference(known[first], known[split])}; label "
                       f"numbers mean different classes in each. {_one_list(first, split, known[first])}")
            if split not in in_place:  # shards: re-ingesting them with the reference's numbering is the other way
                numbering = ("--classes " + ",".join(known[first])) if first in in_place else \
                    ("--classes-from " + _index_of(first, urls))
                message += f" For tar shards: {_way_out(split, urls, numbering)}"
            raise ConfigError(message)
    return known[splits[0]] if splits else ()


def _one_list(first: str, other: str, classes: tuple[str, ...]) -> str:
    """The way out for splits read in place (image folders, Parquet): number them all with one list."""
    shown = ", ".join(classes[:_SHOWN]) + (", ..." if len(classes) > _SHOWN else "")
    return (f"Number every split with the {first} split's list: GpuLoader(<{other} url>, "
            f"classes={first}_loader.classes) in Python, source.classes: [{shown}] in YAML.")


def _first_difference(a: tuple[str, ...], b: tuple[str, ...]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f" (label {i} is {x!r} in one, {y!r} in the other)"
    return ""


def _index_of(split: str, urls: Mapping[str, str]) -> str:
    url = urls.get(split) or f"<{split} shards>"
    if url.endswith(".json"):
        return url
    folder, _, last = url.rstrip("/").rpartition("/")
    shards = any(ch in last for ch in "*?[{") or last.endswith(".tar")  # a pattern: its folder holds the index
    return f"{folder if shards else url.rstrip('/')}/index.json"


def _way_out(split: str, urls: Mapping[str, str], option: str) -> str:
    return (f"Re-ingest the {split} split with that numbering: gpupipe ingest <{split} images> "
            f"{urls.get(split) or f'<{split} shards>'} {option}")


def class_list(url: str, *, storage_options: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The class list at ``url``: an ``index.json`` (its ``classes``), a folder holding one,
    or a text file with one class name a line (``classes.txt``)."""
    from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
    from gpupipe.storage.fetch import open_filesystem

    fs, path = open_filesystem(url, storage_options)
    path = path.rstrip("/")
    if not path.endswith((".json", ".txt")) and fs.isdir(path):
        path = f"{path}/{MANIFEST_NAME}"
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise StorageError("no such file; give an index.json, the folder that holds one, or a classes.txt",
                           url=url) from None
    classes = Manifest.from_json(data, source=url).classes if path.endswith(".json") else class_lines(data)
    if not classes:
        raise ConfigError(f"--classes-from {url}: lists no classes (an index of unlabelled or Parquet-integer "
                          "data); give the names with --classes a,b,c")
    return check_class_names(classes, f"--classes-from {url}")


def class_lines(data: bytes) -> tuple[str, ...]:
    """The names in a ``classes.txt``: one a line, blank lines ignored."""
    return tuple(line.strip() for line in data.decode("utf-8").splitlines() if line.strip())
