"""A torchvision ImageFolder + v2 + DataLoader script ported line by line (issue 36, cases 2-4): the
size comes from the pipeline's leading crop, torchvision's conversion steps and ``pin_memory`` are
taken, a batch indexes like the pair it unpacks to, and a typo gets the "did you mean" YAML gets.
Real JPEGs in a tiny image folder, decoded by Pillow on the CPU."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

import gpupipe.transforms as T
from gpupipe import GpuLoader
from gpupipe.config.schema import load_config
from gpupipe.core.errors import ConfigError, UnknownKeywordError
from gpupipe.decode import ResizeMode
from gpupipe.tools.synth import synthetic_jpeg


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """``ant/``, ``bee/``: 4 JPEGs each, of two sizes (a batch of them needs a decode size)."""
    root = tmp_path_factory.mktemp("port") / "train"
    rng = np.random.default_rng(0)
    for c, name in enumerate(("ant", "bee")):
        (root / name).mkdir(parents=True)
        for i in range(4):
            (root / name / f"img{i}.jpg").write_bytes(synthetic_jpeg(rng, (40 + 8 * (i % 2), 32 + 4 * c)))
    return str(root)


def make(url, **kw) -> GpuLoader:
    kw.setdefault("decode", "pil")
    return GpuLoader(url, batch_size=4, device="cpu", num_workers=0, rank=0, world_size=1, **kw)


# ---------------------------------------------------------------- case 2: the size from the leading crop


def test_a_v2_compose_leading_with_random_resized_crop_needs_no_image_size(folder, caplog):
    """Failed before issue 36: ``DecodeError: decoded images have different sizes ...; set decode image_size``
    at the first batch. The crop's size, scale and ratio move into the decode (cut from the full image, as
    torchvision cuts it); the rest of the torchvision Compose runs as it was."""
    tf = v2.Compose([v2.RandomResizedCrop(24, scale=(0.5, 1.0)), v2.RandomHorizontalFlip(),
                     v2.ToDtype(torch.float32, scale=True)])
    with caplog.at_level(logging.INFO, "gpupipe.config.checks"):
        loader = make(folder, augment=tf)
    decode = loader.encoded.split.decode
    assert (decode.image_size, decode.resize, decode.scale) == ((24, 24), ResizeMode.RANDOM_CROP, (0.5, 1.0))
    left = loader.encoded.split.augment
    assert type(left) is v2.Compose and [type(t).__name__ for t in left.transforms] == ["RandomHorizontalFlip",
                                                                                      "ToDtype"]
    assert any("RandomResizedCrop(24x24, scale=(0.5, 1)" in r.getMessage() for r in caplog.records)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 24, 24) and images.dtype == torch.float32 and labels.shape == (4,)


def test_the_same_with_gpupipe_transforms_and_torchvisions_eval_resize(folder):
    """Failed before issue 36 (the same DecodeError). ``T.from_torchvision`` of the same Compose, a plain list,
    ``Resize((h, w))`` (decode ``fixed``) and the eval recipe ``Resize(s)`` + ``CenterCrop(c)`` (decode
    ``shorter`` at s, the crop stays) all give one size; a leading ``PILToTensor`` is looked past."""
    crop = make(folder, augment=T.from_torchvision(v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(20)])))
    assert crop.encoded.split.augment == () and next(iter(crop)).images.shape == (4, 3, 20, 20)
    fixed = make(folder, augment=[T.Resize((18, 22)), T.RandomHorizontalFlip()])
    assert fixed.encoded.split.decode.resize is ResizeMode.FIXED and next(iter(fixed)).images.shape[-2:] == (18, 22)
    evaluation = make(folder, augment=[T.PILToTensor(), T.Resize(28), T.CenterCrop(24)])
    decode = evaluation.encoded.split.decode
    assert (decode.image_size, decode.resize) == ((28, 28), ResizeMode.SHORTER)
    assert [type(t).__name__ for t in evaluation.encoded.split.augment.transforms] == ["PILToTensor", "CenterCrop"]
    assert next(iter(evaluation)).images.shape[-2:] == (24, 24)


def test_a_config_without_image_size_takes_the_crop_for_training_and_shorter_for_val(folder):
    """Failed before issue 36: the YAML form had the same first-batch error. The val split (deterministic
    steps only) resizes ``shorter`` to the training crop's size, as a config with ``random_resized_crop``."""
    cfg = load_config({"source": {"train": folder, "val": folder},
                       "augment": [{"name": "RandomResizedCrop", "size": 16}, "RandomHorizontalFlip"]})
    train, val = cfg.split("train"), cfg.split("val")
    assert (train.decode.image_size, train.decode.resize) == ((16, 16), ResizeMode.RANDOM_CROP)
    assert [s.name for s in train.augment] == ["RandomHorizontalFlip"]
    assert (val.decode.image_size, val.decode.resize) == ((16, 16), ResizeMode.SHORTER)


