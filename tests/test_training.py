"""DLIO's training loop as our checkpoints see it, without starting DLIO: the
dataset walk through our storage class, the names of a training loop's saves,
the loop's accounting and the TRAINING figures from synthetic parts."""
import importlib.util
import logging
import types

import pytest
from dlio_benchmark.common.enumerations import MetadataType
from omegaconf import OmegaConf

from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.dlio import training
from dlio_ckpt_ext.results import training as training_report
from dlio_ckpt_ext.dlio.callback import check_dataset
from dlio_ckpt_ext.dlio.storage import StreamingStorage, matching_keys
from dlio_ckpt_ext.errors import ConfigError


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    """DLIO's dataset layout: train/ with 2 subfolders of npz files, valid/ flat.
    DLIO's DataStorage keeps its arguments, which would need MPI initialised in
    this process (whose environment the e2e tests' mpirun would inherit)."""
    from dlio_benchmark.storage import storage_handler
    args = types.SimpleNamespace(logger=logging.getLogger("dlio"))  # the fork's DataStorage keeps its logger
    monkeypatch.setattr(storage_handler.ConfigArguments, "get_instance", staticmethod(lambda: args))
    for i in range(4):
        sub = tmp_path / "data" / "train" / str(i % 2)
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"img_{i}_of_4.npz").write_bytes(b"x" * (i + 1))
    (tmp_path / "data" / "valid").mkdir()
    (tmp_path / "data" / "valid" / "img_0_of_1.npz").write_bytes(b"v")
    return tmp_path


def test_dlio_walks_its_dataset_through_our_posix_storage(dataset):
    storage = StreamingStorage("local_fs", str(dataset), {}, str(dataset / "data"))
    data = str(dataset / "data")
    assert storage.walk_node(f"{data}/train") == ["0", "1"]
    assert storage.get_node(f"{data}/train/0") == MetadataType.DIRECTORY
    assert storage.get_node(f"{data}/train/0/img_0_of_4.npz") == MetadataType.FILE  # was NotADirectoryError
    assert storage.get_node(f"{data}/train/nothing") is None
    assert storage.walk_node(f"{data}/train/0/img_0_of_4.npz") == []
    # DLIO's subfolder pattern: every file one level down, full paths
    assert storage.walk_node(f"{data}/train/*/*.npz", use_pattern=True) == sorted(
        str(p) for p in (dataset / "data" / "train").glob("*/*.npz"))
    assert storage.walk_node(f"{data}/valid/*.npz", use_pattern=True) == [f"{data}/valid/img_0_of_1.npz"]
    # relative ids are below storage_root, as DLIO's own FileStorage has them
    assert storage.get_uri("data/train") == f"{data}/train"
    assert storage.get_node("data/valid/img_0_of_1.npz") == MetadataType.FILE


def test_only_dlio_s_dataset_folder_is_deleted_whole(dataset):
    storage = StreamingStorage("local_fs", str(dataset), {}, str(dataset / "data"))
    assert storage.delete_node(str(dataset / "data" / "train" / "0")) is False  # another tree: never
    assert (dataset / "data" / "train" / "0").is_dir()
    assert storage.delete_node(str(dataset / "data" / "valid" / "img_0_of_1.npz")) is True
    assert storage.delete_node(str(dataset / "data")) is True  # DLIO's keep_files=False
    assert not (dataset / "data").exists()


class Listing:
    """A backend's listing of an object store: keys below the root and their sizes."""

    def __init__(self, keys):
        self.keys, self.listed = keys, []

    def list_sizes(self, directory):
        self.listed.append(directory)
        return {k: 1 for k in self.keys if k.startswith(directory + "/")}


def test_patterns_on_an_object_store_match_one_component_each_with_one_listing():
    store = Listing(["d/train/0/a.npz", "d/train/1/b.npz", "d/train/1/deep/c.npz", "d/train/x.npz",
                     "d/train/1/b.npy"])
    assert matching_keys(store, "d/train/*/*.npz") == ["d/train/0/a.npz", "d/train/1/b.npz"]
    assert store.listed == ["d/train"]


