"""What a user coming from torchvision + DataLoader runs into (issue 26): each trap warns once,
naming the fix, or works. Real JPEGs in tiny image folders, decoded by Pillow on the CPU."""
from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import gpupipe.transforms as T
from gpupipe import GpuLoader
from gpupipe.augment.stage import AugmentStage
from gpupipe.config.checks import repeated_resizes
from gpupipe.core.errors import ConfigError
from gpupipe.decode import DecodeConfig, DecodedBatch, DecodeStats
from gpupipe.decode.common import count_stretched
from gpupipe.formats.imageheader import ImageHeader
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.tools.synth import synthetic_jpeg

CLASSES = ("ant", "bee", "cat")


def write_folder(root: Path, per_class: dict[str, int], size=(48, 32), first: int = 0) -> str:
    """``root/<class>/img<i>.jpg``: real JPEGs of ``size`` (width, height)."""
    rng = np.random.default_rng(first)
    i = first
    for name, n in per_class.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for _ in range(n):
            (root / name / f"img{i:03d}.jpg").write_bytes(synthetic_jpeg(rng, size))
            i += 1
    return str(root)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return write_folder(tmp_path_factory.mktemp("traps") / "train", dict.fromkeys(CLASSES, 4))


def make(url, **kw) -> GpuLoader:
    kw.setdefault("image_size", 16)
    kw.setdefault("decode", "pil")
    return GpuLoader(url, batch_size=4, device="cpu", num_workers=0, rank=0, world_size=1, **kw)


def warnings_from(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


# ---------------------------------------------------------------- 1. a crop left in augment


def test_a_random_resized_crop_after_the_decode_resize_warns_once_naming_the_decode_setting(folder, caplog):
    with caplog.at_level(logging.WARNING, "gpupipe.config.checks"):
        loader = make(folder, augment=[T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip()])
        for _ in loader:
            pass
    said = warnings_from(caplog, "gpupipe.config.checks")
    assert said == [
        "augment: RandomResizedCrop crops images the decoder has already resized to 16x16 (decode resize='fixed'): "
        "torchvision crops the full image, this crop is cut from the resized one and resized again. Crop while "
        "decoding instead: resize='random_resized_crop', scale=(0.5, 1), ratio=(0.75, 1.333) (decode.resize, "
        "decode.scale, decode.ratio in YAML) and drop RandomResizedCrop from augment; or resize='none' if every "
        "image already has the one size"]


def test_what_repeats_the_decode_resize_and_what_does_not():
    fixed = DecodeConfig(image_size=(224, 224))
    crop = DecodeConfig(image_size=(224, 224), resize="random_resized_crop")
    assert repeated_resizes(T.Compose([T.RandomApply([T.RandomResizedCrop(224)], p=0.5)]), fixed)  # nested
    assert "a crop of a crop" in repeated_resizes(T.RandomResizedCrop(224), crop)[0]
    resize = repeated_resizes(T.Compose([T.Resize(256), T.CenterCrop(224)]), fixed)
    assert len(resize) == 1 and resize[0].startswith("Resize to 256x256 resizes images the decoder has already")
    assert "image_size=(256, 256)" in resize[0]
    # torchvision's eval recipe: decode to 256 (shorter), then CenterCrop(224); a Resize to the decoded size
    assert repeated_resizes(T.Compose([T.Resize(256), T.CenterCrop(224)]), DecodeConfig(image_size=(256, 256),
                                                                                        resize="shorter")) == []
    assert repeated_resizes(T.Compose([T.RandomCrop(224, padding=4), T.RandomHorizontalFlip()]), fixed) == []
    assert repeated_resizes(T.RandomResizedCrop(224), DecodeConfig()) == []  # resize none: full-size images
    assert repeated_resizes(lambda x: x, fixed) == []


def test_a_torchvision_random_resized_crop_is_named_too():
    from torchvision.transforms import v2

    found = repeated_resizes(v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()]),
                             DecodeConfig(image_size=(224, 224)))
    assert len(found) == 1 and "scale=(0.08, 1), ratio=(0.75, 1.333)" in found[0]


# ---------------------------------------------------------------- 2. resize "fixed" stretches