def test_a_size_given_is_kept_and_a_crop_after_it_still_warns(folder):
    """What worked keeps working: with image_size the pipeline is left as given (the trap warning of issue 26
    names the crop); a Resize(s) alone is not taken (it keeps each aspect ratio)."""
    loader = make(folder, image_size=16, augment=[T.RandomResizedCrop(16)])
    assert loader.encoded.split.decode.resize is ResizeMode.FIXED and len(loader.encoded.split.augment.transforms) == 1
    alone = make(folder, augment=[T.Resize(16)])
    assert alone.encoded.split.decode.image_size is None


# ---------------------------------------------------------------- case 3: the lines of a port


def test_torchvisions_conversion_steps_are_there_and_pass_the_batch_through(caplog):
    """Failed before issue 36: ``AttributeError: module 'gpupipe.transforms' has no attribute 'ToImage'`` (and
    PILToTensor, ToPureTensor, ConvertImageDtype, ClampBoundingBoxes, ConvertBoundingBoxFormat). Every
    conversion name of torchvision's classification and detection recipes is here; the no-ops say so once."""
    names = ("ToImage", "PILToTensor", "ToPureTensor", "ToDtype", "ConvertImageDtype", "ToTensor", "Normalize",
             "SanitizeBoundingBoxes", "ClampBoundingBoxes", "ConvertBoundingBoxFormat", "RandomResizedCrop",
             "RandomHorizontalFlip", "TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix", "RandomErasing",
             "Resize", "CenterCrop", "RandomIoUCrop", "MixUp", "CutMix", "RandomChoice", "ColorJitter")
    assert [n for n in names if not hasattr(T, n)] == []
    with caplog.at_level(logging.INFO, "gpupipe.augment.convert"):
        pipeline = T.Compose([T.PILToTensor(), T.ToImage(), T.RandomHorizontalFlip(), T.ConvertImageDtype(torch.float),
                              T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD), T.ToPureTensor(), T.ToImage()],
                             input_dtype=torch.uint8)
    said = [r.getMessage().partition("(")[0] for r in caplog.records if r.name == "gpupipe.augment.convert"]
    assert sorted(set(said)) == sorted(said), said  # once per name and process (an earlier test may have said it)
    images = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    key = T.AugKey(0, 0, torch.arange(2))
    # the flip at the same position (each step draws from its position's key), the no-ops left out
    reference = T.Compose([T.ToImage(), T.ToImage(), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                           T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    out = pipeline(images, key)
    assert out.dtype == torch.float32 and torch.allclose(out, reference(images, key), atol=1e-6)
    assert torch.allclose(T.Compose(list(pipeline.transforms), fuse=False)(images, key), out, atol=1e-6)
    assert T.ToPureTensor()(images, key) is images


def test_box_conversions_clamp_and_refuse_other_formats():
    """Failed before issue 36 (no such names). ClampBoundingBoxes clamps to the canvas; boxes are XYXY here."""
    targets = T.pack_targets([{"boxes": torch.tensor([[-3.0, 2.0, 50.0, 9.0]]), "labels": torch.tensor([1])}])
    images = torch.zeros(1, 3, 10, 20, dtype=torch.uint8)
    _, moved = T.ClampBoundingBoxes()(images, T.AugKey(0, 0, torch.arange(1)), targets)
    assert moved.boxes.boxes.tolist() == [[0.0, 2.0, 20.0, 9.0]]
    _, same = T.ConvertBoundingBoxFormat("XYXY")(images, T.AugKey(0, 0, torch.arange(1)), targets)
    assert same is targets
    with pytest.raises(ValueError, match="absolute XYXY throughout"):
        T.ConvertBoundingBoxFormat("XYWH")
    converted = T.from_torchvision(v2.Compose([v2.ClampBoundingBoxes(), v2.ConvertBoundingBoxFormat("XYXY")]))
    assert [type(t).__name__ for t in converted.transforms] == ["ClampBoundingBoxes", "ConvertBoundingBoxFormat"]


def test_pin_memory_is_taken_and_said_once(folder, caplog):
    """Failed before issue 36: ``UnknownKeywordError: GpuLoader(): unknown keyword 'pin_memory'``. It means
    nothing here (the batches are on the device already): taken, said once per process in the log."""
    with caplog.at_level(logging.INFO, "gpupipe.config.keywords"):
        make(folder, image_size=16, pin_memory=True)
        make(folder, image_size=16, pin_memory=True)
        from gpupipe.loader.encoded import EncodedLoader

        EncodedLoader(folder, batch_size=4, pin_memory=True, num_workers=0, rank=0, world_size=1)
    said = [r.getMessage() for r in caplog.records if "pin_memory" in r.getMessage()]
    assert len(said) <= 1 and all("ignored" in m for m in said), said  # 0 when an earlier test said it already


def test_a_batch_indexes_like_the_pair_it_unpacks_to(folder):
    """Failed before issue 36: ``TypeError: 'DecodedBatch' object is not subscriptable``. ``b[0]`` the
    images, ``b[1]`` the labels, as ``images, labels = b``; ``len(b)`` stays the batch size."""
    b = next(iter(make(folder, image_size=16)))
    images, labels = b
    assert b[0] is images and b[1] is labels and b[-2] is images and b[-1] is labels
    assert b[:2] == (images, labels) and b[1:] == (labels,) and len(b) == 4
    assert b[np.int64(0)] is images
    with pytest.raises(IndexError, match=r"indexes as the pair it unpacks to, \(images, labels\): 0 or 1"):
        b[2]


# ---------------------------------------------------------------- case 4: typos get "did you mean"


def test_a_mistyped_keyword_of_a_transform_names_the_close_one():
    """Failed before issue 36: Python's bare ``ColorJitter.__init__() got an unexpected keyword argument
    'brigthness'``. Now a ``TypeError`` (``UnknownKeywordError``) naming 'brightness', as YAML does."""
    with pytest.raises(TypeError, match=r"ColorJitter\(\) got an unexpected keyword argument 'brigthness'; "
                                        r"did you mean 'brightness'\?") as err:
        T.ColorJitter(brigthness=0.4)
    assert isinstance(err.value, UnknownKeywordError) and isinstance(err.value, ConfigError)
    with pytest.raises(TypeError, match="did you mean 'alpha'"):
        T.MixUp(alhpa=1.0, num_classes=3)
    with pytest.raises(TypeError, match=r"RandomResizedCrop\(\) got an unexpected keyword argument 'scael'; "
                                        r"did you mean 'scale'"):
        T.RandomResizedCrop(224, scael=(0.5, 1.0))
    with pytest.raises(TypeError, match="did you mean 'std'"):  # the same through the YAML-name registry
        T.build_transform("Normalize", {"mean": [0.5], "sdt": [0.5]})
    with pytest.raises(ValueError, match="should be a floating point value"):  # the body's own errors unchanged
        T.RandomHorizontalFlip(p=2.0)


def test_a_mistyped_transform_name_names_the_close_one():
    """Failed before issue 36: a bare ``AttributeError: module 'gpupipe.transforms' has no attribute
    'RandomHorizontalFilp'``. Now it names the close match; torchvision names without a counterpart say so."""
    with pytest.raises(AttributeError, match="did you mean 'RandomHorizontalFlip'"):
        T.RandomHorizontalFilp  # noqa: B018
    with pytest.raises(AttributeError, match="torchvision's RandomZoomOut has no batch version in gpupipe"):
        T.RandomZoomOut  # noqa: B018
    with pytest.raises(AttributeError, match="give interpolation= as a string"):
        T.InterpolationMode  # noqa: B018
    assert not hasattr(T, "__wrapped__")  # introspection of the module keeps working
    assert Path(T.__file__).name == "transforms.py"
