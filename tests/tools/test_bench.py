"""gpupipe bench: the dead-leaves data, the runner's JSON, the plot, and its errors.

Tiny data and few batches: these check behaviour, not speed.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from gpupipe.tools.cli import main
from gpupipe.tools.synth import LeavesConfig, dead_leaves, dead_leaves_jpeg, write_leaves_folder

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def _power_slope(img: np.ndarray, hi: int = 40) -> float:
    """Slope of the radially averaged power spectrum, log-log, over frequencies 3..hi."""
    g = img.astype(np.float64).mean(2)
    power = np.abs(np.fft.fftshift(np.fft.fft2(g - g.mean()))) ** 2
    h, w = g.shape
    yy, xx = np.indices(power.shape)
    r = np.hypot(yy - h // 2, xx - w // 2).astype(int)
    profile = np.bincount(r.ravel(), power.ravel()) / np.bincount(r.ravel())
    f = np.arange(3, hi)
    return float(np.polyfit(np.log(f), np.log(profile[f]), 1)[0])


def test_dead_leaves_is_deterministic_per_seed_and_index():
    a, b = dead_leaves_jpeg(7, 3), dead_leaves_jpeg(7, 3)
    assert a == b and a[:2] == b"\xff\xd8"
    assert dead_leaves_jpeg(7, 4) != a and dead_leaves_jpeg(8, 3) != a


def test_folder_is_the_same_whatever_the_worker_count(tmp_path: Path):
    sizes = [(64, 48), (48, 64), (50, 50)]
    write_leaves_folder(str(tmp_path / "one"), sizes, seed=1, num_classes=2, workers=1)
    write_leaves_folder(str(tmp_path / "two"), sizes, seed=1, num_classes=2, workers=2)
    one = {p.relative_to(tmp_path / "one"): p.read_bytes() for p in (tmp_path / "one").rglob("*.jpg")}
    two = {p.relative_to(tmp_path / "two"): p.read_bytes() for p in (tmp_path / "two").rglob("*.jpg")}
    assert one == two and len(one) == 3 and Path("class_01/img_000001.jpg") in one


def test_bytes_per_pixel_and_spectrum_are_photo_like():
    """Real photos at 250×250, quality 90: ~0.3 B/px; natural images: power ~ 1/f²."""
    sizes = [len(dead_leaves_jpeg(0, i, (250, 250), quality=90)) for i in range(12)]
    assert 0.2 <= np.mean(sizes) / (250 * 250) <= 0.5
    slopes = [_power_slope(dead_leaves(np.random.default_rng([0, i]))) for i in range(4)]
    assert -2.7 <= np.mean(slopes) <= -1.5
    flat = dead_leaves(np.random.default_rng(0), (64, 64), LeavesConfig(noise=0, grain=0))
    assert flat.std() > 10  # never a flat field


# The docs' sets (docs/configuration.md, "The presets"), written out here: augment/presets.py is their one
# home, so comparing its readers with each other could not fail; comparing them with the docs can.
DOCUMENTED = {"none": [],
              "simple": ["RandomAffine", "RandomHorizontalFlip", "ToDtype", "RepeatChannels", "Normalize"],
              "complex": ["RandomAffine", "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective", "ToDtype",
                          "ColorJitter", "RepeatChannels", "Normalize"]}


def test_every_offer_of_the_transform_sets_is_the_documented_steps():
    import torch

    import gpupipe.transforms as T
    from gpupipe.config.schema import preset
    from gpupipe.tools.bench.steps import SETS, steps_of

    for name, steps in DOCUMENTED.items():
        assert [s.name for s in preset(name)] == [n for n, _ in SETS[name]] == steps
        assert steps_of(preset(name)) == SETS[name]
    for name, built in (("simple", T.simple_set(torch.bfloat16)), ("complex", T.complex_set(torch.bfloat16))):
        assert [type(m).__name__ for m in built.transforms] == DOCUMENTED[name]
        assert [m.dtype for m in built.transforms if type(m).__name__ == "ToDtype"] == [torch.bfloat16]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    from gpupipe.tools.bench.data import make_dataset

    root = tmp_path_factory.mktemp("bench") / "paper"
    make_dataset("paper", 40, str(root), seed=3, workers=1, progress=False)
    return root


def test_runner_writes_json_and_plot_for_every_loader(tiny_data: Path, tmp_path: Path, capsys):
    compare = "baseline,webdataset" + (",dali" if HAS_DALI else "")
    out = tmp_path / "r.json"
    code = main(["bench", str(tiny_data / "shards") + "/", "--compare", compare, "--workers", "0,1", "--batches", "2",
                 "--repeat", "2", "--warmup", "1", "--batch-size", "8", "--image-size", "32", "--augment", "simple",
                 "--decode", "pil", "--device", "cpu", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert {(r["loader"], r["workers"]) for r in rows} == {(n, w) for n in ["gpupipe", *compare.split(",")]
                                                           for w in (0, 1)}
    for r in rows:
        assert r["set"] == "simple" and r["images_per_s"] > 0 and len(r["images_per_s_runs"]) == 2
        assert r["images_per_s_min"] <= r["images_per_s"] <= r["images_per_s_max"]
        assert r["cpu_percent"] > 0 and r["peak_rss_mb"] > 0 and r["batches"] == 2 and r["batch_size"] == 8
        assert {"cpu_us_per_image_outside", "cpu_us_per_image_native", "cpu_us_per_image_workers"} <= set(r)
    assert "CPU us/img: training process" in capsys.readouterr().out
    g = next(r for r in rows if r["loader"] == "gpupipe")
    assert {"decode_ms", "augment_ms", "wait_bytes_ms", "handoff_wait_ms"} <= set(g["stages_per_image_ms"])
    b = next(r for r in rows if r["loader"] == "baseline")
    assert b["per_sample"] in ("pillow+numpy",) or b["per_sample"].startswith("torchvision")
    assert "image folder" in b["reads"]
    meta = doc["meta"]
    assert meta["environment"]["cores"] >= 1 and meta["targets"][0]["dataset"]["preset"] == "paper"
    assert any("GPU" in n for n in meta["notes"]) or meta["environment"].get("gpu")
    pytest.importorskip("matplotlib")
    from gpupipe.tools.bench.plot import main as plot_main

    png = tmp_path / "r.png"
    assert plot_main([str(out), str(out), "-o", str(png)]) == 0  # one panel per set, docs combined
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_config_target_and_tar_members_baseline(tiny_data: Path, tmp_path: Path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"source: {{train: {tiny_data / 'shards'}/}}\ndecode: {{image_size: [24, 24], backend: pil}}\n"
                   "augment: complex\nloader: {batch_size: 8, device: cpu}\n")
    code = main(["bench", str(cfg), "--compare", "baseline", "--workers", "0", "--batches", "1", "--repeat", "1",
                 "--warmup", "1", "--images-dir", str(tiny_data / "images"), "--json", "-"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = json.loads(captured.out)["results"]
    assert [r["set"] for r in rows] == ["c", "c"] and rows[0]["decode"] == "pil"


def test_tar_members_are_read_when_there_is_no_folder(tiny_data: Path):
    from gpupipe.tools.bench.baselines import folder_items, shard_items

    shards = sorted(str(p) for p in (tiny_data / "shards").glob("*.tar"))
    from_tars, from_folder = shard_items(shards), folder_items(str(tiny_data / "images"))
    assert len(from_tars) == len(from_folder) == 40
    path, offset, size, _, key = from_tars[0]
    assert key.startswith("class_0") and "." not in key  # the sample key (<class>/<stem>_<n>), for messages
    with open(path, "rb") as f:
        f.seek(offset)
        assert f.read(2) == b"\xff\xd8" and size > 1000


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("gpupipe: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err


def test_bad_compare_name_is_one_line(tiny_data: Path, capsys):
    assert main(["bench", str(tiny_data / "shards") + "/", "--compare", "baseline,torchdata", "--workers", "0"]) == 2
    _one_line_error(capsys, "torchdata", "baseline, webdataset, dali")


def test_unsupported_transform_is_one_line(tiny_data: Path, tmp_path: Path, capsys):
    cfg = tmp_path / "blur.yaml"
    cfg.write_text(f"source: {{train: {tiny_data / 'shards'}/}}\ndecode: {{image_size: [24, 24]}}\n"
                   "augment: [{name: GaussianBlur, kernel_size: 3}]\nloader: {batch_size: 8}\n")
    assert main(["bench", str(cfg), "--compare", "baseline", "--workers", "0"]) == 2
    _one_line_error(capsys, "augment[0]", "GaussianBlur")


def test_make_data_command(tmp_path: Path, capsys):
    root = str(tmp_path / "d")
    assert main(["bench", "--make-data", "imagenet", "--images", "3", "--root", root, "--seed", "2"]) == 0
    summary = json.loads((tmp_path / "d" / "dataset.json").read_text())
    assert summary["images"] == 3 and (tmp_path / "d" / "shards" / "index.json").exists()
    assert "imagenet JPEGs" in capsys.readouterr().out


# -- the baselines with augment none and with a bad image (issue 12) ------------------------------
@pytest.fixture(scope="module")
def truncated_data(tmp_path_factory) -> tuple[Path, Path]:
    """12 JPEGs in images/ (one cut in half: 'image file is truncated') ingested to shards/."""
    from gpupipe.prepare.ingest import ingest
    from gpupipe.tools.synth import write_image_folder

    root = tmp_path_factory.mktemp("truncated")
    write_image_folder(str(root / "images"), num_images=12, num_classes=2, size=(48, 48))
    victim = sorted((root / "images").rglob("*.jpg"))[3]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    ingest(str(root / "images"), str(root / "shards"), shard_size=6, progress=False)
    return root, victim


def test_baselines_run_with_augment_none(tiny_data: Path, tmp_path: Path, capsys):
    out = tmp_path / "none.json"
    code = main(["bench", str(tiny_data / "shards") + "/", "--compare", "baseline,webdataset", "--workers", "0",
                 "--batches", "1", "--repeat", "1", "--warmup", "1", "--batch-size", "8", "--image-size", "24",
                 "--decode", "pil", "--device", "cpu", "--json", str(out)])  # --augment none is the default
    assert code == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())["results"]
    assert [r["loader"] for r in rows] == ["gpupipe", "baseline", "webdataset"] and rows[1]["images_per_s"] > 0


def test_per_sample_pipeline_without_a_cast_gives_uint8_like_gpupipe():
    import torch
    from PIL import Image

    from gpupipe.tools.bench.persample import build_per_sample

    img = Image.new("RGB", (40, 30), (200, 10, 3))
    for prefer in ("auto", "pil"):
        pipeline, _ = build_per_sample((), (24, 24), prefer)
        x = pipeline(img, np.random.default_rng(0))
        assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 24, 24) and int(x[0, 5, 5]) == 200


@pytest.mark.parametrize("step,blends", [("RandomAffine", False), ("RandomRotation", False),
                                         ("RandomPerspective", True)])
def test_per_sample_baseline_takes_the_steps_interpolation_or_torchvisions_default(step, blends):
    """Nearest copies input values; bilinear blends neighbours into new ones. Without an
    ``interpolation`` each step samples as torchvision's does (nearest for affine and
    rotation, bilinear for perspective); with one, as the step says — so a set that names
    its interpolation runs the same sampling on gpupipe and on the baselines."""
    import torch
    from PIL import Image

    from gpupipe.tools.bench.persample import build_per_sample

    checker = np.indices((32, 32)).sum(0) % 2 * np.array([[[40, 120, 200]]]).transpose(2, 0, 1)  # (3, 32, 32)
    img = Image.fromarray(checker.transpose(1, 2, 0).astype(np.uint8))
    args = {"degrees": 30} if step != "RandomPerspective" else {"distortion_scale": 0.5, "p": 1.0}
    allowed = {0, 40, 120, 200}
    for interpolation, blended in ((None, blends), ("nearest", False), ("bilinear", True)):
        given = args if interpolation is None else {**args, "interpolation": interpolation}
        pipeline, _ = build_per_sample(((step, given),), None, "pil")
        x = pipeline(img, np.random.default_rng(1))
        assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8
        new_values = set(x.unique().tolist()) - allowed
        assert bool(new_values) == blended, (interpolation, sorted(new_values)[:5])


def test_dali_baseline_maps_each_interpolation_to_its_own_kind():
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import types

    from gpupipe.tools.bench.dali import _interp_type

    assert [_interp_type(v) for v in ("nearest", "bilinear", "bicubic", 2)] == \
        [types.INTERP_NN, types.INTERP_LINEAR, types.INTERP_CUBIC, types.INTERP_LINEAR]
    with pytest.raises(ValueError, match="not supported"):
        _interp_type("lanczos")


@pytest.mark.parametrize("reads", ["folder", "tar members"])
def test_baseline_names_a_truncated_image_under_on_error_raise(truncated_data, reads):
    from gpupipe.core.errors import DecodeError
    from gpupipe.tools.bench.baselines import folder_items, shard_items, torch_batches
    from gpupipe.tools.bench.persample import build_per_sample

    root, victim = truncated_data
    items = folder_items(str(root / "images")) if reads == "folder" else \
        shard_items(sorted(str(p) for p in (root / "shards").glob("*.tar")))
    pipeline, _ = build_per_sample((), (16, 16), "pil")
    batches = torch_batches(items, pipeline, batch_size=4, workers=0, on_error="raise")
    with pytest.raises(DecodeError, match="truncated") as info:
        for _ in range(3):  # one epoch: every image once
            next(batches)
    where = str(victim) if reads == "folder" else f"sample '{victim.parent.name}/{victim.stem}"
    assert where in str(info.value) and "cannot decode" in str(info.value), info.value
    if reads == "tar members":
        assert ".tar" in str(info.value)


def test_bench_compare_skips_and_counts_a_truncated_image(truncated_data, tmp_path: Path, capsys):
    root, victim = truncated_data
    out = tmp_path / "bad.json"
    code = main(["bench", str(root / "shards") + "/", "--compare", "baseline,webdataset", "--workers", "0",
                 "--batches", "3", "--repeat", "1", "--warmup", "0", "--batch-size", "4", "--image-size", "16",
                 "--decode", "pil", "--device", "cpu", "--json", str(out)])  # a SOURCE runs gpupipe with skip
    err = capsys.readouterr().err
    assert code == 0, err
    rows = {r["loader"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["baseline"]["skipped"] >= 1  # 2 + 3 batches of 4: a whole epoch of 12 is read
    assert str(victim) in err and "skipped" in err


def test_single_run_writes_a_stage_timeline_trace(tiny_data: Path, tmp_path: Path, capsys):
    """``--timeline`` writes one decode and one augment span per timed batch as Chrome trace
    events; the spans of a stage never overlap each other (one thread each)."""
    trace = tmp_path / "trace.json"
    code = main(["bench", str(tiny_data / "shards") + "/", "--augment", "simple", "--batch-size", "4",
                 "--image-size", "16", "--epochs", "1", "--workers", "0", "--device", "cpu", "--timeline", str(trace)])
    assert code == 0, capsys.readouterr()
    events = json.loads(trace.read_text())["traceEvents"]
    spans = {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert set(spans) == {"decode", "augment"} and len(spans["decode"]) == len(spans["augment"]) >= 2
    for runs in spans.values():
        assert all(a[1] <= b[0] + 1 for a, b in zip(sorted(runs), sorted(runs)[1:]))
    assert "stage timeline" in capsys.readouterr().out


def test_without_workers_each_loader_runs_at_its_own_default(tiny_data: Path, tmp_path: Path, capsys):
    """No --workers: gpupipe as the config leaves it (its count, else the automatic one), the
    baseline one worker per core — not gpupipe forced to the baseline's count."""
    import os

    from gpupipe.core.machine import default_num_workers
    from gpupipe.core.types import World

    cores = len(os.sched_getaffinity(0))
    counts = {}
    for name, workers in (("auto", "null"), ("one", "1")):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(f"source: {{train: {tiny_data / 'shards'}/}}\ndecode: {{image_size: [24, 24], backend: pil}}\n"
                       f"loader: {{batch_size: 8, device: cpu, num_workers: {workers}}}\n")
        code = main(["bench", str(cfg), "--compare", "baseline", "--batches", "1", "--repeat", "1", "--warmup", "1",
                     "--json", str(tmp_path / f"{name}.json")])
        out = capsys.readouterr().out
        assert code == 0 and "gpupipe w=" in out and "w=N*: each loader at its own default" in out, out
        rows = json.loads((tmp_path / f"{name}.json").read_text())["results"]
        assert {r["workers_chosen_by"] for r in rows} == {"loader default"}
        counts[name] = {r["loader"]: r["workers"] for r in rows}
    assert counts["auto"] == {"gpupipe": default_num_workers(World(), decode_on_cpu=True), "baseline": cores}
    assert counts["one"] == {"gpupipe": 1, "baseline": cores}


