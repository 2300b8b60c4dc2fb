"""Our workload presets, and a preset with overrides composed as dlio_benchmark composes it."""
from __future__ import annotations

from pathlib import Path

from dlio_ckpt_ext.config import RunConfig, load_config
from dlio_ckpt_ext.errors import ConfigError


#: the preset kinds, by their names' ends: checkpointing (MLPerf's and ours), model loads, and
#: checkpoints inside DLIO's training loop (whose names end in _checkpoint too)
TRAINING = "_train_checkpoint"
KINDS = ("_checkpoint", "_model_load", TRAINING)


def presets(kinds: tuple[str, ...] = KINDS) -> list[str]:
    """The names of the presets of those kinds DLIO finds (through our hydra search-path plugin)."""
    from hydra_plugins.dlio_ckpt_ext_searchpath import presets_location
    location = presets_location()
    if location.startswith("file://"):
        folder = Path(location[len("file://"):]) / "workload"
    else:
        import importlib.resources
        folder = Path(str(importlib.resources.files("dlio_ckpt_ext.configs") / "workload"))
    names = {p.stem for kind in kinds for p in folder.glob(f"*{kind}.yaml")}
    return sorted(n for n in names if TRAINING in kinds or not n.endswith(TRAINING))


def compose_config(workload: str, overrides: list[str], ranks: int, kinds: tuple[str, ...] = KINDS) -> RunConfig:
    """Preset `workload` with hydra `overrides`, composed by hydra exactly as
    dlio_benchmark would, validated for a job of `ranks` ranks; an unknown one
    is refused with the presets of `kinds` listed."""
    from hydra import compose, initialize_config_module
    from hydra.errors import MissingConfigException
    try:
        with initialize_config_module(config_module="dlio_benchmark.configs", version_base=None):
            cfg = compose(config_name="config", overrides=[f"workload={workload}", *overrides])
    except MissingConfigException:
        what = "checkpoint presets" if kinds == ("_checkpoint",) else "presets"
        raise ConfigError("--workload", workload, f"one of the {what}: " + ", ".join(presets(kinds)))
    return load_config(cfg.workload, ranks)
