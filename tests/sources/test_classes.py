"""One class list for every split: `gpupipe ingest --classes-from/--classes` numbers val as train,
and a DataModule whose splits' indexes disagree refuses to start, naming both lists."""
from __future__ import annotations

import io

import numpy as np
import pytest

from gpupipe.config.schema import load_config
from gpupipe.core.errors import ConfigError
from gpupipe.loader.gpu import GpuLoader
from gpupipe.prepare.ingest import ingest
from gpupipe.sources.classes import agreed_classes, class_list
from gpupipe.tools.cli import main

PIL = pytest.importorskip("PIL.Image")
COLOUR = {"ant": (250, 0, 0), "cat": (0, 250, 0), "dog": (0, 0, 250)}  # a class is known by its pixels


def write_folder(root, classes, per_class: int = 3) -> None:
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            buf = io.BytesIO()
            PIL.new("RGB", (12 + i, 10), COLOUR[name]).save(buf, "PNG")
            (root / name / f"{name}{i}.png").write_bytes(buf.getvalue())


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """train: ant, cat, dog; val: cat, dog (no ant) -- the folder layout that renumbers val."""
    root = tmp_path_factory.mktemp("classes")
    write_folder(root / "train-img", ["ant", "cat", "dog"])
    write_folder(root / "val-img", ["cat", "dog"])
    ingest(str(root / "train-img"), str(root / "train"), shard_size=4, progress=False)
    return root


def labelled_colours(url: str) -> list[tuple[str, int]]:
    """(class known from the decoded pixels, label) of every sample, through the loader."""
    loader = GpuLoader(url, batch_size=2, image_size=8, decode="pil", device="cpu", shuffle=False, drop_last=False,
                       num_workers=0)
    out = []
    for batch in loader:
        for image, label, valid in zip(batch.images, batch.labels, batch.valid):
            if valid:
                rgb = tuple(int(v) for v in image.float().mean((1, 2)).round())
                name = min(COLOUR, key=lambda c: np.abs(np.subtract(COLOUR[c], rgb)).sum())
                out.append((name, int(label)))
    return out


def test_val_ingested_with_classes_from_train_keeps_train_numbers(splits, capsys):
    train_index = str(splits / "train" / "index.json")
    assert main(["ingest", str(splits / "val-img"), str(splits / "val"), "--classes-from", train_index,
                 "--quiet"]) == 0
    assert "3 classes" in capsys.readouterr().out
    train_classes = class_list(train_index)
    assert train_classes == ("ant", "cat", "dog") and class_list(str(splits / "val")) == train_classes
    val = labelled_colours(str(splits / "val"))
    assert len(val) == 6 and {n for n, _ in val} == {"cat", "dog"}
    assert all(label == train_classes.index(name) for name, label in val), val
    train = labelled_colours(str(splits / "train"))
    assert len(train) == 9 and all(label == train_classes.index(name) for name, label in train)
    cfg = {"source": {"train": str(splits / "train"), "val": str(splits / "val")}, "decode": {"image_size": [8, 8]},
           "loader": {"num_workers": 0, "batch_size": 2}}
    from gpupipe.lightning import GpuDataModule

    dm = GpuDataModule(cfg)
    assert dm.classes == train_classes and dm.num_classes == 3


