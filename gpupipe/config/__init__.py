"""Config room: the YAML schema, its typed per-stage values, presets and the keyword form.

* :mod:`~gpupipe.config.schema` — :func:`load_config` / :func:`parse_config` → :class:`PipelineConfig`;
* :mod:`~gpupipe.config.split` — :class:`SplitConfig`, one split's settings, and
  :func:`split_from_options`, the keyword form (``GpuLoader(url, batch_size=…)``);
* :mod:`~gpupipe.config.values` — typed parsing of a mapping into a dataclass, with did-you-mean.

Sits above the stages it configures (decode, augment, stream, sources) and below the loader.
"""
from gpupipe.config.keywords import split_from_options
from gpupipe.config.schema import (
    AugmentPlace,
    BatchFormat,
    LoaderConfig,
    PipelineConfig,
    Secrets,
    SourceConfig,
    TransformSpec,
    load_config,
    parse_config,
    preset,
)
from gpupipe.config.split import SplitConfig

__all__ = ["PipelineConfig", "SourceConfig", "LoaderConfig", "TransformSpec", "Secrets", "BatchFormat",
           "AugmentPlace", "load_config", "parse_config", "preset", "SplitConfig", "split_from_options"]