def test_workers_given_apply_to_every_loader(tiny_data: Path, tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"source: {{train: {tiny_data / 'shards'}/}}\ndecode: {{image_size: [24, 24], backend: pil}}\n"
                   "loader: {batch_size: 8, device: cpu, num_workers: 1}\n")
    assert main(["bench", str(cfg), "--compare", "baseline", "--workers", "0", "--batches", "1", "--repeat", "1",
                 "--warmup", "1", "--json", str(tmp_path / "r.json")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [(r["loader"], r["workers"], r["workers_chosen_by"]) for r in rows] == [
        ("gpupipe", 0, "--workers"), ("baseline", 0, "--workers")]
    assert rows[0]["num_workers"] == 0


@pytest.mark.parametrize("extra", [["--timeline", "t.json"], ["--epochs", "3"]])
def test_single_run_options_with_a_config_are_refused_not_ignored(tiny_data: Path, tmp_path: Path, capsys, extra):
    extra = [str(tmp_path / v) if v == "t.json" else v for v in extra]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"source: {{train: {tiny_data / 'shards'}/}}\ndecode: {{image_size: [24, 24], backend: pil}}\n")
    assert main(["bench", str(cfg), *extra]) == 2
    _one_line_error(capsys, extra[0], "single-run mode", "a config", "shard folder as the SOURCE")
    assert main(["bench", str(tiny_data / "shards") + "/", "--repeat", "1", *extra]) == 2
    _one_line_error(capsys, extra[0], "--compare, --plot, --batches, --repeat")
    assert not (tmp_path / "t.json").exists()


def test_host_stage_times_the_host_path_beside_dalis_reader(tiny_data: Path, tmp_path: Path, capsys):
    out = tmp_path / "host.json"
    code = main(["bench", str(tiny_data / "shards"), "--stage", "host", "--repeat", "2", "--batches", "3",
                 "--batch-size", "4", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "us/sample" in printed and "cores per 25,000 img/s" in printed
    doc = json.loads(out.read_text())
    results = doc["results"]
    assert list(results)[0] == "gpupipe w=0" and (len(results) == 2) == HAS_DALI
    for r in results.values():
        assert len(r["runs"]) == 2 and r["samples_per_s"] > 0 and r["cpu_us_per_sample"] > 0
        assert r["samples_per_s_min"] <= r["samples_per_s"] <= r["samples_per_s_max"]
    assert ("per_core_vs_dali" in doc) == HAS_DALI and doc["meta"]["environment"]["cores"] >= 1


def test_host_stage_takes_one_source(tiny_data: Path, tmp_path: Path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: {train: x}\n")
    assert main(["bench", str(cfg), "--stage", "host"]) == 2
    assert "one SOURCE" in capsys.readouterr().err


def test_thread_cpu_tells_the_native_decoders_threads_from_the_rest_and_children_cpu_counts_workers():
    """``thread_cpu`` puts a thread named as DALI names its own (``[DALI]...``) under ``native`` and
    this thread's work under ``outside``; ``children_cpu`` counts a child process while it runs
    and after it was waited for."""
    import ctypes
    import multiprocessing
    import threading
    import time as _time

    from gpupipe.tools.bench.measure import children_cpu, thread_cpu, threads_cpu

    def burn(seconds: float) -> None:
        end = _time.process_time() + seconds
        while _time.process_time() < end:
            pass

    def native() -> None:
        ctypes.CDLL(None).prctl(15, b"[DALI] Executor", 0, 0, 0)  # PR_SET_NAME, as DALI names its threads
        end = _time.thread_time() + 0.3
        while _time.thread_time() < end:
            pass
        burned.set()
        done.wait()

    done, burned = threading.Event(), threading.Event()
    before = thread_cpu()
    t = threading.Thread(target=native)
    t.start()
    assert burned.wait(60)  # its 0.3 s of CPU, however long a loaded machine takes to give them
    mid, each = thread_cpu(), threads_cpu()
    done.set()
    t.join()
    assert each[(t.native_id, "[DALI] Executor")] >= 0.2  # the thread by its id and name
    assert mid["native"] - before["native"] >= 0.2
    assert mid["outside"] - before["outside"] < 0.2
    c0 = children_cpu()
    p = multiprocessing.get_context("fork").Process(target=burn, args=(0.3,))
    p.start()
    p.join()
    assert children_cpu() - c0 >= 0.2
