"""The hydra callback swaps in our workflow on DLIO 2.0.0 only (the whole
callback runs in every end-to-end test; these check its choice alone)."""
import dlio_benchmark.main as dlio_main
from dlio_benchmark.utils.config import ConfigArguments
from omegaconf import OmegaConf

from dlio_ckpt_ext.dlio import callback
from dlio_ckpt_ext.dlio.workflow import CheckpointOnlyBenchmark

CKPT_ONLY = {"workload": {"workflow": {"train": False, "checkpoint": True}}}


def test_dlio_2_0_0_gets_our_checkpoint_only_workflow(monkeypatch):
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", dlio_main.DLIOBenchmark)
    monkeypatch.delattr(ConfigArguments, "num_checkpoints_write", raising=False)  # as 2.0.0 has none
    callback.choose_workflow(OmegaConf.create(CKPT_ONLY).workload)
    assert dlio_main.DLIOBenchmark is CheckpointOnlyBenchmark


def test_a_dlio_with_its_own_checkpoint_workflow_keeps_it(monkeypatch):
    original = dlio_main.DLIOBenchmark
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", original)
    monkeypatch.setattr(ConfigArguments, "num_checkpoints_write", 1, raising=False)  # as upstream DLIO has
    callback.choose_workflow(OmegaConf.create(CKPT_ONLY).workload)
    assert dlio_main.DLIOBenchmark is original


def test_training_workloads_are_left_to_dlio(monkeypatch):
    original = dlio_main.DLIOBenchmark
    monkeypatch.setattr(dlio_main, "DLIOBenchmark", original)
    callback.choose_workflow(OmegaConf.create({"workflow": {"train": True, "checkpoint": True}}))
    assert dlio_main.DLIOBenchmark is original


def test_a_set_up_that_fails_ends_every_rank_saying_why_not_a_warning_hydra_runs_past(monkeypatch):
    """Hydra makes a callback's exception a warning and runs the job half set up (a training
    run counted no step, and one on S3 hung): the callback ends the job itself, naming it."""
    from dlio_ckpt_ext.dlio import mpi

    def broken(workload):
        raise ValueError("tensorflow.__spec__ is None")
    aborted = []
    monkeypatch.setattr(callback, "check_workload", broken)
    monkeypatch.setattr(callback, "redact_hydra_records", lambda: None)
    monkeypatch.setattr(mpi, "abort", lambda comm, message, exc=None, code=1: aborted.append((message, exc)))
    callback.CheckpointWorkloadCallback().on_job_start(OmegaConf.create(CKPT_ONLY))
    [(message, exc)] = aborted
    assert message == ("the checkpoint workload's set-up failed (dlio_ckpt_ext's hydra callback): "
                       "ValueError: tensorflow.__spec__ is None") and isinstance(exc, ValueError)
