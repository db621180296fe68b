"""The docs cannot drift from the code: the configuration reference is checked against the
config dataclasses and the transform registry, every shipped config is mentioned, relative links
resolve, and every ```python block marked ``<!-- run -->`` runs."""
from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import re
import shutil
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from gpupipe.augment.registry import MIXES, TRANSFORMS, transform_class
from gpupipe.config.schema import LoaderConfig, PipelineConfig, SourceConfig, parse_config
from gpupipe.core.errors import ConfigError
from gpupipe.decode import DecodeConfig
from gpupipe.loader.encoded import StreamConfig
from gpupipe.storage.fetch import FetchConfig

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
SECTIONS = {"Top level": PipelineConfig, "source": SourceConfig, "stream": StreamConfig, "stream.fetch": FetchConfig,
            "decode": DecodeConfig, "loader": LoaderConfig}
REJECTED = {("stream", "on_error"): {"stream": {"on_error": "skip"}}, ("decode", "seed"): {"decode": {"seed": 1}}}
RUN_MARKER = "<!-- run -->"


# ------------------------------------------------------------------------------ parsing

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def prose(text: str) -> list[str]:
    """The page's lines with fenced code blocks blanked (a ``# comment`` there is no heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(heading, header cells, rows)`` for every Markdown table, under its nearest heading."""
    out, heading, lines, i = [], "", prose(text), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip().replace("`", "")
        elif line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            header, rows, i = _cells(line), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((heading, header, rows))
            continue
        i += 1
    return out


def reference_tables() -> dict[str, list[list[str]]]:
    found = {h: rows for h, header, rows in tables(REFERENCE.read_text()) if header == ["key", "type", "default", "meaning"]}
    assert set(found) == set(SECTIONS), f"configuration.md has key tables for {sorted(found)}"
    return found


def _code(cell: str) -> str:
    m = re.search(r"`([^`]*)`", cell)
    assert m, f"expected a value in backticks, got {cell!r}"
    return m.group(1)


def _documented(value):
    """A default as written in the docs (YAML, plus ``3/4``-style fractions) → plain data."""
    if isinstance(value, str) and re.fullmatch(r"\d+/\d+", value):
        return float(Fraction(value))
    if isinstance(value, list):
        return [_documented(v) for v in value]
    return value


