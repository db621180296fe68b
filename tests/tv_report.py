"""The record of what tests/augment/test_vs_torchvision.py measured against torchvision,
printed at the end of the run as two tables (the largest pixel difference per op, and the
parameter-distribution tests per op), so a run is its own report.

A pytest plugin, registered by tests/conftest.py (``pytest_plugins``) so that its hooks are
those of the process that prints the summary. Under pytest-xdist (``make test`` runs
``-n 2``) that process is the controller, which runs no test: each worker hands its rows back
in ``workeroutput`` when its session ends, and the controller adds them to its own record
(``pytest_testnodedown``) before ``pytest_terminal_summary`` prints the tables. Without
xdist the one process records and prints, as before.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest

_OUTPUT = "vs_torchvision"  # the key in xdist's workeroutput


@dataclass
class VsTorchvision:
    """Pixel cases: op → [(case, dtype, largest |difference| in uint8 levels, share of
    pixels beyond the tolerance, the share allowed)]. Distribution tests: op →
    [(what, test, p-value)]."""

    pixels: dict[str, list[tuple[str, str, float, float, float]]] = field(default_factory=lambda: defaultdict(list))
    draws: dict[str, list[tuple[str, str, float]]] = field(default_factory=lambda: defaultdict(list))
    alpha: float = 1e-3

    def to_plain(self) -> dict:
        """Plain dicts, lists and tuples: what execnet carries from a worker to the controller."""
        return {"pixels": dict(self.pixels), "draws": dict(self.draws)}

    def add(self, plain: dict) -> None:
        """Add a worker's :meth:`to_plain` rows to this record."""
        for op, cases in plain["pixels"].items():
            self.pixels[op].extend(tuple(c) for c in cases)
        for op, tests in plain["draws"].items():
            self.draws[op].extend(tuple(t) for t in tests)

    def pixel_rows(self) -> list[str]:
        rows = [f"{'op':<20} {'cases':>5} {'max |d| uint8 in':>16} {'max |d| float in':>16} "
                f"{'share > tol':>11} {'cases failing':>13}"]
        for op in sorted(self.pixels):
            cases = sorted(self.pixels[op])  # the order the workers finished in says nothing
            worst = {dt: max((c[2] for c in cases if c[1] == dt), default=float("nan")) for dt in ("uint8", "float32")}
            over = [c[0] + f" [{c[1]}]" for c in cases if c[3] > c[4]]
            rows.append(f"{op:<20} {len(cases):>5} {worst['uint8']:>16.4g} {worst['float32']:>16.4g} "
                        f"{max(c[3] for c in cases):>11.3%} {len(over):>13}"
                        + (f"  ({'; '.join(over[:3])}{' ...' if len(over) > 3 else ''})" if over else ""))
        total = sum(len(v) for v in self.pixels.values())
        rows.append(f"{len(self.pixels)} ops, {total} pixel cases (one case: one setting, one input dtype, one "
                    "image size, its 6 images); |d| in uint8 levels (a float output's times 255); share > tol: the "
                    "largest share of a case's pixels beyond its op's tolerance (nearest-neighbour ties)")
        return rows

    def draw_rows(self) -> list[str]:
        rows = [f"{'op':<20} {'tests':>5} {'smallest p':>10}  rejected at alpha={self.alpha:g}"]
        for op in sorted(self.draws):
            tests = sorted(self.draws[op])
            low = min(t[2] for t in tests)
            bad = [f"{t[0]} ({t[1]})" for t in tests if t[2] < self.alpha]
            rows.append(f"{op:<20} {len(tests):>5} {low:>10.3g}  {', '.join(bad) if bad else '-'}")
        return rows


_KEY = pytest.StashKey[VsTorchvision]()


@pytest.fixture(scope="session")
def vs_torchvision(pytestconfig) -> VsTorchvision:
    """The session's record of gpupipe-vs-torchvision measurements (this process's share of it
    under xdist)."""
    return pytestconfig.stash.setdefault(_KEY, VsTorchvision())


def pytest_sessionfinish(session) -> None:
    """On an xdist worker: hand this worker's rows to the controller."""
    record = session.config.stash.get(_KEY, None)
    if record is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput[_OUTPUT] = record.to_plain()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown (and never called) without xdist
def pytest_testnodedown(node, error) -> None:
    """On the xdist controller: add a finished worker's rows to the record printed below."""
    plain = getattr(node, "workeroutput", {}).get(_OUTPUT)
    if plain is not None:
        node.config.stash.setdefault(_KEY, VsTorchvision()).add(plain)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    record = config.stash.get(_KEY, None)
    if record is None:
        return
    if record.pixels:
        terminalreporter.write_sep("-", "gpupipe vs torchvision.transforms.v2: pixels, same parameters")
        for line in record.pixel_rows():
            terminalreporter.write_line(line)
    if record.draws:
        terminalreporter.write_sep("-", "gpupipe vs torchvision.transforms.v2: parameter distributions")
        for line in record.draw_rows():
            terminalreporter.write_line(line)
