"""``gpupipe bench``: gpupipe against the loaders users would otherwise pick, measured.

Modules: :mod:`~gpupipe.bench.data` (dead-leaves datasets: the paper setup and an
ImageNet-like mix), :mod:`~gpupipe.bench.steps` (the transform set as plain data),
:mod:`~gpupipe.bench.persample` (per-sample torchvision or Pillow/NumPy transforms),
:mod:`~gpupipe.bench.baselines` (torch DataLoader, webdataset), :mod:`~gpupipe.bench.dali`
(pure DALI), :mod:`~gpupipe.bench.runner` (interleaved timing), :mod:`~gpupipe.bench.measure`
(CPU, RSS, GPU), :mod:`~gpupipe.bench.plot`, :mod:`~gpupipe.bench.cli`. Nothing here is
imported by ``import gpupipe``; the baselines' libraries are the ``bench`` extra.
"""

__all__: list[str] = []
