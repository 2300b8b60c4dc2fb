import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.config import DEFAULT_CHUNK_SIZE, load_config, parse_size
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
    from dlio_ckpt_ext.checkpoint.memory import rank_buffers
    cfg = load_config(OmegaConf.create({"streaming": streaming,
                                        "storage": {"storage_type": "s3", "storage_root": "s3://b/p"}}), 4)
    assert cfg.concurrent_files == files_at_once
    parts = {key: n for key, _, n in rank_buffers(cfg, 4)}
    # s3dlio holds max_in_flight (16) + 2 parts of 16 MiB per open upload
    assert parts["workload.storage.storage_options.max_in_flight"] == files_at_once * 18 * (16 << 20)
    local = load_config(OmegaConf.create({}), 4)
    assert local.concurrent_files == 1


@pytest.mark.parametrize("storage, chunk", [
    ({}, 32 << 20),
    ({"storage_type": "s3", "storage_root": "s3://b/p"}, 16 << 20),
    ({"storage_type": "s3", "storage_root": "s3://b/p", "storage_options": {"part_size": "24MiB"}}, 24 << 20),
    ({"storage_type": "direct_fs", "storage_root": "/tmp"}, 32 << 20),
])
def test_chunk_size_auto_is_the_part_size_on_s3_and_32_mib_elsewhere(storage, chunk):
    """Under 32 MiB on S3: glibc maps an allocation that size fresh each time (a
    page fault per 4 KiB) and s3dlio allocates each chunk it lends."""
    from dlio_ckpt_ext.storage.objstore import FRESH_PAGES_FROM, ObjectOptions, PAYLOAD_SIGNING
    assert load_config(OmegaConf.create({"storage": storage}), 1).chunk_size == chunk
    assert parse_size("p", ObjectOptions().part_size) == DEFAULT_CHUNK_SIZE["s3"] < FRESH_PAGES_FROM
    assert ObjectOptions().payload_signing == PAYLOAD_SIGNING[0] == "unsigned"


# MLCommons' DLIO fork's storage keys: honoured with the same meaning, or refused by name
@pytest.mark.parametrize("storage_type, root, options, key, allowed", [
    ("local_fs", "/tmp", {"storage_library": "s3dlio"}, "storage_library",
     "unset with storage_type local_fs (it is MLCommons' DLIO fork's switch for storage_type direct_fs, or s3)"),
    ("local_fs", "/tmp", {"uri_scheme": "direct"}, "uri_scheme", "unset with storage_type local_fs"),
    ("direct_fs", "/tmp", {"storage_library": "minio"}, "storage_library", "s3dlio (or unset) with storage_type "
                                                                          "direct_fs"),
    ("direct_fs", "/tmp", {"uri_scheme": "file"}, "uri_scheme", "direct (or unset) with storage_type direct_fs"),
    ("direct_fs", "/tmp", {"write_mode": "buffered"}, "write_mode",
     "direct with storage_type direct_fs (O_DIRECT both ways); for buffered I/O use storage_type local_fs"),
    ("direct_fs", "/tmp", {"read_mode": "buffered"}, "read_mode", "direct with storage_type direct_fs"),
    ("s3", "s3://b/p", {"storage_library": "boto"}, "storage_library",
     "s3dlio, s3torchconnector, minio, msc, tensorstore, framework"),
    ("s3", "s3://b/p", {"uri_scheme": "gs"}, "uri_scheme", "s3, file, direct"),
    ("s3", "s3://b/p", {"uri_scheme": "file"}, "uri_scheme", "s3 (the scheme of storage_root s3://b/p), or unset"),
])
def test_the_forks_storage_keys_are_refused_where_they_mean_nothing(storage_type, root, options, key, allowed):
    from dlio_ckpt_ext.storage import open_backend
    with pytest.raises(ConfigError) as e:
        open_backend(storage_type, root, options)
    assert e.value.key == f"workload.storage.storage_options.{key}"
    assert str(e.value).startswith(f"invalid config: workload.storage.storage_options.{key}={options.get(key)!r}")
    assert allowed in str(e.value)


def test_direct_fs_is_o_direct_posix_and_the_forks_root_forms_are_understood(tmp_path):
    from dlio_ckpt_ext.storage import open_backend
    backend = open_backend("direct_fs", f"direct://{tmp_path}",
                           {"storage_library": "s3dlio", "uri_scheme": "direct"})
    described = backend.describe()
    assert (described["storage_type"], described["root"]) == ("direct_fs", str(tmp_path))
    assert (described["write_mode"], described["read_mode"]) == ("direct", "direct")
    assert backend.write_cache_method.startswith("O_DIRECT writes") and backend.read_cache_method == "O_DIRECT reads"
    # mlpstorage passes the bucket and the scheme apart
    s3 = open_backend("s3", "bucket/prefix", {"uri_scheme": "s3", "storage_library": "s3dlio"})
    assert s3.root == "s3://bucket/prefix"
    assert open_backend("s3", str(tmp_path), {"uri_scheme": "file"}).root == f"file://{tmp_path}"


def test_a_payload_signing_nobody_knows_is_refused_naming_the_key():
    from dlio_ckpt_ext.config import structured
    from dlio_ckpt_ext.errors import ConfigError
    from dlio_ckpt_ext.storage.objstore import ObjectOptions
    with pytest.raises(ConfigError) as e:
        structured(ObjectOptions, {"payload_signing": "md5"}, "workload.storage.storage_options.")
    assert str(e.value) == ("invalid config: workload.storage.storage_options.payload_signing='md5'; allowed: "
                            "unsigned or sha256")


@pytest.mark.parametrize("root", ["s3://", "s3:///", "az://", "gs://", "file://", "direct://"])
def test_a_storage_root_uri_without_a_name_is_refused_as_typed(root):
    e = err({"storage": {"storage_type": "s3", "storage_root": root}})
    assert e.key == "workload.storage.storage_root" and e.value == root
    assert str(e).startswith(f"invalid config: workload.storage.storage_root={root!r}; allowed: a "
                             f"{root.split(':')[0]}:// URI that names its bucket")


@pytest.mark.parametrize("part, allowed", [
    ("1KiB", "at least 5MiB (the S3 minimum part size)"),
    (4 << 20, "at least 5MiB (the S3 minimum part size)"),
    ("5000000000000x", "a byte count such as"),
    ("5242881", "a multiple of 1 MiB (1048576) while workload.streaming.chunk_size is auto"),
])
def test_an_s3_part_size_is_refused_under_its_own_key_as_typed(part, allowed):
    e = err({"storage": {"storage_type": "s3", "storage_root": "s3://b/p", "storage_options": {"part_size": part}}})
    assert (e.key, e.value) == ("workload.storage.storage_options.part_size", part)
    assert allowed in e.allowed


def test_the_backends_own_check_of_the_part_size_names_the_key_as_typed():
    from dlio_ckpt_ext.storage.objstore import ObjectOptions
    with pytest.raises(ConfigError) as e:
        ObjectOptions(part_size="4MiB").validate("workload.storage.storage_options.")
    assert str(e.value) == ("invalid config: workload.storage.storage_options.part_size='4MiB'; allowed: at least "
                            "5MiB (the S3 minimum part size)")
