"""GpuDataModule under a real Lightning Trainer on the CPU: fit, exact mid-epoch resume from
Lightning's own checkpoints, validation that leaves the training stream alone, 2-process DDP."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from gloo_ranks import free_port

pl = pytest.importorskip("lightning.pytorch")

from lightning_util import Interrupted, LedgerModel, pipeline, write_split  # noqa: E402

from gpupipe.core.errors import ConfigError  # noqa: E402
from gpupipe.lightning import GpuDataModule  # noqa: E402

N_TRAIN, N_VAL = 40, 12  # batch 4: 10 training steps per epoch
TESTS = Path(__file__).resolve().parents[1]  # tests/: the scripts and helpers they import


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lit")
    return (write_split(str(root / "train"), N_TRAIN, shard_size=12),
            write_split(str(root / "val"), N_VAL, shard_size=5, first_id=1000))


def trainer(tmp_path, **kw) -> pl.Trainer:
    kw.setdefault("max_epochs", 2)
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    kw.setdefault("num_sanity_val_steps", 0)
    return pl.Trainer(accelerator="cpu", devices=1, default_root_dir=str(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, **kw)


def test_fit_delivers_every_sample_once_per_epoch_and_validates(data, tmp_path):
    model, dm = LedgerModel(), GpuDataModule(pipeline(*data))
    trainer(tmp_path).fit(model, datamodule=dm)
    for epoch in (0, 1):
        ids = [i for e, step in model.ledger if e == epoch for i in step]
        assert sorted(ids) == list(range(N_TRAIN)), f"epoch {epoch}"
    assert [e for e, _ in model.ledger].count(0) == N_TRAIN // 4
    assert Counter(model.val_ids) == Counter({i: 2 for i in range(N_VAL)})  # all val samples, both epochs
    epochs = [[i for e, s in model.ledger if e == k for i in s] for k in (0, 1)]
    assert epochs[0] != epochs[1], "epochs must be reshuffled"


def _ledger(data, tmp_path, **kw) -> list:
    model = LedgerModel()
    trainer(tmp_path, **kw).fit(model, datamodule=GpuDataModule(pipeline(*data)))
    return model.ledger


def test_validation_interleaved_does_not_move_the_training_stream(data, tmp_path):
    with_val = _ledger(data, tmp_path / "a", val_check_interval=3)
    without = _ledger(data, tmp_path / "b", limit_val_batches=0)
    assert with_val == without


@pytest.mark.parametrize("checkpoint_step", [3, 14])  # inside epoch 0, inside epoch 1
def test_resume_from_a_mid_epoch_lightning_checkpoint_delivers_exactly_the_rest(data, tmp_path, checkpoint_step):
    reference = _ledger(data, tmp_path / "ref")
    ckpt_dir = tmp_path / "ckpt"
    saver = pl.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=checkpoint_step,
                                         save_top_k=-1, filename="{step}")
    first = LedgerModel(stop_at_step=checkpoint_step + 2)
    with pytest.raises(Interrupted):
        trainer(tmp_path, callbacks=[saver], enable_checkpointing=True).fit(first, datamodule=GpuDataModule(pipeline(*data)))
    ckpt = ckpt_dir / f"step={checkpoint_step}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(ckpt_dir))
    resumed = LedgerModel()
    trainer(tmp_path).fit(resumed, datamodule=GpuDataModule(pipeline(*data)), ckpt_path=str(ckpt))
    assert first.ledger[:checkpoint_step] + resumed.ledger == reference


@pytest.mark.parametrize("batch_after", [2, 8])  # more steps per epoch after the resume, fewer
def test_a_mid_epoch_checkpoint_resumes_with_another_batch_size(data, tmp_path, batch_after):
    """Issue 25: a Lightning checkpoint taken at batch 4 resumes at another batch size with
    exactly the samples of the epoch not yet trained on, and the next epoch is whole — Lightning
    reads len() once, after the resume, and must not cut the next epoch to the resumed one's length."""
    ckpt_dir = tmp_path / "ckpt"
    saver = pl.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=3, save_top_k=-1,
                                         filename="{step}")
    first = LedgerModel(stop_at_step=5)
    with pytest.raises(Interrupted):
        trainer(tmp_path, callbacks=[saver], enable_checkpointing=True).fit(first, datamodule=GpuDataModule(pipeline(*data)))
    resumed = LedgerModel()
    trainer(tmp_path).fit(resumed, datamodule=GpuDataModule(pipeline(*data, batch_size=batch_after)),
                          ckpt_path=str(ckpt_dir / "step=3.ckpt"))
    epoch0 = [i for _, s in first.ledger[:3] for i in s] + [i for e, s in resumed.ledger if e == 0 for i in s]
    assert len(epoch0) == len(set(epoch0)) and set(epoch0) <= set(range(N_TRAIN))
    # drop_last (on for training): the rest of the epoch, 28 samples, is cut to whole batches
    assert len(epoch0) == 12 + 28 // batch_after * batch_after
    assert sorted(i for e, s in resumed.ledger if e == 1 for i in s) == list(range(N_TRAIN))
    assert [e for e, _ in resumed.ledger].count(1) == N_TRAIN // batch_after


