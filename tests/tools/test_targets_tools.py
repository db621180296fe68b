"""``gpupipe synth``, ``index`` and ``ingest`` know about boxes and masks; ``index.json`` records
the kinds the shards hold, and a source asking for a kind the data lacks is refused at start."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest
from datagen import write_dataset, write_detection
from PIL import Image

from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.core.types import Sample
from gpupipe.formats.annotations import parse_boxes
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest, held_kinds
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.prepare import ingest as ingest_module
from gpupipe.prepare.indexer import index
from gpupipe.sources.source import Source, resolve
from gpupipe.tools.cli import main
from gpupipe.tools.synth import detection_sample


def _samples(folder) -> dict[str, dict]:
    return {s.key: dict(s.fields) for p in sorted(folder.glob("*.tar"))
            for s in group_by_key(iter_members([p.read_bytes()]))}


def test_synth_writes_exact_detection_data(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "a"), "--images", "12", "--size", "40x30", "--classes", "4",
                 "--shard-size", "5", "--seed", "7"]) == 0
    assert "12 samples" in capsys.readouterr().out
    main(["synth", str(tmp_path / "b"), "--images", "12", "--size", "40x30", "--classes", "4", "--shard-size", "5",
          "--seed", "7"])
    a = _samples(tmp_path / "a")
    assert a == _samples(tmp_path / "b")  # deterministic by seed
    m = Manifest.from_json((tmp_path / "a" / MANIFEST_NAME).read_text())
    assert m.targets == ("boxes", "masks") and len(m.classes) == 4 and len(m.shards) == 3
    counts = []
    for key, fields in a.items():
        boxes, labels = parse_boxes(fields["json"], key, 4)
        mask = np.asarray(Image.open(io.BytesIO(fields["mask.png"])))
        assert mask.shape == (30, 40) and Image.open(io.BytesIO(fields["jpg"])).size == (40, 30)
        for box, label in zip(boxes.astype(int), labels):  # a rectangle's mask lies inside its box
            assert ((mask == label + 1)[box[1]:box[3], box[0]:box[2]]).any()
        painted = np.zeros_like(mask, bool)
        for box in boxes.astype(int):
            painted[box[1]:box[3], box[0]:box[2]] = True
        assert ((mask > 0) == painted).all()  # and nothing outside the boxes
        counts.append(len(boxes))
    assert 0 in counts and max(counts) > 1


def test_synth_without_targets_writes_classification_shards(tmp_path):
    main(["synth", str(tmp_path), "--images", "4", "--targets", "none"])
    assert {tuple(sorted(f)) for f in _samples(tmp_path).values()} == {("cls", "jpg")}
    assert Manifest.from_json((tmp_path / MANIFEST_NAME).read_text()).targets == ()
    assert main(["synth", str(tmp_path / "x"), "--targets", "keypoints"]) == 2


def test_index_records_the_kinds_the_shards_hold(tmp_path):
    write_detection(str(tmp_path), 9, shard_size=3, kinds=("boxes",), manifest=False,
                    damage={4: lambda f: {**f, "json": b'{"caption": "not boxes"}'}})
    m = index(str(tmp_path), progress=False)
    assert [s.targets for s in m.shards] == [("boxes",)] * 3 and m.targets == ("boxes",)
    again = Manifest.from_json((tmp_path / MANIFEST_NAME).read_text())
    assert again == m and again.targets == ("boxes",)
    assert held_kinds({"json": b'{"caption": "a cat"}'}) == set()  # metadata .json is not boxes
    assert held_kinds({"json": b"{not json", "mask.png": b"x"}) == {"boxes", "masks"}  # damaged: reported on read


def test_old_index_files_load_with_no_record(tmp_path):
    write_dataset(str(tmp_path), [3, 2])
    doc = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert "targets" not in doc and all("targets" not in s for s in doc["shards"])
    m = Manifest.from_json(json.dumps(doc))
    assert m.targets is None and all(s.targets is None for s in m.shards)
    assert resolve(Source(str(tmp_path), targets="boxes")).targets == ("boxes",)  # checked when read, then
    doc["targets"] = ["keypoints"]
    with pytest.raises(ShardFormatError, match="keypoints"):
        Manifest.from_json(json.dumps(doc))


def test_a_kind_the_data_lacks_is_refused_naming_the_shards(tmp_path):
    write_detection(str(tmp_path / "boxes"), 6, shard_size=3, kinds=("boxes",))
    assert resolve(Source(str(tmp_path / "boxes"), targets="boxes")).targets == ("boxes",)
    with pytest.raises(ConfigError, match=r"'masks'.*shard-000000.tar, shard-000001.tar"):
        resolve(Source(str(tmp_path / "boxes"), targets="boxes+masks"))
    with pytest.raises(ConfigError, match=r"'masks'.*shard-000001.tar \(1 of 1\)"):  # a glob: those shards' records
        resolve(Source(str(tmp_path / "boxes" / "*1.tar"), targets="masks"))


@pytest.fixture
def mixed(tmp_path):
    """Shard 0 with boxes, shard 1 without: only shard 1 lacks them."""
    write_detection(str(tmp_path / "mixed"), 6, shard_size=3, kinds=("boxes",),
                    damage={i: (lambda f: {k: v for k, v in f.items() if k != "json"}) for i in (3, 4, 5)})
    return tmp_path / "mixed"


def test_only_the_shards_lacking_a_kind_are_named(mixed):
    m = Manifest.from_json((mixed / MANIFEST_NAME).read_text())
    assert m.targets == () and m.lacking("boxes") == ["shard-000001.tar"]
    with pytest.raises(ConfigError, match=r"records no \.json boxes in shard\(s\) shard-000001.tar \(1 of 2\)"):
        resolve(Source(str(mixed), targets="boxes"))


def test_ingest_copies_boxes_and_masks(tmp_path, monkeypatch):
    """Whatever members the in-place reader gives a sample (a COCO-annotated folder's ``json``
    and ``mask.png``) are written to the shards as they are, and index.json records them."""
    for i in range(6):
        (tmp_path / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / f"c{i % 2}" / f"im{i}.jpg").write_bytes(detection_sample(0, i).fields["jpg"])
    from gpupipe.prepare import tasks as tasks_module

    real = tasks_module.object_sample

    def with_targets(name, data, label, url, targets=None, key=None) -> Sample:
        s = real(name, data, label, url, targets, key=key)
        i = int(name.rsplit("im", 1)[1].split(".")[0])
        made = detection_sample(0, i).fields
        return replace(s, fields={**s.fields, "json": made["json"], "mask.png": made["mask.png"]})

    monkeypatch.setattr(tasks_module, "object_sample", with_targets)  # where a task reads its images
    report = ingest_module.ingest(str(tmp_path / "src"), str(tmp_path / "dst"), shard_size=4, progress=False)
    assert report.num_samples == 6 and not report.skipped
    written = _samples(tmp_path / "dst")
    for key, fields in written.items():
        made = detection_sample(0, int(key.rsplit("im", 1)[1])).fields
        assert (fields["json"], fields["mask.png"], fields["jpg"]) == (made["json"], made["mask.png"], made["jpg"])
    assert Manifest.from_json((tmp_path / "dst" / MANIFEST_NAME).read_text()).targets == ("boxes", "masks")


def test_inspect_shows_the_recorded_kinds_and_each_first_samples_boxes(tmp_path, capsys):
    written = write_detection(str(tmp_path), 6, damage={2: lambda f: {**f, "json": b"{oops"}})
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--keys", "4"]) == 0
    out = capsys.readouterr().out
    assert "targets:  boxes, masks (in every shard, says index.json)" in out
    for key in list(written)[:4]:
        s, fields = written[key]
        line = next(x for x in out.splitlines() if x.strip().startswith(key))
        if key == "det_000002":
            assert "(bad .json:" in line and "does not parse" in line
        else:
            n = len(s.boxes)
            assert line.strip() == f"{key}  ({n} box{'es' if n != 1 else ''}, mask)"
    main(["synth", str(tmp_path / "plain"), "--images", "2", "--targets", "none"])
    capsys.readouterr()
    main(["inspect", str(tmp_path / "plain")])
    out = capsys.readouterr().out
    assert "targets:  none" in out and "box" not in out
