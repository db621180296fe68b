"""At 0 stream workers the batches are made in the decode thread itself, without torch's
DataLoader: the loader pins them when asked (``pin_memory``, set for a CUDA device), as the
DataLoader did — every batch, and only then."""
from __future__ import annotations

import pytest
import torch
from datagen import write_dataset

from gpupipe.loader.encoded import EncodedLoader
from gpupipe.stream.batch import EncodedBatch


@pytest.mark.parametrize("pin", [False, True])
def test_each_batch_is_pinned_exactly_when_asked(tmp_path, monkeypatch, pin):
    write_dataset(str(tmp_path / "ds"), [20, 13])
    pinned: list[int] = []
    monkeypatch.setattr(EncodedBatch, "pin_memory", lambda self: pinned.append(self.batch) or self)
    ld = EncodedLoader(str(tmp_path / "ds"), batch_size=8, drop_last=False, num_workers=0)
    ld.pin_memory = pin
    delivered = [b.batch for b in ld]
    assert len(delivered) == 5 and pinned == (delivered if pin else [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_are_in_pinned_memory_on_a_cuda_machine(tmp_path):
    write_dataset(str(tmp_path / "ds"), [20, 13])
    ld = EncodedLoader(str(tmp_path / "ds"), batch_size=8, drop_last=False, num_workers=0)
    ld.pin_memory = True
    assert all(b.data.is_pinned() and b.offsets.is_pinned() for b in ld)
