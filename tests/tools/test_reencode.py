"""Re-encoding at ingest (issue 39): larger images stored smaller, upright and as JPEG, with their
boxes and masks scaled; images small enough copied byte for byte; index.json records it."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from gpupipe.core.errors import ConfigError
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.prepare.ingest import ingest
from gpupipe.prepare.reencode import Reencode
from gpupipe.tools.cli import main


def _jpeg(hw: tuple[int, int], orientation: int = 1, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (*hw, 3), dtype=np.uint8))
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def _samples(root) -> dict[str, dict[str, bytes]]:
    out = {}
    for tar in sorted(root.glob("*.tar")):
        for s in group_by_key(iter_members([tar.read_bytes()], shard=str(tar)), shard=str(tar)):
            out[s.key.split("/")[-1]] = s.fields
    return out


def test_larger_images_are_stored_upright_at_the_short_side_and_small_ones_unchanged(tmp_path):
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    small = _jpeg((40, 60), seed=1)
    (src / "big.jpg").write_bytes(_jpeg((300, 500), seed=2))
    (src / "turned.jpg").write_bytes(_jpeg((500, 300), orientation=6, seed=3))  # stored 300 wide, upright 500×300
    (src / "small.jpg").write_bytes(small)
    ingest(str(tmp_path / "src"), str(tmp_path / "dst"), progress=False, reencode=Reencode(short_side=64, quality=85))
    got = _samples(tmp_path / "dst")
    sizes = {k: Image.open(io.BytesIO(v["jpg"])).size for k, v in got.items()}
    assert sizes == {"big": (107, 64), "turned": (107, 64), "small": (60, 40)}  # (w, h); turned: upright
    assert got["small"]["jpg"] == small  # bytes unchanged
    assert Image.open(io.BytesIO(got["turned"]["jpg"])).getexif().get(0x0112, 1) == 1
    prepared = Manifest.from_json((tmp_path / "dst" / MANIFEST_NAME).read_text()).prepared
    assert prepared == {"reencode": {"short_side": 64, "quality": 85, "reencoded": 2, "kept": 1}}


def test_boxes_and_masks_are_scaled_with_the_image(tmp_path):
    from gpupipe.formats.annotations import encode_boxes, parse_boxes
    from gpupipe.formats.imageheader import probe
    from gpupipe.prepare.reencode import reencoded

    mask = np.zeros((200, 400), dtype=np.uint8)
    mask[50:150, 100:300] = 3
    buf = io.BytesIO()
    Image.fromarray(mask).save(buf, "PNG")
    fields = {"jpg": _jpeg((200, 400)), "json": encode_boxes([[100, 50, 300, 150]], [3]), "mask.png": buf.getvalue(),
              "cls": b"0"}
    new = reencoded(fields, "k", probe(fields["jpg"]), Reencode(max_side=100))
    assert Image.open(io.BytesIO(new["jpg"])).size == (100, 50)
    boxes, labels = parse_boxes(new["json"], "k")
    assert np.allclose(boxes, [[25, 12.5, 75, 37.5]]) and labels.tolist() == [3]
    small_mask = np.asarray(Image.open(io.BytesIO(new["mask.png"])))
    assert small_mask.shape == (50, 100) and set(np.unique(small_mask)) == {0, 3} and small_mask[25, 50] == 3
    assert new["cls"] == b"0"


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="one of --max-side and --short-side"):
        Reencode()
    with pytest.raises(ConfigError, match="one of"):
        Reencode(max_side=10, short_side=10)
    with pytest.raises(ConfigError, match="quality"):
        Reencode(max_side=64, quality=0)
    assert main(["ingest", "a", "b", "--max-side", "64", "--short-side", "32"]) == 2  # argparse: not both


def test_the_command_line_reencodes(tmp_path, capsys):
    src = tmp_path / "src" / "dog"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(_jpeg((120, 160)))
    assert main(["ingest", str(tmp_path / "src"), str(tmp_path / "dst"), "--max-side", "80", "--quiet"]) == 0
    doc = json.loads((tmp_path / "dst" / MANIFEST_NAME).read_text())
    assert doc["prepared"]["reencode"] == {"max_side": 80, "quality": 90, "reencoded": 1, "kept": 0}
