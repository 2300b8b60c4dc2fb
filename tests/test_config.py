import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.config import load_config, parse_size
from dlio_ckpt_ext.errors import ConfigError


def err(workload, size=2):
    with pytest.raises(ConfigError) as e:
        load_config(OmegaConf.create(workload), size)
    return e.value


def test_a_read_only_run_may_read_checkpoints_an_earlier_run_wrote():
    cfg = load_config(OmegaConf.create({"checkpoint": {"num_checkpoints_write": 0, "num_checkpoints_read": 3}}), 1)
    assert cfg.checkpoint.num_checkpoints_read == 3


def test_defaults_are_valid_and_sizes_parse():
    cfg = load_config(OmegaConf.create({"streaming": {"chunk_size": "8MiB"}}), 1)
    assert cfg.chunk_size == 8 << 20
    assert parse_size("k", 4194304) == 4 << 20 and parse_size("k", "1GiB") == 1 << 30


@pytest.mark.parametrize("workload, key, allowed", [
    ({"checkpoint": {"num_checkpoint_write": 1}}, "workload.checkpoint.num_checkpoint_write",
     "num_checkpoints_write"),
    ({"streaming": {"depth": 4}}, "workload.streaming.depth", "pool_depth"),
    ({"model": {"transformer": {"hidden": 4}}}, "workload.model.transformer.hidden", "hidden_size"),
    ({"checkpoint": {"num_checkpoints_write": -1}}, "workload.checkpoint.num_checkpoints_write", ">= 0"),
    ({"checkpoint": {"num_checkpoints_write": 2, "num_checkpoints_read": 3}},
     "workload.checkpoint.num_checkpoints_read", "at most num_checkpoints_write"),
    ({"model": {"num_layers": 0}}, "workload.model.num_layers", "positive"),
    ({"model": {"transformer": {"hidden_size": -8}}}, "workload.model.transformer.hidden_size", "positive"),
    ({"streaming": {"chunk_size": "1000"}}, "workload.streaming.chunk_size", "multiple of 1 MiB"),
    ({"streaming": {"pool_depth": 1}}, "workload.streaming.pool_depth", "at least 2"),
    ({"streaming": {"concurrent_files": 2}}, "workload.streaming.concurrent_files", "more than 1 is for s3"),
    ({"checkpoint": {"async_mode": "background"}}, "workload.checkpoint.async_mode", "disabled or async"),
    ({"checkpoint": {"layout": "fsdp"}}, "workload.checkpoint.layout", "deepspeed or dcp"),
    ({"checkpoint": {"layout": "dcp"}, "model": {"parallelism": {"tensor": 2}}},
     "workload.model.parallelism.tensor", "1 with checkpoint.layout dcp"),
    ({"streaming": {"read_size": "3000KiB"}}, "workload.streaming.read_size", "a positive multiple of 1 MiB"),
    ({"streaming": {"read_parallelism": -1}}, "workload.streaming.read_parallelism",
     "0 (the storage's default) or a positive integer"),
    ({"storage": {"storage_type": "nfs"}}, "workload.storage.storage_type", "local_fs"),
    ({"model": {"parallelism": {"tensor": 4}}}, "MPI world size", "multiple of tensor*pipeline"),
    ({"model": {"parallelism": {"zero_stage": 3, "pipeline": 2}}}, "workload.model.parallelism.pipeline",
     "zero_stage 3"),
    ({"checkpoint": {"mode": "subset"}}, "workload.model.parallelism.data", "subset"),
    ({"model": {"parallelism": {"tensor": "two"}}}, "workload.model.parallelism.tensor", "Integer"),
    ({"model": {"model_datatype": "fp12"}}, "workload.model.model_datatype", "fp16"),
])
def test_bad_input_names_key_value_and_allowed(workload, key, allowed):
    e = err(workload)
    assert e.key == key
    assert allowed in str(e)
    assert str(e).startswith(f"invalid config: {key}=")


@pytest.mark.parametrize("streaming, files_at_once", [({}, 2), ({"concurrent_files": 1}, 1)])
def test_s3_uploads_two_files_at_once_by_default_and_the_memory_check_counts_both(streaming, files_at_once):
    from dlio_ckpt_ext.memory import rank_buffers
    cfg = load_config(OmegaConf.create({"streaming": streaming,
                                        "storage": {"storage_type": "s3", "storage_root": "s3://b/p"}}), 4)
    assert cfg.concurrent_files == files_at_once
    parts = {key: n for key, _, n in rank_buffers(cfg, 4)}
    # s3dlio holds max_in_flight (16) + 2 parts of 32 MiB per open upload
    assert parts["workload.storage.storage_options.max_in_flight"] == files_at_once * 18 * (32 << 20)
    local = load_config(OmegaConf.create({}), 4)
    assert local.concurrent_files == 1
