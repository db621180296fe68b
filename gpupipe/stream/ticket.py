"""What a pass of persistent stream workers reads at its start: the epoch, the plan and the
progress, in shared memory the training process writes before each pass.

Stream workers outlive a pass (torch's ``persistent_workers``): forking 16 of them from a training
process that holds a model and a CUDA context costs every pass, their reused batch buffers
(:mod:`gpupipe.stream.slots`) would start empty each pass, and a pass's first batch waits for it.
So the per-pass settings no longer travel with the fork: the training process writes them here
(:meth:`PassTicket.write`) before it starts the pass, and each worker reads them when its pass
begins (:meth:`PassTicket.read`). A sequence number around each write (odd while writing) lets a
reader tell a torn read from a whole one and read again.
"""
from __future__ import annotations

import pickle
import time
from typing import Any

import torch

from gpupipe.core.errors import GpupipeError

__all__ = ["PassTicket"]

_HEAD = 16  # two int64: the sequence number (odd while a write is under way), the payload's length


class PassTicket:
    """``capacity`` bytes of pickled per-pass settings in shared memory, made before the workers
    fork; ``pass_id`` counts the passes written."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._buffer = torch.zeros(_HEAD + capacity, dtype=torch.uint8).share_memory_()
        self._head = self._buffer[:_HEAD].view(torch.int64)
        self.pass_id = 0

    def write(self, value: Any) -> bool:
        """Publish ``value`` for the next pass (training process). False when it does not fit."""
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > self.capacity:
            return False
        seq = int(self._head[0])
        self._head[0] = seq + 1  # odd: a write is under way
        self._buffer[_HEAD:_HEAD + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._head[1] = len(data)
        self._head[0] = seq + 2
        self.pass_id += 1
        return True

    def read(self, timeout_s: float = 60.0) -> Any:
        """The value last published (a worker, at the start of its pass)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seq = int(self._head[0])
            if seq % 2 == 0 and seq > 0:
                n = int(self._head[1])
                data = self._buffer[_HEAD:_HEAD + n].numpy().tobytes()
                if int(self._head[0]) == seq:
                    return pickle.loads(data)
            time.sleep(0.0001)
        raise GpupipeError(f"no pass settings were published within {timeout_s:.0f} s: a gpupipe bug, please report it")
