"""The hydra callback swaps in our workflow on DLIO 2.0.0 only."""
import dlio_benchmark.main as dlio_main
from dlio_benchmark.utils.config import ConfigArguments
from omegaconf import OmegaConf

from dlio_ckpt_ext.dlio import callback, context
from dlio_ckpt_ext.dlio.workflow import CheckpointOnlyBenchmark

CKPT_ONLY = {"workload": {"workflow": {"train": False, "checkpoint": True}}}


def test_dlio_2_0_0_gets_our_checkpoint_only_workflow(monkeypatch):
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", dlio_main.DLIOBenchmark)
    callback.CheckpointWorkloadCallback().on_job_start(OmegaConf.create(CKPT_ONLY))
    assert dlio_main.DLIOBenchmark is CheckpointOnlyBenchmark
    assert context.get_workload().workflow.checkpoint is True


def test_a_dlio_with_its_own_checkpoint_workflow_keeps_it(monkeypatch):
    original = dlio_main.DLIOBenchmark
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", original)
    monkeypatch.setattr(ConfigArguments, "num_checkpoints_write", 1, raising=False)  # as upstream DLIO has
    callback.CheckpointWorkloadCallback().on_job_start(OmegaConf.create(CKPT_ONLY))
    assert dlio_main.DLIOBenchmark is original


def test_training_workloads_are_left_to_dlio(monkeypatch):
    original = dlio_main.DLIOBenchmark
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", original)
    callback.CheckpointWorkloadCallback().on_job_start(
        OmegaConf.create({"workload": {"workflow": {"train": True, "checkpoint": True}}}))
    assert dlio_main.DLIOBenchmark is original
