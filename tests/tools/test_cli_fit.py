"""`gpupipe fit` and `gpupipe demo --config` through a subprocess: a real LightningCLI run, its
files, and the refusals (class paths outside the allowlist, bad config) as one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lightning_util import write_split

from gpupipe.core.errors import ConfigError
from gpupipe.tools.fit import check_class_paths, check_overrides

GPUPIPE = [sys.executable, "-m", "gpupipe.tools.cli"]


@pytest.fixture(scope="module")
def pipeline_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    write_split(str(root / "train"), 24, shard_size=10)
    write_split(str(root / "val"), 8, shard_size=8, first_id=100)
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"train": str(root / "train"), "val": str(root / "val"),
                   "storage_options": {"token": "${GPUPIPE_FIT_SECRET:-none}"}},
        "decode": {"image_size": [16, 16], "on_error": "skip"}, "augment": "simple",
        "loader": {"batch_size": 8, "num_workers": 0}}))
    return path


def gpupipe(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUPIPE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


LIGHTNING = ["--trainer.max_epochs", "1", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
             "--model.num_classes", "4"]


def test_fit_with_a_pipeline_config_trains_and_keeps_secrets_out(pipeline_file, tmp_path):
    secret = "SENTINEL-fit-93b1"
    run = gpupipe("fit", "--config", str(pipeline_file), *LIGHTNING, "--trainer.default_root_dir", str(tmp_path),
                  cwd=tmp_path, env={"GPUPIPE_FIT_SECRET": secret})
    assert run.returncode == 0, run.stderr[-3000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".ckpt" for p in files) and any(p.name == "hparams.yaml" for p in files)
    for p in files:
        assert secret.encode() not in p.read_bytes(), p
    assert secret not in run.stdout + run.stderr


def test_fit_with_a_lightning_cli_file(pipeline_file, tmp_path):
    data = yaml.safe_load(pipeline_file.read_text())
    cli_file = tmp_path / "fit.yaml"
    cli_file.write_text(yaml.safe_dump({"data": data, "model": {"arch": "small_cnn", "num_classes": 4},
                                        "trainer": {"max_epochs": 1, "accelerator": "cpu", "limit_train_batches": 2,
                                                    "limit_val_batches": 1, "default_root_dir": str(tmp_path)}}))
    run = gpupipe("fit", "--config", str(cli_file), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("extra, message", [
    ({"model": {"class_path": "os.system"}}, "model.class_path: class path 'os.system' is not allowed"),
    ({"trainer": {"callbacks": [{"class_path": "evil.Callback"}]}}, r"trainer.callbacks\[0\].class_path: class path 'evil.Callback'"),
])
def test_fit_refuses_class_paths_outside_the_allowlist(pipeline_file, tmp_path, extra, message):
    data = yaml.safe_load(pipeline_file.read_text())
    cli_file = tmp_path / "evil.yaml"
    cli_file.write_text(yaml.safe_dump({"data": data, **extra}))
    run = gpupipe("fit", "--config", str(cli_file), cwd=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupipe: error: ") and "not allowed" in lines[0]
    with pytest.raises(ConfigError, match=message):
        check_class_paths(yaml.safe_load(cli_file.read_text()))


def test_allowlisted_class_paths_and_overrides():
    check_class_paths({"trainer": {"callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}],
                                   "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger"}}})
    check_overrides(["--trainer.max_epochs", "2", "--trainer.default_root_dir", "runs/v1.2"])
    with pytest.raises(ConfigError, match="'mypkg.Hook' is not allowed"):
        check_overrides(["--trainer.callbacks+=mypkg.Hook"])
    with pytest.raises(ConfigError, match="'x.y.Z' is not allowed"):
        check_overrides(["--trainer.logger", "x.y.Z"])


def test_fit_with_a_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {train: x}\naugment: [{name: RandomHflip}]\n")
    run = gpupipe("fit", "--config", str(bad), cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == ("gpupipe: error: augment[0].name: unknown 'RandomHflip'; did you mean "
                                  "'RandomHorizontalFlip'? (supported: " + run.stderr.split("(supported: ")[1].strip())
    unknown = gpupipe("inspect", str(tmp_path), "--no-such-flag", cwd=tmp_path)
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag" in unknown.stderr


@pytest.fixture(scope="module")
def six_classes(tmp_path_factory):
    """12 images in 6 class folders, ingested: the index lists 6 classes; a train-only config."""
    from gpupipe.prepare.ingest import ingest
    from gpupipe.tools.synth import write_image_folder

    root = tmp_path_factory.mktemp("six")
    write_image_folder(str(root / "img"), num_images=12, num_classes=6, size=(24, 24))
    ingest(str(root / "img"), str(root / "shards"), shard_size=6, progress=False)
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"source": str(root / "shards"), "decode": {"image_size": [16, 16]},
                                    "augment": "simple", "loader": {"batch_size": 4, "num_workers": 0}}))
    return path


FIT_BRIEFLY = ["--trainer.max_epochs", "1", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
               "--trainer.limit_train_batches", "2"]


def test_fit_takes_the_class_count_from_the_index_and_needs_no_val(six_classes, tmp_path):
    import torch

    from gpupipe.lightning.models import ImageClassifier

    run = gpupipe("fit", "--config", str(six_classes), *FIT_BRIEFLY, "--trainer.default_root_dir", str(tmp_path),
                  cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "val_dataloader" not in run.stderr and "Sanity Checking" not in run.stderr + run.stdout
    (ckpt,) = tmp_path.rglob("*.ckpt")
    assert torch.load(ckpt, weights_only=False)["hyper_parameters"]["num_classes"] == 6
    model = ImageClassifier.load_from_checkpoint(ckpt)
    assert model.net[-1].out_features == 6 and model.hparams.num_classes == 6
    (hparams,) = [p for p in tmp_path.rglob("hparams.yaml") if "num_classes" in p.read_text()]
    assert yaml.safe_load(hparams.read_text())["num_classes"] == 6


def test_fit_refuses_a_head_that_disagrees_with_the_data(six_classes, tmp_path):
    run = gpupipe("fit", "--config", str(six_classes), *FIT_BRIEFLY, "--model.num_classes", "4",
                  "--trainer.default_root_dir", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-3000:]
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("gpupipe: error: model.num_classes is 4 but the data has 6 classes [class_00, "), error
    assert "Traceback" not in run.stderr and not list(tmp_path.rglob("*.ckpt"))


def test_labels_outside_the_head_are_named_when_the_data_has_no_class_list():
    import torch

    from gpupipe.lightning.models import ImageClassifier

    model = ImageClassifier(num_classes=3)
    images = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ConfigError, match=r"label 3 in a batch, but the model has 3 classes"):
        model.training_step((images, torch.tensor([0, 3])), 0)
    with pytest.raises(ConfigError, match="num_classes is not known yet"):
        ImageClassifier()(images)


def test_demo_runs_a_config(pipeline_file, tmp_path):
    run = gpupipe("demo", "--root", str(tmp_path / "demo"), "--images", "40", "--size", "32", "--epochs", "2",
                  "--config", str(pipeline_file), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "throughput:" in run.stdout and "RandomAffine, RandomHorizontalFlip" in run.stdout
