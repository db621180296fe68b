"""What a new user met on an ImageNet-style folder with odd files (issue 36, cases 1 and 5-9): bench
compares a baseline on the folder itself, an empty file is named when the loader is made, every message
fits its case, one key names a sample in the log, ``batch.keys`` and ``gpupipe validate``, the log says a
thing once, and ``star.gif`` beside ``star.png`` is two samples. Tiny folders of real JPEGs, Pillow on the
CPU."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpupipe import GpuLoader
from gpupipe.core.errors import ConfigError, ShardFormatError, StorageNotFoundError
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.prepare.ingest import ingest
from gpupipe.sources.classes import agreed_classes
from gpupipe.tools.cli import main
from gpupipe.tools.preview import layout
from gpupipe.tools.synth import synthetic_jpeg
from gpupipe.tools.validate import validate

PAGE = b"<!DOCTYPE html><html><body>Not found</body></html>"  # a saved error page, named .jpg


def write_folder(root: Path, per_class: dict[str, int], odd: dict[str, bytes] | None = None,
                 size: tuple[int, int] = (40, 30)) -> str:
    """``root/<class>/img<i>.jpg`` real JPEGs of ``size`` (w, h), and the ``odd`` files as given."""
    rng = np.random.default_rng(len(per_class))
    for name, n in per_class.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / name / f"img{i}.jpg").write_bytes(synthetic_jpeg(rng, size))
    for rel, data in (odd or {}).items():
        (root / rel).write_bytes(data)
    return str(root)


def make(url, **kw) -> GpuLoader:
    kw.setdefault("image_size", 16)
    return GpuLoader(url, batch_size=2, device="cpu", decode="pil", num_workers=0, rank=0, world_size=1, **kw)


def said(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


# ---------------------------------------------------------------- 1. bench on a folder


def test_bench_compares_the_baseline_on_an_image_folder_and_counts_each_bad_file_once(tmp_path, capsys):
    """Failed before issue 36: ``tarfile.ReadError: file could not be opened successfully`` (the baseline
    opened the folder's images as tar files), and gpupipe's skips were counted once per pass (6 for 2 bad
    files over 3 rounds; alone, once per epoch). The baseline reads the folder's files as gpupipe lists them; each loader counts the
    2 bad files once; the no-index warning is said once though the source is resolved twice (case 8)."""
    folder = write_folder(tmp_path / "imgs", {"ant": 4, "bee": 4}, {"ant/empty.jpg": b"", "bee/page.jpg": PAGE})
    out = tmp_path / "bench.json"
    code = main(["bench", folder, "--compare", "baseline", "--workers", "0", "--repeat", "3", "--warmup", "0",
                 "--batch-size", "2", "--image-size", "16", "--device", "cpu", "--decode", "pil", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    rows = {r["loader"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["baseline"]["reads"] == "the image folder's files, as gpupipe lists them"
    assert rows["gpupipe"]["batches"] == 3  # 10 samples of 2, less the 2 untimed: every run a whole epoch
    assert rows["gpupipe"]["skipped"] == rows["baseline"]["skipped"] == 2, rows
    assert err.count("no index.json for") == 1, err
    assert main(["bench", folder, "--batch-size", "2", "--image-size", "16", "--device", "cpu", "--decode", "pil",
                 "--workers", "0", "--epochs", "3"]) == 0  # gpupipe alone: 3 timed epochs, still 2 bad files
    assert "skipped images 2 (distinct samples replaced)" in capsys.readouterr().out
    assert main(["bench", folder, "--compare", "webdataset", "--workers", "0"]) == 2
    assert "this source is an image folder read in place, and webdataset read tar shards" in capsys.readouterr().err


# ---------------------------------------------------------------- 5. an empty file, said at start


def test_an_empty_image_is_named_when_the_loader_is_made_with_both_ways_out(tmp_path, caplog):
    """Failed before issue 36: the loader was made, and the first batch raised ``ShardFormatError ... the
    image is empty (0 bytes)`` from deep in the stream (30 frames), naming neither remedy. A zero-byte file
    is known from the listing: under ``raise`` the loader refuses it when made, naming the file, ``on_error:
    skip`` and ``gpupipe validate``; under ``skip`` it says so once and each epoch counts it as a skip."""
    folder = write_folder(tmp_path / "imgs", {"ant": 3, "bee": 3}, {"ant/empty.jpg": b""})
    for cls in (GpuLoader, EncodedLoader):
        with pytest.raises(ShardFormatError) as err:
            cls(folder, batch_size=2, rank=0, world_size=1, num_workers=0)
        message = str(err.value)
        assert "1 of its 7 images is empty (0 bytes): ant/empty.jpg" in message, message
        assert "on_error='skip'" in message and f"gpupipe validate {folder}" in message
    with caplog.at_level(logging.WARNING):
        loader = make(folder, on_error="skip", shuffle=False, drop_last=False)
        make(folder, on_error="skip")  # a second loader of the same source: not said again
    assert len(said(caplog, "is empty (0 bytes): ant/empty.jpg")) == 1
    for epoch in range(2):
        list(loader)
        assert loader.stats.skipped == epoch + 1  # a counted skip, every epoch


# ---------------------------------------------------------------- 6. messages that fit their case


def test_a_path_that_does_not_exist_says_it_does_not_exist(tmp_path):
    """Failed before issue 36: ``nowhere/`` read "no tar shards, images or .parquet files here", a glob in it
    "no shards match this pattern (and no index.json here)"."""
    for url in (f"{tmp_path}/nowhere/", f"{tmp_path}/nowhere", f"{tmp_path}/nowhere/*.tar"):
        with pytest.raises(StorageNotFoundError if "*" not in url else Exception, match="does not exist"):
            make(url)
    (tmp_path / "empty").mkdir()  # a folder that exists but holds nothing keeps its message
    with pytest.raises(Exception, match="no tar shards, images or .parquet files here"):
        make(str(tmp_path / "empty") + "/")


def test_the_class_mismatch_hint_for_folders_read_in_place_points_at_no_index_json(tmp_path):
    """Failed before issue 36: the way out read ``--classes-from <train folder>/index.json``, a file an image
    folder read in place does not have. Now: number every split with one list; for val shards beside a train
    folder, re-ingest with ``--classes a,b,c`` (the list itself)."""
    urls = {"train": str(tmp_path / "train"), "val": str(tmp_path / "val")}
    found = {"train": ("ant", "bee", "cat"), "val": ("bee", "cat")}
    with pytest.raises(ConfigError) as err:
        agreed_classes(found, urls=urls, kinds={"train": "folder", "val": "folder"})
    message = str(err.value)
    assert "index.json" not in message and "--classes-from" not in message, message
    assert "splits (train and val read in place) list different classes" in message
    assert "GpuLoader(<val url>, classes=train_loader.classes)" in message and "source.classes:" in message
    with pytest.raises(ConfigError) as err:
        agreed_classes(found, urls=urls, kinds={"train": "folder", "val": "tar"})
    assert "index.json" not in str(err.value) and "--classes ant,bee,cat" in str(err.value)
    with pytest.raises(ConfigError, match="--classes-from .*train/index.json"):  # shards both: as before
        agreed_classes(found, urls=urls)


def test_a_datamodule_over_two_folders_read_in_place_gives_the_in_place_hint(tmp_path):
    """The same through ``GpuDataModule``, as a user meets it (failed before issue 36 as above)."""
    pytest.importorskip("lightning.pytorch")
    from gpupipe.lightning import GpuDataModule

    train = write_folder(tmp_path / "train", {"ant": 2, "bee": 2, "cat": 2})
    val = write_folder(tmp_path / "val", {"bee": 2, "cat": 2})
    dm = GpuDataModule({"source": {"train": train, "val": val}, "decode": {"image_size": [8, 8], "backend": "pil"},
                        "loader": {"batch_size": 2, "num_workers": 0, "device": "cpu"}})
    with pytest.raises(ConfigError) as err:
        dm.setup("fit")
    assert "index.json" not in str(err.value) and "classes=train_loader.classes" in str(err.value), err.value


def test_preview_shows_n_samples_logs_a_skip_once_and_says_they_are_one_class(tmp_path, capsys, caplog):
    """Failed before issue 36: "first 4 samples" with 3 drawn (the empty file's slot left out), its skip logged
    twice (again for the end-of-epoch padding that repeats it), and all of one class with no word of why.
    Now 4 are drawn (the next batch makes up for it), the skip is said once, and the one class is explained;
    ``--shuffle`` draws from across the split."""
    folder = write_folder(tmp_path / "imgs", {"ant": 4, "bee": 4}, {"ant/empty.jpg": b""})  # 9: padding at the end
    config = tmp_path / "p.yaml"
    config.write_text(f"source: {folder}\ndecode: {{image_size: [16, 16], on_error: skip, backend: pil}}\n"
                      "loader: {device: cpu, num_workers: 0}\n")
    with caplog.at_level(logging.WARNING):
        assert main(["preview", "--config", str(config), "--n", "4", "--out", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert "4 samples of train, the first stored, not shuffled" in out, out
    assert "all 4 are of class 0: the split is stored class by class; --shuffle" in out
    assert len(said(caplog, "skipping")) == 1, said(caplog, "skipping")
    with Image.open(tmp_path / "a.png") as img:
        assert img.size == layout(4, (16, 16)).size
    assert main(["preview", "--config", str(config), "--n", "5", "--out", str(tmp_path / "b.png"), "--shuffle"]) == 0
    out = capsys.readouterr().out
    assert "5 samples of train, shuffled as in epoch 0" in out and "are of class" not in out
    with Image.open(tmp_path / "b.png") as img:
        assert img.size == layout(5, (16, 16)).size  # 3 x 2 tiles (4 would be 2 x 2)


# ---------------------------------------------------------------- 7. one key per sample


def test_one_key_joins_the_log_the_batch_and_validate(tmp_path, caplog):
    """Failed before issue 36: the empty file was ``<folder>/ant/empty.jpg#0`` in ``batch.keys``, ``ant/empty``
    in the log and ``ant/empty.jpg`` in validate's list. The one form is the sample key, the path without its
    extension (``ant/empty``): the key a tar shard gives the same file, so it names the sample before and
    after ``gpupipe ingest``; the file itself (with its extension) stays in validate's ``shard`` column."""
    folder = write_folder(tmp_path / "imgs", {"ant": 3, "bee": 3}, {"ant/empty.jpg": b"", "bee/page.jpg": PAGE})
    with caplog.at_level(logging.WARNING):
        loader = make(folder, on_error="skip", shuffle=False, drop_last=False)
        batches = list(loader)
    in_batches = {k for b in batches for k, ok in zip(b.keys, b.valid.tolist()) if not ok}
    logged = {k for k in in_batches for m in said(caplog, "skipping") if f"{k}:" in m or f"sample {k}:" in m}
    report = validate(folder, decode="pil")
    in_validate = {p.key for p in report.problems}
    assert in_batches == logged == in_validate == {"ant/empty", "bee/page"}, (in_batches, logged, in_validate)
    assert {p.shard for p in report.problems} == {f"{folder}/ant/empty.jpg", f"{folder}/bee/page.jpg"}
    assert set(loader.decoder.stats.skipped_keys) == {"bee/page"}  # the decode's skip, by the same key


# ---------------------------------------------------------------- 8. said once


def test_the_no_index_warning_is_said_once_per_source_and_validate_says_nothing_of_its_own_resize(tmp_path, caplog):
    """Failed before issue 36: each loader of a folder warned "no index.json" again, and ``gpupipe validate``
    warned that resize 'fixed' stretches images, about the 8x8 decode it does to check them."""
    folder = write_folder(tmp_path / "imgs", {"ant": 2, "bee": 2}, size=(48, 24))
    with caplog.at_level(logging.WARNING):
        make(folder)
        make(folder)
        report = validate(folder, decode="pil")
    assert report.checked == 4 and not report.problems
    assert len(said(caplog, "no index.json for")) == 1
    assert said(caplog, "changes the aspect ratio") == []
    with caplog.at_level(logging.WARNING):  # a training loader still says it
        next(iter(make(folder)))
    assert len(said(caplog, "changes the aspect ratio")) == 1


# ---------------------------------------------------------------- 9. star.gif and star.png


def test_a_gif_and_a_png_of_one_name_are_two_samples_in_place_and_through_ingest_with_the_same_keys(tmp_path):
    """Failed before issue 36: "star/a.gif and star/a.png give one sample key 'star/a'" (refused), where
    torchvision's ImageFolder reads both. Their keys keep the extension, tar-safe (``star/a_gif``,
    ``star/a_png``); the others keep theirs; the same keys in place, with an index.json and from shards."""
    root = tmp_path / "imgs"
    for rel, fmt in (("star/a.gif", "GIF"), ("star/a.png", "PNG"), ("moon/b.png", "PNG"), ("moon/c.jpg", "JPEG")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10, 12), (200, 10, 10)).save(root / rel, fmt)

    def keys(url) -> list[str]:
        loader = EncodedLoader(url, batch_size=2, shuffle=False, drop_last=False, num_workers=0, rank=0, world_size=1)
        return sorted(k for b in loader for k in b.keys)

    want = ["moon/b", "moon/c", "star/a_gif", "star/a_png"]
    assert keys(str(root)) == want
    ingest(str(root), str(tmp_path / "shards"), shuffle=False, progress=False)
    assert keys(str(tmp_path / "shards")) == want
    assert main(["index", str(root), "--quiet"]) == 0  # read in place through its index.json: the same
    assert keys(str(root)) == want
    (root / "star" / "a_gif.jpg").write_bytes((root / "moon" / "c.jpg").read_bytes())  # a_gif twice, even so
    (root / "index.json").unlink()
    with pytest.raises(ConfigError, match="star/a.gif and .*star/a_gif.jpg give one sample key 'star/a_gif'"):
        keys(str(root))