def test_splits_ingested_on_their_own_are_refused_naming_both_lists(splits):
    pytest.importorskip("lightning.pytorch")
    from gpupipe.lightning import GpuDataModule

    ingest(str(splits / "val-img"), str(splits / "val-own"), progress=False)
    assert [label for name, label in labelled_colours(str(splits / "val-own")) if name == "cat"][0] == 0  # renumbered
    dm = GpuDataModule({"source": {"train": str(splits / "train"), "val": str(splits / "val-own")},
                        "decode": {"image_size": [8, 8]}, "loader": {"num_workers": 0, "batch_size": 2}})
    with pytest.raises(ConfigError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert "train 3 classes [ant, cat, dog]" in message and "val 2 classes [cat, dog]" in message
    assert f"--classes-from {splits / 'train'}/index.json" in message and "label 0 is 'ant'" in message


def test_declared_classes_must_match_each_index(splits):
    train = str(splits / "train")
    loader = {"num_workers": 0, "batch_size": 2}
    cfg = load_config({"source": {"train": train, "classes": ["ant", "cat", "dog"]}, "loader": loader})
    assert cfg.source.classes == ("ant", "cat", "dog")
    GpuLoader(cfg.split("train"), device="cpu")
    wrong = load_config({"source": {"train": train, "classes": ["ant", "bee", "cat", "dog"]}, "loader": loader})
    with pytest.raises(ConfigError, match=r"source.classes lists 4 classes \[ant, bee, cat, dog\] but the train index "
                                          r"lists 3 classes \[ant, cat, dog\].*--classes ant,bee,cat,dog"):
        GpuLoader(wrong.split("train"), device="cpu")
    with pytest.raises(ConfigError, match="'cat' is listed more than once"):
        load_config({"source": {"train": train, "classes": ["cat", "cat"]}})
    with pytest.raises(ConfigError, match=r"source.classes: expected a list"):
        load_config({"source": {"train": train, "classes": "cat,dog"}})


def test_a_class_outside_the_given_list_is_refused(splits, tmp_path):
    given = r"class\(es\) \['ant'\] that the class list \(2 classes \[cat, dog\]\)"
    with pytest.raises(ConfigError, match=given):
        ingest(str(splits / "train-img"), str(tmp_path / "out"), classes=["cat", "dog"], progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "names.txt").write_text("dog\ncat\nant\n")  # any order: it is the numbering
    report = ingest(str(splits / "val-img"), str(tmp_path / "out"), classes_from=str(tmp_path / "names.txt"),
                    progress=False)
    assert report.classes == ("dog", "cat", "ant")
    assert all(label == report.classes.index(n) for n, label in labelled_colours(str(tmp_path / "out")))
    with pytest.raises(ConfigError, match="not both"):
        ingest(str(splits / "val-img"), str(tmp_path / "x"), classes=["cat"], classes_from=str(tmp_path / "names.txt"))


def test_parquet_string_labels_follow_the_given_list(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [("cat", (0, 250, 0)), ("dog", (0, 0, 250)), ("cat", (0, 250, 0))]
    images = []
    for _, colour in rows:
        buf = io.BytesIO()
        PIL.new("RGB", (9, 9), colour).save(buf, "PNG")
        images.append(buf.getvalue())
    pq.write_table(pa.table({"image": images, "label": [n for n, _ in rows]}), str(tmp_path / "val.parquet"))
    report = ingest(str(tmp_path / "val.parquet"), str(tmp_path / "out"), classes=["ant", "cat", "dog"], progress=False)
    assert report.classes == ("ant", "cat", "dog") and report.num_samples == 3
    assert sorted(labelled_colours(str(tmp_path / "out"))) == [("cat", 1), ("cat", 1), ("dog", 2)]
    with pytest.raises(ConfigError, match=r"class\(es\) \['dog'\] that the class list \(2 classes \[ant, cat\]\)"):
        ingest(str(tmp_path / "val.parquet"), str(tmp_path / "out2"), classes=["ant", "cat"], progress=False)


def test_agreement_rules():
    assert agreed_classes({"train": ("a", "b"), "val": (), "test": ("a", "b")}) == ("a", "b")
    assert agreed_classes({"val": ()}) == ()
    assert agreed_classes({"val": ()}, ("x",)) == ("x",)
    with pytest.raises(ConfigError, match=r"the train and val indexes .*--classes-from s3://b/train/index.json"):
        agreed_classes({"val": ("b",), "train": ("a", "b")}, urls={"train": "s3://b/train/", "val": "s3://b/val/"})
    with pytest.raises(ConfigError, match=r"--classes-from data/train/index.json"):
        agreed_classes({"val": ("b",), "train": ("a", "b")}, urls={"train": "data/train/shard-{0..3}.tar"})


def test_mix_must_have_the_data_class_count(splits):
    pytest.importorskip("lightning.pytorch")
    from gpupipe.lightning import GpuDataModule

    dm = GpuDataModule({"source": str(splits / "train"), "augment": "simple", "decode": {"image_size": [8, 8]},
                        "mix": {"name": "MixUp", "num_classes": 4}, "loader": {"num_workers": 0, "batch_size": 2}})
    with pytest.raises(ConfigError, match=r"mix.num_classes: 4, but the data has 3 classes \[ant, cat, dog\]"):
        dm.setup("fit")