class ValRuns(LedgerModel):
    """Also records the sample ids of each validation run (the sanity check is one)."""

    def __init__(self) -> None:
        super().__init__()
        self.val_runs: list[list[int]] = []

    def on_validation_epoch_start(self) -> None:
        self.val_runs.append([])

    def validation_step(self, batch, batch_idx):
        self.val_runs[-1] += batch["sample_ids"][batch["valid"]].tolist()
        return super().validation_step(batch, batch_idx)


def test_every_validation_run_sees_the_whole_set_after_a_sanity_check(data, tmp_path):
    """The sanity check stops the val loader after one batch; the validation after it must
    still see every validation sample, and every run after that too."""
    model = ValRuns()
    trainer(tmp_path, num_sanity_val_steps=1, limit_train_batches=2).fit(model, datamodule=GpuDataModule(pipeline(*data)))
    every = list(range(N_VAL))  # val sample ids: positions in its own index
    assert model.val_runs == [every[:4], every, every]


def test_limit_val_batches_validates_on_the_same_batches_every_epoch(data, tmp_path):
    model = ValRuns()
    trainer(tmp_path, max_epochs=3, limit_train_batches=2, limit_val_batches=2).fit(
        model, datamodule=GpuDataModule(pipeline(*data)))
    assert model.val_runs == [list(range(8))] * 3  # not batches 0-1, then 2, then 0-1 ...


@pytest.mark.parametrize("saved, change", [("epoch_end", "batch_size"), ("epoch_end", "more_data"),
                                           ("last_step", "batch_size")])
def test_a_checkpoint_at_the_end_of_an_epoch_cut_by_limit_train_batches_resumes(data, tmp_path, saved, change):
    """Lightning resumes such a checkpoint at the next epoch, where any change of the plan is
    allowed: the loader must start that epoch afresh, not refuse the cut epoch as mid-epoch."""
    ckpt_dir = tmp_path / "ckpt"
    saver = pl.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), filename="last", save_top_k=-1,
                                         **({"every_n_train_steps": 3} if saved == "last_step" else {}))
    first = LedgerModel()
    trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[saver],
            enable_checkpointing=True).fit(first, datamodule=GpuDataModule(pipeline(*data)))
    assert len(first.ledger) == 3
    if change == "batch_size":
        cfg, n, batch = pipeline(*data, batch_size=5), N_TRAIN, 5
    else:
        cfg, n, batch = pipeline(write_split(str(tmp_path / "more"), N_TRAIN + 8, shard_size=12), data[1]), N_TRAIN + 8, 4
    # saved after the last step's batch, Lightning resumes at the next epoch only with the same
    # limit (else it counts the 3 steps done into the next epoch); at the epoch's end, always
    limit = 3 if saved == "last_step" else None
    resumed = LedgerModel()
    trainer(tmp_path, max_epochs=2, limit_val_batches=0, limit_train_batches=limit).fit(
        resumed, datamodule=GpuDataModule(cfg), ckpt_path=str(ckpt_dir / "last.ckpt"))
    ids = [i for _, step in resumed.ledger for i in step]
    assert [e for e, _ in resumed.ledger] == [1] * (limit or n // batch)
    assert len(ids) == len(set(ids)) == (limit or n // batch) * batch and set(ids) <= set(range(n))


def test_checkpoint_and_hparams_never_hold_the_secret(data, tmp_path):
    secret = "SENTINEL-7f3a9c-SECRET"
    cfg = pipeline(*data)
    cfg["source"]["storage_options"] = {"key": "${GPUPIPE_TEST_SECRET}", "anon": False}
    os.environ["GPUPIPE_TEST_SECRET"] = secret
    try:
        dm = GpuDataModule(cfg)
        assert dm.config.source.storage_options["key"] == secret  # it is used ...
        logger = pl.loggers.CSVLogger(str(tmp_path), name="run")
        saver = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"))
        pl.Trainer(accelerator="cpu", max_epochs=1, logger=logger, callbacks=[saver], enable_progress_bar=False,
                   limit_val_batches=0).fit(LedgerModel(), datamodule=dm)
    finally:
        del os.environ["GPUPIPE_TEST_SECRET"]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".ckpt", ".yaml", ".csv")]
    assert any(p.name == "hparams.yaml" for p in written) and any(p.suffix == ".ckpt" for p in written)
    for path in written:  # ... and it is nowhere on disk
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in repr(dm.config) and secret not in str(dm.hparams)


