"""Boxes and masks through the loaders a user trains with (issue 27): ``GpuLoader`` and the DataModule
under a real Lightning Trainer, from a YAML-shaped config with ``source.targets``, on generated
detection shards whose masks are the boxes' rectangles (so each batch can be checked against
itself: a box and its mask moved apart would show)."""
from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

import gpupipe.transforms as T  # noqa: E402
from gpupipe.config.schema import load_config  # noqa: E402
from gpupipe.core.errors import ConfigError  # noqa: E402
from gpupipe.lightning import GpuDataModule  # noqa: E402
from gpupipe.loader.gpu import GpuLoader  # noqa: E402
from gpupipe.tools.synth import write_detection_shards  # noqa: E402

N_TRAIN, N_VAL, BATCH = 24, 8, 4
AUGMENT = [{"name": "RandomHorizontalFlip"}, {"name": "RandomAffine", "degrees": 0, "translate": [0.1, 0.1]},
           {"name": "SanitizeBoundingBoxes"}, {"name": "ToDtype", "dtype": "float32", "scale": True}]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("det")
    train, val = str(base / "train"), str(base / "val")
    write_detection_shards(train, num_images=N_TRAIN, size=(48, 40), seed=3, max_objects=1)  # no object hides
    write_detection_shards(val, num_images=N_VAL, size=(48, 40), seed=4, max_objects=1)  # another's mask
    return train, val


def config(data, **loader) -> dict:
    train, val = data
    return {"source": {"train": train, "val": val, "targets": "boxes+masks"}, "augment": AUGMENT,
            "decode": {"image_size": [32, 32], "resize": "random_resized_crop", "scale": [0.5, 1.0]},
            "loader": {"batch_size": BATCH, "num_workers": 0, "device": "cpu", **loader}, "seed": 5}


def check_boxes_sit_on_their_masks(per_image: list[dict]) -> int:
    """Every box of the generated data covers some pixels of its own class (label + 1) in the mask
    (a flip or shift applied to one and not the other, or to another image's, would not). The box
    is widened by a pixel each side: nearest sampling may move an edge by one."""
    checked = 0
    for t in per_image:
        for (x1, y1, x2, y2), label in zip(t["boxes"].tolist(), t["labels"].tolist()):
            assert x2 - x1 >= 1 and y2 - y1 >= 1, "SanitizeBoundingBoxes ran: no box under a pixel wide"
            region = t["masks"][max(int(y1) - 1, 0):int(y2) + 2, max(int(x1) - 1, 0):int(x2) + 2]
            assert (region == label + 1).any(), (x1, y1, x2, y2, label)
            checked += 1
    return checked


def test_gpuloader_from_a_config_gives_torchvision_targets_that_sit_on_their_masks(data):
    loader = GpuLoader(load_config(config(data)).split("train"))
    boxes = 0
    for batch in loader:
        images, targets = batch
        assert images.dtype == torch.float32 and tuple(images.shape) == (BATCH, 3, 32, 32)
        assert len(targets) == BATCH and all(t["masks"].shape == (32, 32) for t in targets)
        assert all(t["boxes"].dtype == torch.float32 and (t["boxes"] >= 0).all() and (t["boxes"] <= 32).all()
                   for t in targets)
        boxes += check_boxes_sit_on_their_masks(targets)
    assert boxes > N_TRAIN // 3  # the data has objects in three images of four


def test_resume_gives_the_same_boxes_and_masks_for_the_remaining_samples(data):
    split = load_config(config(data)).split("train")
    full = {}
    for batch in GpuLoader(split):
        for key, t in zip(batch.keys, batch.targets.per_image()):
            full[key] = t
    first = GpuLoader(split)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    it.close()
    resumed = GpuLoader(split)
    resumed.load_state_dict(state)
    seen = 0
    for batch in resumed:
        for key, t in zip(batch.keys, batch.targets.per_image()):
            assert torch.equal(t["boxes"], full[key]["boxes"]) and torch.equal(t["labels"], full[key]["labels"])
            assert torch.equal(t["masks"], full[key]["masks"])
            seen += 1
    assert seen == N_TRAIN - 2 * BATCH


class TargetsModel(pl.LightningModule):
    """Takes dict batches with targets; records what each step saw."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Conv2d(3, 2, 1)
        self.boxes_checked = 0
        self.batches = 0

    def training_step(self, batch, batch_idx):
        assert set(batch) >= {"images", "targets", "packed_targets", "valid"}
        assert len(batch["targets"]) == len(batch["images"]) == batch["packed_targets"].masks.shape[0]
        self.boxes_checked += check_boxes_sit_on_their_masks(batch["targets"])
        self.batches += 1
        logits = self.net(batch["images"])
        return torch.nn.functional.cross_entropy(logits, (batch["packed_targets"].masks > 0).long())

    def validation_step(self, batch, batch_idx):
        check_boxes_sit_on_their_masks(batch["targets"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("augment_in", ["loader", "on_after_batch_transfer"])
def test_the_datamodule_trains_on_dict_batches_with_targets(data, tmp_path, augment_in):
    dm = GpuDataModule(load_config(config(data, batch_format="dict", augment_in=augment_in)))
    model = TargetsModel()
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
               num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path)).fit(model, datamodule=dm)
    assert model.batches == N_TRAIN // BATCH and model.boxes_checked > N_TRAIN // 3


def test_a_mix_or_a_callable_without_targets_is_refused_when_the_loader_is_built(data):
    with pytest.raises(ValueError, match="bounding boxes"):
        GpuLoader(load_config({**config(data), "mix": {"name": "MixUp", "num_classes": 3}}).split("train"))
    with pytest.raises(TypeError, match="targets"):
        GpuLoader(data[0], batch_size=BATCH, num_workers=0, device="cpu", image_size=32, targets="boxes",
                  augment=lambda images: images)
    loader = GpuLoader(data[0], batch_size=BATCH, num_workers=0, device="cpu", image_size=32, targets="boxes",
                       augment=[T.RandomHorizontalFlip(), T.SanitizeBoundingBoxes()])
    images, targets = next(iter(loader))
    assert "masks" not in targets[0] and "boxes" in targets[0]


def test_a_kind_the_data_lacks_is_refused_at_start(tmp_path):
    root = str(tmp_path / "boxes-only")
    write_detection_shards(root, num_images=8, size=(32, 32), targets=("boxes",))
    with pytest.raises(ConfigError, match="masks"):
        GpuLoader(root, batch_size=4, num_workers=0, device="cpu", image_size=32, targets="boxes+masks")
