"""``gpupipe validate`` survives a decoder that kills its process (issue 23).

A native decoder runs in a child process (gpupipe.tools.validate_child). The decoders here
(tests/crashing_decoder.py) really die by SIGSEGV in that child; the command must name the
batch, narrow it to the file(s) that kill the decoder alone, quarantine them as ``decoder
crash`` and check the rest -- where it used to exit 139 with nothing printed.
"""
from __future__ import annotations

import io
from pathlib import Path

import crashing_decoder
import numpy as np
import pytest
import torch
from PIL import Image

from gpupipe.core.errors import DecodeError
from gpupipe.decode import available_backends
from gpupipe.tools import cli, validate_child
from gpupipe.tools.synth import synthetic_jpeg
from gpupipe.tools.validate import validate

PILLOW_FILES = sorted(Path(__file__).resolve().parents[1].joinpath("fixtures", "pillow-jpeg").glob("*.jpg"))


def jpeg(i: int, comment: bytes = b"") -> bytes:
    img = Image.open(io.BytesIO(synthetic_jpeg(np.random.default_rng(i), (40, 32))))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **({"comment": comment} if comment else {}))
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """One class folder: 14 good images, 2 that kill the crashing decoder, 1 truncated."""
    root = tmp_path / "data"
    (root / "cls").mkdir(parents=True)
    for i in range(14):
        (root / "cls" / f"good{i:02d}.jpg").write_bytes(jpeg(i))
    for name in ("killer-a", "killer-b"):
        (root / "cls" / f"{name}.jpg").write_bytes(jpeg(99, crashing_decoder.KILL))
    (root / "cls" / "cut.jpg").write_bytes(jpeg(7)[:250])
    return root


@pytest.fixture
def crashing(monkeypatch: pytest.MonkeyPatch):
    """The decoding child builds the crashing decoder (the parent still resolves ``--decode``)."""
    if "dali" not in available_backends(torch.device("cpu")):
        pytest.skip("needs nvidia-dali: the crash path is taken for native backends")

    def use(factory: str) -> None:
        monkeypatch.setattr(validate_child, "FACTORY", f"crashing_decoder:{factory}")
    return use


def test_a_decoder_crash_is_narrowed_to_its_files_and_the_rest_is_checked(folder, crashing):
    crashing("make")
    report = validate(str(folder), decode="dali", batch_size=8)
    assert report.checked == 17
    kinds = {p.key.split("/")[-1]: p.kind for p in report.problems}
    assert kinds == {"killer-a": "decoder crash", "killer-b": "decoder crash", "cut": "truncated"}  # sample keys
    crash_reason = next(p.reason for p in report.problems if p.kind == "decoder crash")
    assert "SIGSEGV" in crash_reason and "Pillow decodes it" in crash_reason
    culprits = sorted(k.split("/")[-1] for c in report.crashes for k in c.culprits)
    assert culprits == ["killer-a", "killer-b"]
    assert all(c.how == "SIGSEGV" and len(c.keys) > len(c.culprits) for c in report.crashes)


def test_the_command_names_the_batch_and_goes_on(folder, crashing, capsys):
    crashing("make")
    code = cli.main(["validate", str(folder), "--decode", "dali", "--batch-size", "16", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "decoded with dali on cpu, in a child process: 14 good, 3 quarantined" in out
    assert "decoder crash      2" in out
    assert "the decoder died (SIGSEGV) on a batch of 16" in out and "narrowed to" in out
    assert "decoder crash: the decoding process (crashy on cpu) died (SIGSEGV) on this image alone" in out
    assert "killer-a.jpg" in out and "killer-b.jpg" in out


def test_a_crash_no_part_of_the_batch_repeats_is_reported_not_blamed(folder, crashing):
    crashing("make_batch_killer")
    report = validate(str(folder), decode="dali", batch_size=8)
    assert [p.key.split("/")[-1] for p in report.problems] == ["cut"]
    assert report.crashes and all(not c.culprits for c in report.crashes)
    assert "not narrowed" in report.crashes[0].describe()


@pytest.mark.parametrize("factory, message", [("make_dead_on_start", "the decoding process could not start"),
                                              ("no_such_factory", "could not be built in its process")])
def test_a_decoder_that_cannot_start_is_an_error_not_a_crash_of_every_image(folder, crashing, factory, message):
    crashing(factory)
    with pytest.raises(DecodeError, match=message):
        validate(str(folder), decode="dali")


def test_dali_decodes_in_a_child_process_and_pillows_files_pass(tmp_path):
    """The real DALI path, in its child: the three broken-header Pillow files (which
    killed DALI before the gate) are good images."""
    if "dali" not in available_backends(torch.device("cpu")):
        pytest.skip("needs nvidia-dali")
    (tmp_path / "data" / "cls").mkdir(parents=True)
    for path in PILLOW_FILES:
        (tmp_path / "data" / "cls" / path.name).write_bytes(path.read_bytes())
    report = validate(str(tmp_path / "data"), decode="dali")
    assert report.backend == "dali on cpu, in a child process"
    assert (report.checked, report.problems, report.crashes) == (3, [], [])
