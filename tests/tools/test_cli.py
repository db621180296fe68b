"""The gpupipe command line: exit codes, one-line errors, help, no secrets printed."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpupipe
from gpupipe.tools.cli import COMMANDS, main

REPO = Path(gpupipe.__file__).resolve().parent.parent
SECRET = "hunter2-do-not-print"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "gpupipe.tools.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupipe: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    from PIL import Image

    for c, name in enumerate(("a", "b")):
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(3):
            buf = io.BytesIO()
            Image.new("RGB", (8 + i, 8 + c), (40 * i, 90, 10)).save(buf, "JPEG")
            (tmp_path / "src" / name / f"{i}.jpg").write_bytes(buf.getvalue())
    (tmp_path / "src" / "b" / "bad.jpg").write_bytes(b"<html>oops</html>")
    return tmp_path / "src"


def test_ingest_inspect_index_round_trip(image_folder: Path, tmp_path: Path):
    proc = run_cli("ingest", str(image_folder), "out", "--shard-size", "4", "--seed", "3", "--quiet",
                   "--storage-option", f"token={SECRET}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "6 samples in 2 shards" in proc.stdout and "bad.jpg" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
    proc = run_cli("inspect", "out", "--json", "--keys", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert (info["samples"], info["shards"], info["classes"], len(info["first_keys"])) == (6, 2, ["a", "b"], 2)
    (tmp_path / "out" / "index.json").unlink()
    proc = run_cli("index", "out", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0 and "indexed 6 samples in 2 shards" in proc.stdout, proc.stderr
    proc = run_cli("inspect", "out", cwd=tmp_path)
    assert proc.returncode == 0 and "samples:  6" in proc.stdout, proc.stderr


def test_missing_source_is_one_line(tmp_path: Path):
    proc = run_cli("ingest", "no-such-folder", "out", "--storage-option", f"token={SECRET}", cwd=tmp_path)
    assert_one_line_error(proc, "no-such-folder", "no such folder")
    assert not (tmp_path / "out").exists()


def test_unknown_subcommand_is_one_line(tmp_path: Path):
    assert_one_line_error(run_cli("frobnicate", cwd=tmp_path), "frobnicate", "--help")


def test_bad_storage_option_is_one_line_and_not_echoed(tmp_path: Path):
    proc = run_cli("inspect", "x", "--storage-option", SECRET, cwd=tmp_path)
    assert_one_line_error(proc, "KEY=VALUE")


def test_help_for_every_subcommand(capsys):
    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    assert all(name in top for name in COMMANDS)
    for name in COMMANDS:
        assert main([name, "--help"]) == 0
        assert f"usage: gpupipe {name}" in capsys.readouterr().out


def test_main_in_process_errors(tmp_path: Path, capsys):
    assert main(["ingest", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpupipe: error: ") and err.count("\n") == 1
    assert main(["ingest", str(tmp_path), str(tmp_path / "o"), "--shard-size", "x"]) == 2
    assert "--shard-size" in capsys.readouterr().err
    assert main([]) == 2  # a subcommand is required
    assert "COMMAND" in capsys.readouterr().err


def test_storage_option_values_parse_as_json_or_text():
    from gpupipe.tools.cliargs import key_value

    assert key_value("anon=true") == ("anon", True)
    assert key_value("client_kwargs={\"region_name\": \"x\"}") == ("client_kwargs", {"region_name": "x"})
    assert key_value("profile=dev") == ("profile", "dev")
    assert key_value("key=a=b") == ("key", "a=b")


def test_demo_runs_stream_and_decode_and_prints_throughput(tmp_path: Path):
    proc = run_cli("demo", "--root", str(tmp_path / "demo"), "--images", "64", "--size", "48",
                   "--batch-size", "16", "--image-size", "32", "--decode", "pil", "--workers", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "images/s" in proc.stdout and "decode (pil on cpu, 32x32) -> augment (simple set" in proc.stdout
    assert (tmp_path / "demo" / "shards" / "index.json").exists()


def test_bench_prints_stages_as_json(tmp_path: Path):
    run_cli("demo", "--root", str(tmp_path / "demo"), "--images", "40", "--size", "40", "--batch-size", "8",
            "--image-size", "16", "--decode", "pil", "--workers", "0", cwd=tmp_path)
    proc = run_cli("bench", str(tmp_path / "demo" / "shards") + "/", "--batch-size", "8", "--image-size", "16",
                   "--decode", "pil", "--workers", "0", "--epochs", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stages"]["images"] == 40 and out["images_per_s"] > 0 and out["backend"] == "pil"


def test_bench_on_a_missing_dataset_is_one_line(tmp_path: Path):
    proc = run_cli("bench", str(tmp_path / "nothing") + "/", cwd=tmp_path)
    assert_one_line_error(proc, "nothing")


# -- a reader that stops early; a device the machine does not have (issue 12) ------------------
@pytest.mark.parametrize("command", [["inspect", "{ds}", "--json"], ["--help"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path, command):
    from datagen import write_dataset

    write_dataset(str(tmp_path / "ds"), [5, 5])
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [a.format(ds=tmp_path / "ds") for a in command]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gpupipe.tools.cli", *argv], stdout=subprocess.PIPE, stderr=err,
                                cwd=tmp_path, env=env)
        proc.stdout.close()  # `| head` gone before the first line: every write is a broken pipe
        code = proc.wait(timeout=120)
    assert (code, (tmp_path / "stderr").read_text()) == (0, "")  # was "[Errno 32] Broken pipe", exit 2


@pytest.mark.parametrize("command", [["preview", "--config", "x.yaml"], ["validate", "x"], ["bench", "x"]])
def test_device_cuda_without_cuda_is_one_line_naming_the_option(monkeypatch, capsys, command):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*command, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "argument --device: 'cuda': CUDA is not available" in err[0], err
    assert "--device cpu" in err[0]
    assert main([*command, "--device", "gpu0"]) == 2
    assert "expected cpu, cuda or cuda:N, got 'gpu0'" in capsys.readouterr().err
