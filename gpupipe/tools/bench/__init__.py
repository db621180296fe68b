"""``gpupipe bench``: gpupipe against the loaders users would otherwise pick, measured.

Modules: :mod:`~gpupipe.tools.bench.data` (dead-leaves datasets: the paper setup and an
ImageNet-like mix), :mod:`~gpupipe.tools.bench.steps` (the transform set as plain data),
:mod:`~gpupipe.tools.bench.persample` (per-sample torchvision or Pillow/NumPy transforms),
:mod:`~gpupipe.tools.bench.baselines` (torch DataLoader, webdataset), :mod:`~gpupipe.tools.bench.dali`
(pure DALI), :mod:`~gpupipe.tools.bench.runner` (interleaved timing), :mod:`~gpupipe.tools.bench.measure`
(CPU, RSS, GPU), :mod:`~gpupipe.tools.bench.plot`, :mod:`~gpupipe.tools.bench.cli`. Nothing here is
imported by ``import gpupipe``; the baselines' libraries are the ``bench`` extra.
"""

__all__: list[str] = []
