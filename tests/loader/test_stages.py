"""The stage threads (gpupipe.loader.stages) and the processes forked from them: a DataLoader
worker is forked from the decode thread, and must end as soon as its work is done."""
from __future__ import annotations

import multiprocessing
import time

from gpupipe.loader.stages import END, Stage, Stages


def test_a_process_forked_from_a_stage_thread_exits_at_once():
    """The child inherits the parent's live ``Stages`` (and the at-exit hook that stops them);
    its forking thread is alive there, so stopping them would wait out the 30 s join timeout
    (what made every pass of a GpuLoader with workers end 5 s late: torch's join timeout)."""
    ctx = multiprocessing.get_context("fork")
    exits: list[tuple[int | None, float]] = []

    def source():
        child = ctx.Process(target=int)
        t0 = time.monotonic()
        child.start()
        child.join(timeout=10)
        exits.append((child.exitcode, time.monotonic() - t0))
        if child.exitcode is None:
            child.kill()
        yield 0

    run = Stages(source, [Stage("decode", lambda i: i)], prefetch=1)
    try:
        assert run.get() == 0 and run.get() is END
    finally:
        run.stop()
    ((code, seconds),) = exits
    assert code == 0 and seconds < 3.0, (code, seconds)