def test_a_training_loop_s_saves_are_named_as_each_framework_names_them():
    deepspeed, megatron = layouts.get("deepspeed"), layouts.get("megatron")
    # DLIO's own names carry the epoch: its step restarts every epoch
    assert training.checkpoint_id(deepspeed, 2, 4, 12) == (4, 2)
    assert deepspeed.checkpoint_dir(*training.checkpoint_id(deepspeed, 2, 4, 12)) == "global_epoch2_step4"
    # Megatron (and DCP, Orbax) number checkpoints by the training iteration
    assert training.checkpoint_id(megatron, 2, 4, 12) == (12, 1)
    assert megatron.checkpoint_dir(12) == "iter_0000012"
    assert training.checkpoint_id(megatron, 1, 4, 0) == (4, 1)  # an untimed loop: DLIO's step


def test_the_loop_s_batches_are_classified_against_the_i_o_windows_known_when_they_arrive():
    loop, busy = training.TrainingLoop(), training.IoWindows()
    loop.loaded(1, 0.0, 0.1, 100, busy)  # an epoch's first batch: the pipeline filling, left out
    loop.processed(0.2, 0.05)
    loop.loaded(1, 0.2, 0.3, 100, busy)
    loop.processed(0.4, 0.05)
    busy.open_since = 0.45  # a persist starts in the background after step 2's save
    assert loop.saved(0.45) == {"step_s": pytest.approx(0.25), "compute_s": 0.05}
    loop.loaded(1, 0.45, 0.65, 100, busy)
    loop.processed(0.7, 0.05)
    busy.closed.append((0.45, 0.66))
    busy.open_since = None
    loop.loaded(1, 0.7, 0.72, 100, busy)  # after the persist: clear
    loop.processed(0.8, 0.05)
    assert loop.steps == 4 and loop.compute_s == pytest.approx(0.2)
    assert (loop.loads["during_save"].batches, loop.loads["no_save"].batches) == (1, 2)
    assert loop.loads["during_save"].seconds == pytest.approx(0.2)
    assert loop.plain_steps == 3 and loop.plain_step_s == pytest.approx(0.2 + 0.25 + 0.1)


def test_training_figures_from_every_rank_s_part():
    def part(offset, during, clear):
        loop = training.TrainingLoop(steps=10, compute_s=1.0, first_start=0.0, last_end=4.0, plain_steps=8,
                                     plain_step_s=1.6)
        loop.loads["during_save"].nbytes, loop.loads["during_save"].seconds, loop.loads["during_save"].batches = \
            during
        loop.loads["no_save"].nbytes, loop.loads["no_save"].seconds, loop.loads["no_save"].batches = clear
        saves = [{"step": 5, "epoch": 1, "iteration": 5, "start": 1.0 + offset, "end": 1.5 + offset, "step_s": 0.7,
                  "compute_s": 0.1},
                 {"step": 10, "epoch": 1, "iteration": 10, "start": 3.0, "end": 3.2 + offset, "step_s": 0.4 + offset,
                  "compute_s": 0.1}]
        return training_report.rank_part(loop, saves)

    gib = 1 << 30
    parts = [part(0.0, (gib, 2.0, 4), (gib, 1.0, 4)), part(0.1, (gib, 2.0, 4), (3 * gib, 3.0, 12))]
    merged = training_report.merge(*parts)
    # MPI's reduction may merge in any order and grouping
    assert training_report.merge(parts[1], parts[0]) == merged
    three = part(0.05, (0, 0.0, 0), (0, 0.0, 0))
    assert training_report.merge(training_report.merge(parts[0], parts[1]), three) == \
        training_report.merge(parts[0], training_report.merge(parts[1], three))
    s = training_report.training_summary(merged, {"au_mean_pct": 80.0}, "async")
    assert s["ranks"] == 2 and s["steps_per_rank"] == 10 and s["step_mean_s"] == pytest.approx(0.4)
    # a checkpoint's stall: first rank's start to last rank's return
    assert s["checkpoint_stall_s"] == pytest.approx([0.6, 0.3])
    assert s["checkpoint_stall_mean_s"] == pytest.approx(0.45)
    assert s["checkpoints"][1]["saving_step_s"] == pytest.approx(0.5)
    assert s["checkpoints"][1]["beyond_compute_s"] == pytest.approx(0.4)
    assert s["plain_step_s"] == pytest.approx(0.2)
    assert s["au_with_checkpoints_pct"] == pytest.approx(25.0)  # 1 s of computation in 4 s
    assert s["data_loader"]["during_save"]["gib_s_per_rank"] == pytest.approx(0.5)
    assert s["data_loader"]["no_save"]["gib_s_per_rank"] == pytest.approx(1.0)
    assert s["loader_during_save_ratio"] == pytest.approx(0.5)
    text = "\n".join(training_report.training_lines(s))
    assert "80.00 %" in text and "0.500x" in text and "saves async" in text


