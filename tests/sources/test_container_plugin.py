"""Proof by plugin for containers (issue 37): zip archives of images, registered from outside the
package in one module (tests/sources/zip_container.py), are recognised in a folder listing, read in
place and trained on through ``GpuLoader`` with 0 and 2 workers, indexed, inspected and validated —
no edit inside gpupipe/. A damaged archive is a clear error or a counted skip; it is ingested into
shards through its own reader; what the plugin does not give (checksums, a mix) is refused naming
the container."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zip_container  # registers the "zip" container (tests/sources is on the path)
from PIL import Image

from gpupipe import GpuLoader
from gpupipe.core.errors import ConfigError, GpupipeError
from gpupipe.formats.containers import register_container, unregister_container
from gpupipe.formats.manifest import Manifest

unregister_container("zip")  # importing registered it: kept out of the other tests collected beside these


@pytest.fixture(autouse=True)
def zip_registered():
    """The plugin's container for this module's tests only: the registry is the process's, and the
    other tests of this worker see the built-ins alone."""
    register_container(zip_container.ZIP)
    yield
    unregister_container("zip")


ARCHIVES = {"ant/a.zip": 5, "ant/b.zip": 2, "bee/c.zip": 4, "bee/d.zip": 1}  # 12 images


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def zips(tmp_path) -> Path:
    root = tmp_path / "zips"
    value = 0
    for name, n in ARCHIVES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(root / name, "w") as z:
            z.writestr("README.txt", "not an image: not a sample")
            for i in range(n):
                value += 1
                z.writestr(f"img{i:02d}.png", _png(10 * value))
    return root


def _expected() -> dict[str, tuple[int, int]]:
    """key -> (pixel value, label), as written above."""
    out, value = {}, 0
    for name, n in ARCHIVES.items():
        for i in range(n):
            value += 1
            out[f"{name}/img{i:02d}"] = (10 * value, 0 if name.startswith("ant") else 1)
    return out


def _seen(loader) -> dict[str, tuple[int, int]]:
    seen = {}
    for batch in loader:
        for image, key, label in zip(batch.images, batch.keys, batch.labels.tolist()):
            assert torch.all(image == image.flatten()[0]), key  # one value an image: no pixels of another
            assert key not in seen, f"{key} twice in an epoch"
            seen[key] = (int(image.flatten()[0]), label)
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_zip_archives_from_outside_the_package_train_through_gpu_loader(zips, workers, train_steps):
    loader = GpuLoader(str(zips), batch_size=4, image_size=4, resize="fixed", decode="pil", device="cpu",
                       num_workers=workers, seed=3)
    assert loader.encoded.source.kind == "zip" and loader.encoded.spec.num_samples == 12
    assert _seen(loader) == _expected()
    assert torch.isfinite(train_steps(loader))


def test_its_index_is_written_read_back_inspected_and_validated(zips, capsys, caplog):
    from gpupipe.prepare.indexer import index_in_place
    from gpupipe.tools.cli import main
    from gpupipe.tools.validate import validate

    manifest = index_in_place(str(zips), progress=False)
    assert manifest is not None and manifest.kind == "zip" and manifest.num_samples == 12
    doc = json.loads((zips / "index.json").read_text())
    assert doc["kind"] == "zip" and doc["zips"]["counts"] == [5, 2, 4, 1] and doc["classes"] == ["ant", "bee"]
    again = Manifest.from_json((zips / "index.json").read_text())  # through the registry's table
    assert again.kind == "zip" and again.table.to_dict() == manifest.table.to_dict() and again.classes == ("ant", "bee")
    caplog.clear()
    loader = GpuLoader(str(zips), batch_size=4, image_size=4, resize="fixed", decode="pil", device="cpu", seed=3)
    assert _seen(loader) == _expected()
    assert not [r for r in caplog.records if "no index.json" in r.getMessage()]  # read from the index
    assert main(["inspect", str(zips)]) == 0
    out = capsys.readouterr().out
    assert "kind:     zip archives (read in place)" in out and "units:    4 archives" in out, out
    report = validate(str(zips), decode="pil")
    assert report.checked == 12 and report.problems == []


def test_a_damaged_archive_is_a_clear_error_or_a_counted_skip(zips):
    (zips / "bee" / "c.zip").write_bytes((zips / "bee" / "c.zip").read_bytes()[:40])  # cut after listing
    from gpupipe.sources.resolved import Source
    from gpupipe.sources.source import resolve

    resolved = resolve(Source(str(zips)))
    assert resolved.skipped == (("bee/c.zip", resolved.skipped[0][1]),) and "not a zip" in resolved.skipped[0][1]
    assert resolved.manifest.num_samples == 8  # described without it
    loader = GpuLoader(str(zips), batch_size=4, image_size=4, resize="fixed", decode="pil", device="cpu", seed=3)
    assert len(_seen(loader)) == 8
    # cut after the index was written: read as the index says, it fails at read time
    (zips / "bee" / "c.zip").unlink()
    from gpupipe.prepare.indexer import index_in_place

    zips_again = zips.parent / "again"
    zips.rename(zips_again)
    index_in_place(str(zips_again), progress=False)
    data = (zips_again / "ant" / "a.zip").read_bytes()
    (zips_again / "ant" / "a.zip").write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    with pytest.raises(GpupipeError, match=r"ant/a.zip.*not a zip archive"):
        list(GpuLoader(str(zips_again), batch_size=4, image_size=4, resize="fixed", decode="pil", device="cpu"))
    skipping = GpuLoader(str(zips_again), batch_size=4, image_size=4, resize="fixed", decode="pil", device="cpu",
                         on_error="skip")
    keys = [k for batch in skipping for k in batch.keys]
    assert skipping.stats.skipped == 5 and len(keys) == 8  # its 5 replaced by good ones, each counted
    assert not any(k.startswith("ant/a.zip") for k in keys)


def test_it_is_ingested_into_shards_through_its_own_reader(zips, tmp_path):
    from gpupipe.prepare.ingest import ingest

    report = ingest(str(zips), str(tmp_path / "shards"), shard_size=5, seed=2, val_fraction=0.25, progress=False)
    assert report.num_samples == 12 and report.skipped == []
    seen = {}
    for split in ("train", "val"):
        loader = GpuLoader(str(tmp_path / "shards" / split), batch_size=2, image_size=4, resize="fixed",
                           decode="pil", device="cpu", drop_last=False)
        seen.update(_seen(loader))
    assert seen == _expected()  # every image once, its pixels and class, over the two splits
    again = ingest(str(zips), str(tmp_path / "again"), shard_size=5, seed=2, val_fraction=0.25, processes=2,
                   progress=False)
    assert again.num_samples == 12
    assert [p.read_bytes() for p in sorted((tmp_path / "again").rglob("*.tar"))] == \
        [p.read_bytes() for p in sorted((tmp_path / "shards").rglob("*.tar"))]  # the same bytes from two processes


def test_what_the_plugin_does_not_give_is_refused_naming_it(zips, tmp_path):
    from gpupipe.prepare.indexer import index_in_place

    with pytest.raises(ConfigError, match=r"zip archives container \('zip'\) does not support it.*unit_crcs"):
        index_in_place(str(zips), checksums=True, progress=False)
    with pytest.raises(ConfigError, match=r"a mix of sources: the zip archives container \('zip'\).*'join'"):
        GpuLoader([{"url": str(zips), "weight": 1}, {"url": str(zips), "weight": 1}], batch_size=4, image_size=4,
                  resize="fixed", decode="pil", device="cpu")


def test_a_misspelt_hook_or_an_unknown_kind_is_refused_by_name():
    from gpupipe.formats.containers import HOOKS, container

    with pytest.raises(ValueError, match=r"unknown hook\(s\) \['read_span'\] \(known: describe"):
        zip_container.ZIP.hook(read_span=zip_container.read_spans)
    assert "read_spans" in HOOKS and container("zip") is zip_container.ZIP
    with pytest.raises(GpupipeError, match=r"not a valid manifest: unknown kind of source 'lance' \(known: "):
        Manifest.from_json(json.dumps({"format": "gpupipe-manifest", "version": 2, "kind": "lance", "classes": []}))
