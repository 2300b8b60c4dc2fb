"""Hydra callback named by our workload presets; runs on every rank before
DLIO's task function."""
from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dlio_ckpt_ext.dlio import context


def dlio_has_checkpoint_workflow() -> bool:
    """Upstream DLIO runs checkpoint-only workloads itself (its config knows
    num_checkpoints_write); DLIO 2.0.0 does not."""
    from dlio_benchmark.utils.config import ConfigArguments
    return hasattr(ConfigArguments, "num_checkpoints_write")


def wants_checkpoint_only(workload: DictConfig) -> bool:
    wf = workload.get("workflow", {}) or {}
    return bool(wf.get("checkpoint", False)) and not bool(wf.get("train", False))


def install_workflow() -> None:
    """Make DLIO's task function build our workflow instead of DLIOBenchmark.

    DLIO 2.0.0 has no hook for a workflow, but its task function looks
    DLIOBenchmark up in its module at call time, so the swap reaches it
    whether DLIO runs as the dlio_benchmark script or as `python -m`.
    """
    import dlio_benchmark.main as dlio_main

    from dlio_ckpt_ext.dlio.workflow import CheckpointOnlyBenchmark
    for module in (dlio_main, sys.modules.get("__main__")):
        if module is not None and hasattr(module, "run_benchmark") and hasattr(module, "DLIOBenchmark"):
            module.DLIOBenchmark = CheckpointOnlyBenchmark


def reset_singletons() -> None:
    """A hydra multirun runs its jobs one after another in one process: each job
    must start from fresh DLIO arguments and a fresh mechanism, not inherit the
    previous job's (DLIO would, e.g., reuse its output folder)."""
    from dlio_benchmark.utils.config import ConfigArguments

    from dlio_ckpt_ext.dlio.mechanism import StreamingCheckpointing
    ConfigArguments.reset()
    StreamingCheckpointing.reset()


class CheckpointWorkloadCallback(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        workload = config.workload
        context.set_workload(workload)
        reset_singletons()
        if wants_checkpoint_only(workload) and not dlio_has_checkpoint_workflow():
            install_workflow()
