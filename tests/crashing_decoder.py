"""Decoders that die by a signal, for the crash-containment tests of ``gpupipe validate``
(tests/tools/test_validate_crash.py). Imported by name in the decoding child process.

``make``: Pillow's decoder, except that an image holding :data:`KILL` (a JPEG comment) makes
the process kill itself with SIGSEGV -- what a native decoder's crash looks like from outside.
``make_batch_killer``: dies with SIGSEGV on any batch of more than 4 images (a crash that no
part of its batch reproduces). ``make_dead_on_start``: the process exits while the decoder is built.
"""
from __future__ import annotations

import dataclasses
import os
import signal

KILL = b"KILL-THE-DECODER"


class _Crashing:
    def __init__(self, inner, crashes):
        self.inner, self.crashes = inner, crashes
        self.name, self.device, self.stats = "crashy", inner.device, inner.stats

    def decode(self, batch):
        if self.crashes(batch):
            os.kill(os.getpid(), signal.SIGSEGV)
        return self.inner.decode(batch)

    def close(self) -> None:
        self.inner.close()


def _pil(config, device):
    from gpupipe.decode import make_decoder

    return make_decoder(dataclasses.replace(config, backend="pil"), device)


def make(config, device):
    return _Crashing(_pil(config, device), lambda batch: any(KILL in bytes(batch.image(i)) for i in range(len(batch))))


def make_batch_killer(config, device):
    return _Crashing(_pil(config, device), lambda batch: len(batch) > 4)


def make_dead_on_start(config, device):
    os._exit(3)