def test_augment_after_transfer_gives_the_same_batches_as_in_the_loader(data, tmp_path):
    in_loader = _ledger(data, tmp_path / "a")
    model = LedgerModel()
    trainer(tmp_path / "b").fit(model, datamodule=GpuDataModule(pipeline(*data, augment_in="on_after_batch_transfer")))
    assert model.ledger == in_loader


def test_a_train_only_config_fits_without_validation(data, tmp_path):
    """The documented minimal config (a URL alone is the train split) under a Trainer with its
    default sanity check: no val loader is asked for, every sample is trained on once."""
    dm = GpuDataModule({"source": data[0], "decode": {"image_size": [16, 16]}, "augment": "simple",
                        "loader": {"batch_size": 4, "batch_format": "dict", "num_workers": 0}})
    model = LedgerModel()
    pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=str(tmp_path)).fit(model, datamodule=dm)
    assert sorted(i for _, step in model.ledger for i in step) == list(range(N_TRAIN)) and model.val_ids == []
    with pytest.raises(ConfigError, match="source.val: not set"):
        dm.val_dataloader()


def test_datamodule_errors_name_the_config_key(data):
    with pytest.raises(ConfigError, match="source.test: not set"):
        GpuDataModule(pipeline(*data)).test_dataloader()
    with pytest.raises(ConfigError, match="loader.batch_size: must be >= 1"):
        GpuDataModule(pipeline(*data, batch_size=0))
    with pytest.raises(ConfigError, match="not both"):
        GpuDataModule("x.yaml", loader={"batch_size": 2})


@pytest.mark.slow
@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: a job of several processes
def test_two_processes_ddp_gloo_equal_steps_exactly_once(tmp_path):
    """2 ranks (Lightning's ddp launcher re-runs the script for rank 1), uneven shards with one
    empty: equal step counts, and each epoch's samples split exactly once between ranks."""
    script = TESTS / "lightning_ddp_script.py"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    ledgers = [json.loads((tmp_path / f"ledger-{r}.json").read_text()) for r in (0, 1)]
    expected = json.loads((tmp_path / "expected.json").read_text())
    assert len(ledgers[0]) == len(ledgers[1]) == 2 * expected["steps"]
    for epoch in (0, 1):
        ids = [i for ledger in ledgers for e, step in ledger if e == epoch for i in step]
        assert len(ids) == len(set(ids)) == expected["per_epoch"], f"epoch {epoch}"
        assert set(ids) <= set(range(expected["total"]))


def test_deferred_delivery_counts_only_committed_batches(data):
    """Lightning may fetch a batch before the step that uses it: the resume state must count
    only batches committed in on_after_batch_transfer, whatever was fetched ahead."""
    from gpupipe.config.schema import load_config
    from gpupipe.core.types import World
    from gpupipe.loader.gpu import GpuLoader

    loader = GpuLoader(load_config(pipeline(*data)).split("train"), world=World(), device="cpu")
    loader.ledger.defer()
    it = iter(loader)
    next(it), next(it), next(it)  # three fetched ...
    loader.ledger.commit()  # ... one used
    assert loader.state_dict()["progress"]["partial"] == {"0": 1}
    rest = list(it)
    for _ in range(len(rest) + 2):
        loader.ledger.commit()
    assert loader.state_dict()["complete"] is True


def _read_ledger(path: Path) -> list:
    lines = path.read_text().splitlines() if path.exists() else []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the line being written when the process was killed
            break
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: a job of several processes
def test_sigkill_then_resume_from_the_last_checkpoint_matches_an_uninterrupted_run(data, tmp_path):
    """A real SIGKILL somewhere after step 12 of 20 (inside epoch 1; the in-process test above
    covers epoch 0), then a fresh process resumes from the last checkpoint on disk."""
    import signal
    import time

    kill_after = 13
    script = str(TESTS / "lightning_kill_script.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    train = data[0]
    reference = tmp_path / "reference.jsonl"
    subprocess.run([sys.executable, script, train, str(tmp_path / "ref"), str(reference)], env=env, check=True,
                   capture_output=True, timeout=240)
    killed = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, script, train, str(tmp_path / "ck"), str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(_read_ledger(killed)) < kill_after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = _read_ledger(killed)
    step = before[-1][0]  # its checkpoint was written before its ledger line
    assert kill_after <= step < 20
    resumed = tmp_path / "resumed.jsonl"
    subprocess.run([sys.executable, script, train, str(tmp_path / "ck2"), str(resumed),
                    str(tmp_path / "ck" / f"step={step}.ckpt")], env=env, check=True, capture_output=True, timeout=240)
    assert before + _read_ledger(resumed) == _read_ledger(reference)
