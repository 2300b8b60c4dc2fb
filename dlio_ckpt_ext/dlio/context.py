"""The workload config of the running job, handed from the hydra callback to
the mechanism, which DLIO's factory builds with no arguments."""
from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

_workload: Optional[DictConfig] = None


def set_workload(workload: DictConfig) -> None:
    global _workload
    _workload = workload


def get_workload() -> DictConfig:
    if _workload is None:
        raise RuntimeError(
            "dlio_ckpt_ext's hydra callback did not run, so the streaming checkpoint mechanism has "
            "no config: run one of its workload presets (dlio_benchmark workload=llama3_8b_checkpoint) "
            "or add hydra.callbacks.dlio_ckpt_ext._target_="
            "dlio_ckpt_ext.dlio.callback.CheckpointWorkloadCallback to your workload")
    return _workload