def test_resize_fixed_that_stretches_warns_once_per_loader_with_the_count_and_the_worst(folder, caplog):
    with caplog.at_level(logging.WARNING, "gpupipe.decode.common"):
        loader = make(folder, image_size=16, shuffle=False)
        for _ in loader:
            pass
        for _ in loader:  # a second pass: no second warning
            pass
    said = warnings_from(caplog, "gpupipe.decode.common")
    assert said == [
        "decode: resize 'fixed' (the default) changes the aspect ratio of 4 of 4 images of this batch by more than "
        "5% (the most: width x height 48x32 to 16x16, 1.50x); torchvision's Resize(size) with one number keeps it. "
        "To keep it: resize='shorter' (Resize + CenterCrop) or, for training, resize='random_resized_crop'. Said "
        "once per loader; decoder.stats.stretched counts them all"]
    assert loader.decoder.stats.stretched == 24 and loader.decoder.stats.worst_stretch == pytest.approx(1.5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gpupipe.decode.common"):
        for _ in make(folder, image_size=(16, 24), shuffle=False):  # the images' own 3:2: nothing to say
            pass
        for _ in make(folder, image_size=16, resize="shorter"):
            pass
    assert warnings_from(caplog, "gpupipe.decode.common") == []


def test_the_stretch_tolerance_and_orientation():
    def header(w, h, orientation=1):
        return ImageHeader(format="jpeg", width=w, height=h, channels=3, orientation=orientation)

    stats, cfg = DecodeStats(), DecodeConfig(image_size=(100, 100))
    count_stretched([header(256, 250), header(100, 104), None], cfg, stats)  # under 5%: sizes a pixel off
    assert stats.stretched == 0
    landscape = DecodeConfig(image_size=(480, 640))
    count_stretched([header(640, 480), header(480, 640, orientation=6)], landscape, stats)  # 640x480 as shown
    assert stats.stretched == 0
    count_stretched([header(640, 480, orientation=6)], landscape, stats)  # shown 480x640: portrait to landscape
    assert stats.stretched == 1 and stats.worst_stretch == pytest.approx(16 / 9)
    count_stretched([header(640, 480)], DecodeConfig(image_size=(100, 100), resize="shorter"), stats)
    assert stats.stretched == 1


# ---------------------------------------------------------------- 4. a val folder missing a class


def test_the_train_splits_classes_number_a_val_folder_that_lacks_one(folder, tmp_path):
    val = write_folder(tmp_path / "val", {"ant": 2, "cat": 2}, first=100)  # no bee
    train = make(folder)
    shifted = make(val)
    assert shifted.classes == ("ant", "cat")  # on its own: cat would be label 1, bee's number
    right = make(val, classes=train.classes, shuffle=False)
    assert right.classes == CLASSES
    labels = {k.split("/")[0]: int(label) for b in right for k, label in zip(b.keys, b.labels)}
    assert labels == {"ant": 0, "cat": 2}


def test_a_class_mismatch_names_the_classes_keyword_and_source_classes(folder, tmp_path):
    pytest.importorskip("lightning.pytorch")
    from gpupipe.lightning import GpuDataModule

    val = write_folder(tmp_path / "val", {"ant": 2, "cat": 2}, first=100)
    dm = GpuDataModule({"source": {"train": folder, "val": val}, "decode": {"image_size": [16, 16]},
                        "loader": {"num_workers": 0, "batch_size": 2, "device": "cpu"}})
    with pytest.raises(ConfigError) as err:
        dm.setup("fit")
    assert ("Number every split with the train split's list: GpuLoader(<val url>, classes=train_loader.classes) "
            "in Python, source.classes: [ant, bee, cat] in YAML.") in str(err.value)
    with pytest.raises(ConfigError, match=r"classes= in Python, source.classes in YAML, ingest --classes"):
        make(folder, classes=["ant", "bee"])  # cat is in the data, not in the list


# ---------------------------------------------------------------- 5. a dataset root with train/ and val/


def test_a_root_holding_train_and_val_is_refused_naming_the_split_folder(folder, tmp_path):
    root = tmp_path / "root"
    write_folder(root / "train", {"ant": 2, "bee": 2})
    write_folder(root / "val", {"ant": 1, "bee": 1}, first=50)
    with pytest.raises(ConfigError) as err:
        make(str(root))
    assert str(err.value) == (
        f"source: {root}/ holds the splits train/, val/ of a dataset; read as one image folder they would be its "
        f"2 classes and every label wrong. Give one split's folder: GpuLoader('{root}/train/'), source: {{train: "
        f"{root}/train/, val: ...}} in YAML; GpuDataModule(source='{root}/') reads the split folders itself. (If "
        "they really are classes, name them: classes=[...], source.classes in YAML)")
    assert make(str(root), classes=["train", "val"]).classes == ("train", "val")  # said to be classes: they are
    assert make(str(root / "train")).classes == ("ant", "bee")


# ---------------------------------------------------------------- 6. pickling


def _batches(loader) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    return [(b.sample_ids.tolist(), b.images.clone(), b.labels.clone()) for b in loader]


def _same(a, b) -> None:
    assert [ids for ids, _, _ in a] == [ids for ids, _, _ in b]
    for (_, xa, ya), (_, xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("backend", ["pil", pytest.param("dali", marks=pytest.mark.dali)])
def test_a_gpu_loader_pickles_before_and_after_iterating_and_goes_on_the_same(folder, backend):
    pytest.importorskip("nvidia.dali") if backend == "dali" else None
    loader = make(folder, decode=backend, augment=T.Compose([T.RandomHorizontalFlip(), T.ToDtype(torch.float32)]))
    fresh = pickle.loads(pickle.dumps(loader))
    first = _batches(loader)  # epoch 0: now a DALI pipeline or a thread pool lives on the loader
    assert loader._decoder is not None
    _same(first, _batches(fresh))
    again = pickle.loads(pickle.dumps(loader))  # after a complete pass: both go on with epoch 1
    assert again._decoder is None and again.ledger.epoch == loader.ledger.epoch
    second = _batches(loader)
    _same(second, _batches(again))
    assert [ids for ids, _, _ in second] != [ids for ids, _, _ in first]


def test_an_encoded_loader_pickles_before_and_after_iterating(folder):
    loader = EncodedLoader(folder, batch_size=4, num_workers=1, rank=0, world_size=1)
    fresh = pickle.loads(pickle.dumps(loader))
    first = [b.sample_ids.tolist() for b in loader]
    assert [b.sample_ids.tolist() for b in fresh] == first
    again = pickle.loads(pickle.dumps(loader))
    assert [b.sample_ids.tolist() for b in again] == [b.sample_ids.tolist() for b in loader] != first


# ---------------------------------------------------------------- 7. channels_last


def _batch(images: torch.Tensor) -> DecodedBatch:
    n = len(images)
    return DecodedBatch(images=images, labels=torch.zeros(n, dtype=torch.int64), valid=torch.ones(n, dtype=torch.bool),
                        sample_ids=torch.arange(n), keys=tuple(map(str, range(n))))


@pytest.mark.parametrize("step", [T.RandomAffine(20), T.RandomResizedCrop(12), T.RandomHorizontalFlip(),
                                  T.RandomPerspective(), T.ColorJitter(0.2, 0.2, 0.2, 0.1), T.TrivialAugmentWide(),
                                  T.Compose([T.ToDtype(torch.float32), T.Normalize([0.5] * 3, [0.2] * 3)])])
def test_the_augment_stage_keeps_channels_last_where_asked_and_on_a_gpu(step):
    decoded = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # as a decoder gives
    assert decoded.is_contiguous(memory_format=torch.channels_last)
    out = AugmentStage(step, None, seed=0, channels_last=True)(_batch(decoded.clone())).images
    assert out.is_contiguous(memory_format=torch.channels_last)
    reference = AugmentStage(step, None, seed=0, channels_last=False)(_batch(decoded.clone())).images
    assert torch.equal(out, reference)  # the same pixels, laid out as promised
    if torch.cuda.is_available():
        on_gpu = AugmentStage(step, None, seed=0).to(torch.device("cuda"))(_batch(decoded.cuda())).images
        assert on_gpu.is_contiguous(memory_format=torch.channels_last)


def test_the_cpu_path_leaves_the_geometric_ops_layout_as_the_docs_say():
    decoded = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    out = AugmentStage(T.RandomAffine(20), None, seed=0)(_batch(decoded)).images
    assert out.is_contiguous()  # grid_sample's (B, C, H, W), ~25% faster there (docs/concepts.md)
