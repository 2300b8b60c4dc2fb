"""The workload config of the running job, for the mechanism, which DLIO's
factory builds with no arguments.

Our presets' hydra callback hands it over; a workload that names our
mechanism without the callback (upstream DLIO's own llama_* configs) is read
back from the config hydra saved for this job before the task started.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

_workload: Optional[DictConfig] = None


def set_workload(workload: Optional[DictConfig]) -> None:
    global _workload
    _workload = workload


def _saved_job_config() -> Optional[DictConfig]:
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.output_subdir is None:
        return None
    path = Path(hc.runtime.output_dir) / hc.output_subdir / "config.yaml"
    if not path.exists():
        return None
    cfg = OmegaConf.load(path)
    return cfg.get("workload")


def get_workload() -> DictConfig:
    workload = _workload if _workload is not None else _saved_job_config()
    if workload is None:
        raise RuntimeError(
            "the streaming checkpoint mechanism found no workload config: neither dlio_ckpt_ext's hydra "
            "callback nor a saved hydra job config (hydra.output_subdir) is available; run one of its "
            "presets (dlio_benchmark workload=llama3_8b_checkpoint) or add "
            "++hydra.callbacks.dlio_ckpt_ext._target_=dlio_ckpt_ext.dlio.callback.CheckpointWorkloadCallback")
    return workload
