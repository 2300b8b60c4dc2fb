"""Our workload presets, and a preset with overrides composed as dlio_benchmark composes it."""
from __future__ import annotations

from pathlib import Path

from dlio_ckpt_ext.config import RunConfig, load_config
from dlio_ckpt_ext.errors import ConfigError


def presets() -> list[str]:
    """The names of the checkpoint presets DLIO finds (through our hydra search-path plugin)."""
    from hydra_plugins.dlio_ckpt_ext_searchpath import presets_location
    location = presets_location()
    if location.startswith("file://"):
        folder = Path(location[len("file://"):]) / "workload"
    else:
        import importlib.resources
        folder = Path(str(importlib.resources.files("dlio_ckpt_ext.configs") / "workload"))
    return sorted(p.stem for pattern in ("*_checkpoint.yaml", "*_model_load.yaml") for p in folder.glob(pattern))


def compose_config(workload: str, overrides: list[str], ranks: int) -> RunConfig:
    """Preset `workload` with hydra `overrides`, composed by hydra exactly as
    dlio_benchmark would, validated for a job of `ranks` ranks."""
    from hydra import compose, initialize_config_module
    from hydra.errors import MissingConfigException
    try:
        with initialize_config_module(config_module="dlio_benchmark.configs", version_base=None):
            cfg = compose(config_name="config", overrides=[f"workload={workload}", *overrides])
    except MissingConfigException:
        raise ConfigError("--workload", workload, "one of the checkpoint presets: " + ", ".join(presets()))
    return load_config(cfg.workload, ranks)