#: the framework whose loader this environment has (TensorFlow on DLIO 2.0.0, torch on upstream and the fork)
INSTALLED = "tensorflow" if importlib.util.find_spec("tensorflow") else "pytorch"


def _workload(**kw):
    base = {"workflow": {"train": True, "generate_data": False}, "framework": INSTALLED,
            "dataset": {"data_folder": "data/"}}
    base.update(kw)
    return OmegaConf.create(base)


def test_a_dataset_an_object_store_cannot_hold_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"workload\.dataset\.data_folder=.*absolute path on a file system"):
        check_dataset(_workload(), "s3")
    check_dataset(_workload(dataset={"data_folder": "/mnt/data"}), "s3")
    check_dataset(_workload(), "local_fs")
    check_dataset(_workload(workflow={"train": False, "generate_data": False}), "s3")  # no dataset used


@pytest.mark.parametrize("framework,module,other,other_module", [("pytorch", "torch", "tensorflow", "tensorflow"),
                                                                  ("tensorflow", "tensorflow", "pytorch", "torch")])
def test_a_loader_whose_framework_is_missing_is_refused_with_the_way_that_works(monkeypatch, framework, module,
                                                                               other, other_module):
    """DLIO 2.0.0's environment has TensorFlow and no torch, upstream's torch and no TensorFlow."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == module else object() if name == other_module else real(name, *a))
    with pytest.raises(ConfigError, match=rf"workload\.framework='?{framework}'?; allowed: {other} \(with "
                                          rf"\+\+workload\.reader\.data_loader={other}\).*needs {module}"):
        check_dataset(_workload(framework=framework), "local_fs")
    check_dataset(_workload(framework=other), "local_fs")


def test_dlio_s_checkpoint_sizing_by_model_size_stays_refused_naming_the_key():
    """unet3d's and the old megatron_deepspeed's checkpoint.model_size: our
    mechanism sizes a checkpoint from workload.model, and says so."""
    with pytest.raises(ConfigError, match=r"workload\.checkpoint\.model_size=10240; allowed: one of the keys"):
        load_config(OmegaConf.create({"checkpoint": {"model_size": 10240, "checkpoint_folder": "c"}}), 1)


def test_a_training_run_s_saves_come_from_its_loop_not_num_checkpoints_write():
    train = {"workflow": {"train": True}, "train": {"computation_time": 0.5},
             "checkpoint": {"checkpoint_folder": "c", "num_checkpoints_write": 1, "steps_between_checkpoints": 4}}
    cfg = load_config(OmegaConf.create(train), 2)
    assert cfg.trains and cfg.steps_saved() == [] and cfg.training_s == 2.0
    # tiers: the loop's saves, whatever num_checkpoints_write says
    tiered = {**train, "tiers": {"local_root": "/tmp/local-tier", "persistent_every": 5},
              "checkpoint": {**train["checkpoint"], "num_checkpoints_read": 0}}
    assert load_config(OmegaConf.create(tiered), 2).persistent_interval_s == 10.0
    with pytest.raises(ConfigError, match=r"workload\.workflow\.train=True; allowed: False with checkpoint\.layout"):
        load_config(OmegaConf.create({**train, "checkpoint": {**train["checkpoint"], "layout": "safetensors"}}), 2)