def _plain(value):
    """A dataclass default → what a YAML file would say."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value):
        return {} if value == type(value)() else value  # a nested section at its defaults
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _equal(doc, code) -> bool:
    if isinstance(doc, list) and isinstance(code, list):
        return len(doc) == len(code) and all(_equal(a, b) for a, b in zip(doc, code))
    if isinstance(doc, (int, float)) and isinstance(code, (int, float)) and not isinstance(doc, bool):
        return not isinstance(code, bool) and math.isclose(doc, code, rel_tol=1e-12)
    return doc == code and type(doc) is type(code)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# ------------------------------------------------------------------------------ the reference

@pytest.mark.parametrize("section", SECTIONS)
def test_every_field_is_documented_and_nothing_else(section):
    documented = [_code(row[0]) for row in reference_tables()[section]]
    fields = [f.name for f in dataclasses.fields(SECTIONS[section])]
    assert len(documented) == len(set(documented)), f"{section}: a key is listed twice"
    assert set(documented) - set(fields) == set(), f"{section}: documented but not a field"
    assert set(fields) - set(documented) == set(), f"{section}: fields missing from docs/configuration.md"


@pytest.mark.parametrize("section", SECTIONS)
def test_documented_defaults_equal_the_dataclass_defaults(section):
    defaults = {f.name: _default(f) for f in dataclasses.fields(SECTIONS[section])}
    for row in reference_tables()[section]:
        key, doc = _code(row[0]), _documented(yaml.safe_load(_code(row[2])))
        assert _equal(doc, _plain(defaults[key])), f"{section}.{key}: docs say {doc!r}, code {defaults[key]!r}"


def test_keys_refused_on_purpose_are_documented_with_their_message():
    refused = {(s, _code(row[0])): row[3] for s, rows in reference_tables().items() for row in rows
               if "Not accepted in a file" in row[3]}
    assert set(refused) == set(REJECTED)
    for (section, key), config in REJECTED.items():
        with pytest.raises(ConfigError) as err:
            parse_config({"source": "x", **config})
        quoted = [q for q in re.findall(r"`([^`]*)`", refused[section, key]) if q.startswith(f"{section}.{key}:")]
        assert quoted and str(err.value).startswith(quoted[0]), (quoted, str(err.value))


def test_the_transform_list_is_the_registry():
    rows = [rows for h, header, rows in tables(REFERENCE.read_text()) if header[:2] == ["name", "arguments"]]
    assert len(rows) == 1, "configuration.md needs one `name | arguments | kind` table"
    listed = {_code(r[0]): re.findall(r"`([^`]*)`", r[1]) for r in rows[0]}
    assert set(listed) == set(TRANSFORMS)
    for name, args in listed.items():
        accepted = set(inspect.signature(transform_class(name).__init__).parameters) - {"self"}
        assert set(a for a in args if re.fullmatch(r"\w+", a)) == accepted, f"{name}: arguments listed {args}"
    text = REFERENCE.read_text()
    assert all(f"`{name}`" in text or f"name: {name}" in text for name in MIXES), "mix names missing"


# ------------------------------------------------------------------------------ all pages

def test_every_shipped_config_is_mentioned():
    text = "\n".join(p.read_text() for p in PAGES)
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert f"configs/{path.name}" in text, f"configs/{path.name} is not mentioned in the docs"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = [line.lstrip("#").strip() for line in prose(page.read_text()) if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_relative_links_resolve():
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = page.parent / target if target else page
            assert path.exists(), f"{page.relative_to(ROOT)} links to missing {target}"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{page.relative_to(ROOT)} links to missing #{anchor} in {target}"


def runnable_blocks() -> list[tuple[str, str]]:
    """``(id, code)`` of every ```python block right after a ``<!-- run -->`` line."""
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != RUN_MARKER:
                continue
            start = i + 1
            assert start < len(lines) and lines[start].strip() == "```python", f"{page.name}:{i + 1}: marker before a non-python block"
            end = lines.index("```", start + 1)
            blocks.append((f"{page.name}:{start + 1}", "\n".join(lines[start + 1:end])))
    return blocks


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder laid out like the repository after `make demo`, with small sample data."""
    from gpupipe.tools.demo import prepare

    root = tmp_path_factory.mktemp("docs")
    prepare(str(root / "demo-data"), images=160, size=64, shard_size=40)
    shutil.copytree(ROOT / "configs", root / "configs")
    return root


BLOCKS = runnable_blocks()


def test_some_blocks_are_marked_runnable():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[i for i, _ in BLOCKS])
def test_marked_python_blocks_run(code, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    exec(compile(code, "<docs>", "exec"), {"__name__": "__docs__"})


def test_every_python_block_of_the_readme_runs():
    """What a reader pastes first must work: no README snippet is left unmarked."""
    text = (ROOT / "README.md").read_text()
    assert text.count("```python") == text.count(f"{RUN_MARKER}\n```python") >= 3


def test_the_data_flow_picture_names_the_rooms_that_data_passes_through():
    """docs/dataflow.svg labels each box with the folders that do its work: the picture and the
    package show the same flow (core, config and tools are not stages of it)."""
    from test_layout import LAYER

    svg = (ROOT / "docs" / "dataflow.svg").read_text()
    rooms = [room for room in LAYER if room not in ("core", "config", "tools")]
    missing = [room for room in rooms if not re.search(rf"\b{room}(/|\.py)", svg)]
    assert not missing, f"rooms missing from docs/dataflow.svg: {missing}"
