"""No input kills the training process: mutated JPEGs through GpuLoader with DALI (issue 23).

DALI's JPEG parser (nvImageCodec) segfaulted on headers libjpeg recovers from -- stray
bytes between segments, ``FF 00`` for a marker, a length a few bytes off -- in every run of
this fuzz before the strict gate (gpupipe.decode.gate). Each run here is a subprocess
(tests/fuzz_decode_script.py): a crash fails the test with its signal instead of killing
the suite. Every file Pillow decodes must be delivered (as itself, with its own label),
and every file not delivered counted as skipped. A file Pillow refuses may still be
delivered only if its header passed the gate: damage after the first SOS (in the scan) is
beyond what a header check can see, and there DALI's libjpeg-turbo may decode what
Pillow refuses -- the decode contract's ``either`` case (tests/decode_corpus.py). A file
the gate sent to Pillow and Pillow refused is always skipped.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import jpeg_mutations
import numpy as np
import pytest
import torch
from datagen import write_dataset
from PIL import Image

from gpupipe.core.errors import DecodeError
from gpupipe.decode import available_backends
from gpupipe.decode.common import upright_size
from gpupipe.decode.gate import native_decodable
from gpupipe.decode.pil import decode_one
from gpupipe.formats.imageheader import check_complete, probe

TESTS = Path(__file__).resolve().parents[1]  # the helpers and fixtures live in tests/
SCRIPT = TESTS / "fuzz_decode_script.py"
PILLOW_FILES = sorted(TESTS.joinpath("fixtures", "pillow-jpeg").glob("*.jpg"))
FILES_PER_RUN = 768  # 12 batches of 64; a quarter of them clean, the rest one mutation each
RUNS = 6  # seeds: 3,456 mutated files in all; odd seeds decode crop windows, even ones whole images

needs_dali = pytest.mark.skipif("dali" not in available_backends(torch.device("cpu")), reason="needs nvidia-dali")


def pillow_decodes(data: bytes) -> bool:
    """What the Pillow backend delivers: the pre-decode checks pass and Pillow decodes it."""
    try:
        header = probe(data)
        check_complete(data, header)
        with warnings.catch_warnings():  # Pillow warns about the broken Exif some mutations write
            warnings.simplefilter("ignore")
            decode_one(data, (0, 0, *upright_size(header)), (32, 32))
    except (DecodeError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False
    return True


def run_loader(files: list[bytes], root: Path, resize: str = "fixed", device: str = "cpu") -> dict:
    """One epoch of ``files`` (sample i: key k{i:07d}, label i) through GpuLoader with DALI in a
    subprocess; its result, or a failure naming the signal that killed it. ``resize``:
    ``fixed`` decodes whole images, ``random_resized_crop`` only each crop box's window."""
    write_dataset(str(root), [len(files)], image=lambda i: files[i], num_classes=10**7)
    out = root / "result.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(root), str(out), resize, device], capture_output=True,
                         text=True, timeout=240)
    if run.returncode < 0:
        pytest.fail(f"the decoding process died with {signal.Signals(-run.returncode).name}; "
                    f"stderr ends: {run.stderr[-1500:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def check_outcome(result: dict, files: list[bytes], kinds: list[str]) -> None:
    """Every file Pillow decodes delivered as itself; every one not delivered counted."""
    keys = [f"k{i:07d}" for i in range(len(files))]
    assert sorted(set(result["seen"])) == keys
    delivered = result["delivered"]
    assert all(delivered[k] == int(k[1:]) for k in delivered), "a delivered image carries another's label"
    pillow = [pillow_decodes(data) for data in files]
    lost = [(kinds[i], k) for i, k in enumerate(keys) if k not in delivered and pillow[i]]
    assert not lost, f"files Pillow decodes were not delivered: {lost[:10]}"
    assert result["skipped"] == len(keys) - len(delivered)
    beyond = [(kinds[i], k) for i, k in enumerate(keys) if k in delivered and not pillow[i]
              and not native_decodable(probe(files[i]))]
    assert not beyond, f"files the gate sent to Pillow, which refused them, were delivered: {beyond[:10]}"


@needs_dali
def test_pillow_files_with_broken_headers_never_reach_a_native_decoder():
    assert len(PILLOW_FILES) == 3
    for path in PILLOW_FILES:
        header = probe(path.read_bytes())
        assert "stray or fill bytes" in header.irregular, (path.name, header.irregular)
        assert not native_decodable(header)


@needs_dali
def test_pillow_files_at_batch_64_are_all_delivered(tmp_path):
    """64 copies of each of Pillow's broken-header JPEGs (before the gate: SIGSEGV in most runs)."""
    clean = jpeg_mutations.base_jpegs(seed=1, count=8)
    files = [path.read_bytes() for path in PILLOW_FILES for _ in range(64)] + clean
    result = run_loader(files, tmp_path)
    assert len(result["delivered"]) == len(files) and result["skipped"] == 0


def fuzzed(seed: int) -> tuple[list[bytes], list[str]]:
    """``FILES_PER_RUN`` files of run ``seed``: every fourth clean, the others one mutation each."""
    base = jpeg_mutations.base_jpegs(seed)
    rng = np.random.default_rng([seed, 77])
    files, kinds = [], []
    for i in range(FILES_PER_RUN):
        if i % 4 == 0:
            kind, data = "clean", base[i % len(base)]
        else:
            kind, data = jpeg_mutations.mutate(base[i % len(base)], rng)
        files.append(data)
        kinds.append(kind)
    return files, kinds


def check_run(result: dict, files: list[bytes], kinds: list[str]) -> None:
    check_outcome(result, files, kinds)
    clean = [f"k{i:07d}" for i, k in enumerate(kinds) if k == "clean"]
    assert all(k in result["delivered"] for k in clean)
    assert result["skipped"] > FILES_PER_RUN // 10  # the mutations do break files: the fuzz is not idle


@pytest.mark.slow
@needs_dali
@pytest.mark.parametrize("seed", range(RUNS))
def test_mutated_jpegs_never_kill_the_process(tmp_path, seed):
    files, kinds = fuzzed(seed)
    check_run(run_loader(files, tmp_path, "random_resized_crop" if seed % 2 else "fixed"), files, kinds)


@pytest.mark.gpu
@pytest.mark.dali
@pytest.mark.parametrize("resize", ["fixed", "random_resized_crop"])
def test_mutated_jpegs_never_kill_the_process_on_the_gpu(tmp_path, resize):
    """The same files through DALI ``mixed`` (nvImageCodec's parser, nvJPEG and the hardware decoder)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("nvidia.dali")
    for seed in range(2):
        files, kinds = fuzzed(seed)
        check_run(run_loader(files, tmp_path / str(seed), resize, "cuda"), files, kinds)
