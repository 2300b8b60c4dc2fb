"""Model loads: the published safetensors shards checked with the safetensors
library itself, the loaders' read patterns, and loads through the checkpointer
onto a real directory (no DLIO)."""
import json
import os

import numpy as np
import pytest
from omegaconf import OmegaConf
from safetensors import safe_open

from dlio_ckpt_ext import layouts

from dlio_ckpt_ext.shared_plans import load_plan, plan, safetensors_plan
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.engine.content import generator
from dlio_ckpt_ext.errors import ConfigError
from test_restore import run_in_threads

SHAPE = {"num_layers": 2, "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                          "num_attention_heads": 4, "num_kv_heads": 2}}
#: small enough that the 2-layer model makes several shards
SHARD = "1MB"


def checkpointers(folder, ranks, tensor=1, pipeline=1, datatype="bf16", checkpoint=None, **model_load):
    cfg = load_config(OmegaConf.create({
        "model": {**SHAPE, "model_datatype": datatype, "parallelism": {"tensor": tensor, "pipeline": pipeline}},
        "streaming": {"chunk_size": "1MiB", "verify": True},
        "checkpoint": {"checkpoint_folder": str(folder), "layout": "safetensors", "num_checkpoints_write": 1,
                       "num_checkpoints_read": 2, **(checkpoint or {})},
        "model_load": {"max_shard_size": SHARD, **model_load}}), ranks)
    return [Checkpointer(cfg, r, ranks, ranks) for r in range(ranks)]


def publish(folder, ranks=2, datatype="bf16"):
    writers = checkpointers(folder, ranks, datatype=datatype)
    for ck in writers:
        ck.prepare()
        ck.save(1)
    for ck in writers:  # the index, once every shard is there
        ck._save_generated(ck.directory(1), ck.rank_plan(ck.rank).commit_files, None, 1)
    return writers, folder / "publish-1"


def hf_names(layers=2):
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.{i}.{n}.weight" for i in range(layers) for n in per_layer}


def test_the_safetensors_library_opens_every_shard_with_the_planned_names_shapes_and_dtypes(tmp_path):
    writers, folder = publish(tmp_path)
    shards = layouts.safetensors.published_shards(writers[0].cfg.shape, writers[0].cfg.parallelism)
    assert len(shards) > 2 and all(s.size <= 10**6 + s.data_start for s in shards)
    assert sorted(os.listdir(folder)) == sorted([s.name for s in shards] + ["model.safetensors.index.json",
                                                                            "config.json", "generation_config.json"])
    config = json.loads((folder / "config.json").read_text())  # what a loader reads first (AutoConfig)
    assert (config["hidden_size"], config["num_key_value_heads"], config["dtype"]) == (256, 2, "bfloat16")
    seen = {}
    for s in shards:
        assert os.path.getsize(folder / s.name) == s.size
        with safe_open(str(folder / s.name), "np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                seen[name] = (sl.get_dtype(), tuple(sl.get_shape()), s.name)
    assert set(seen) == hf_names()
    h, dkv = 256, 256 // 4 * 2
    assert seen["model.layers.1.self_attn.k_proj.weight"][:2] == ("BF16", (dkv, h))
    assert seen["model.layers.0.mlp.down_proj.weight"][:2] == ("BF16", (h, 512))
    assert seen["lm_head.weight"][:2] == ("BF16", (1024, h))
    # bytes: parameters x 2 + the headers
    n = plan.num_parameters(writers[0].cfg.shape)
    assert sum(s.size for s in shards) == 2 * n + sum(s.data_start for s in shards)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 2 * n, "total_parameters": n}
    assert index["weight_map"] == {name: shard for name, (_, _, shard) in seen.items()}


def test_a_tensor_read_through_the_library_is_the_regenerated_content(tmp_path):
    writers, folder = publish(tmp_path, datatype="fp16")  # numpy has no bfloat16
    ck = writers[0]
    for j, s in enumerate(layouts.safetensors.published_shards(ck.cfg.shape, ck.cfg.parallelism)):
        placed = s.tensors[-1]
        with safe_open(str(folder / s.name), "np") as f:
            got = f.get_tensor(placed.tensor.name)
        assert got.dtype == np.float16 and got.shape == placed.tensor.shape
        n = placed.end - placed.begin
        want = bytearray(n)
        content = ck.content(ck.directory(1), j % 2, s.name)
        generator(content, n, offset=s.data_start + placed.begin).fill_chunk(memoryview(want))
        assert got.tobytes() == bytes(want)


def test_shards_split_as_hugging_face_splits_them():
    tensors = safetensors_plan.hf_tensors(2, 256, 512, 1024, 4, 2)
    # the embedding (1024 x 256 x 2 = 512 KiB) is above a 400 kB limit: a shard of its own
    groups = safetensors_plan._split(tensors, 2, 400_000)
    assert groups[0] == [tensors[0]]
    for g in groups:
        assert len(g) == 1 or sum(t.elements * 2 for t in g) <= 400_000
    # a tensor above the limit is appended when met, before the shard being filled: lm_head (the
    # last tensor, as big) comes before the shard holding the final norm
    assert groups[-2] == [tensors[-1]] and groups[-1][-1].name == "model.norm.weight"
    assert sorted(t.name for g in groups for t in g) == sorted(t.name for t in tensors)
    with pytest.raises(ConfigError) as exc:
        safetensors_plan.parse_shard_size("workload.model_load.max_shard_size", "5 parsecs")
    assert "5GB" in str(exc.value)
    assert safetensors_plan.parse_shard_size("k", "5GB") == 5 * 10**9
    assert safetensors_plan.parse_shard_size("k", "4GiB") == 4 << 30


def needed_bytes(ck) -> int:
    """The bytes of the slices a rank serves with, from the tensor shapes alone (bf16)."""
    tensor = ck.cfg.parallelism.tensor
    return sum(t.elements * 2 // (tensor if t.split == "column" else 1)
               for t in safetensors_plan.hf_tensors(2, 256, 512, 1024, 4, 2))


@pytest.mark.parametrize("pattern", ["safetensors", "runai", "fastsafetensors"])
def test_each_pattern_loads_verified_into_two_replicas_of_two_ranks(tmp_path, pattern):
    publish(tmp_path)
    readers = checkpointers(tmp_path, 4, tensor=2, checkpoint={"num_checkpoints_write": 0, "saved_ranks": 2},
                            pattern=pattern)
    got = run_in_threads(readers, lambda ck: (sum(f.nbytes for f in ck.load(1)), dict(ck.last_broadcast),
                                              [(r.name, r.offset, r.length) for r in ck.reads()]))
    ck = readers[0]
    summary = layouts.summary(ck.cfg.shape, ck.cfg.parallelism, ck.job, ck.cfg.read_size)
    assert sum(storage for storage, _, _ in got) == summary["storage_bytes"]
    shards = layouts.safetensors.published_shards(ck.cfg.shape, ck.cfg.parallelism)
    model = sum(s.size for s in shards)
    for (storage, broadcast, reads), reader in zip(got, readers):
        assert reads[0][0] == "model.safetensors.index.json"  # the weight map first
        held = storage + broadcast["broadcast_bytes"]
        if pattern == "safetensors":  # the pages of its slices: at least them, less than the model
            assert needed_bytes(reader) <= held - reads[0][2] < model
            assert all(offset % 4096 == 0 for name, offset, _ in reads[1:])
        else:  # whole shards, all of them at one stage (runai: in three passes: length, header, tensors)
            assert held - reads[0][2] == model
    if pattern == "fastsafetensors":  # each file once per tensor-parallel group (2 groups), the rest broadcast
        assert summary["storage_bytes"] == 2 * (model + len(safetensors_plan.index(shards)))
        assert summary["storage_readers_per_file_max"] == 2


def test_a_load_reads_the_one_publish_again_and_again(tmp_path):
    publish(tmp_path)
    ck = checkpointers(tmp_path, 2, checkpoint={"num_checkpoints_write": 0, "num_checkpoints_read": 3,
                                                "saved_ranks": 2})[1]
    assert [ck.cfg.read_step(k) for k in (1, 2, 3)] == [1, 1, 1] and ck.cfg.steps_read() == [1]
    ck.prepare()
    assert ck.inventory([(s, 1) for s in ck.cfg.steps_read()])["ok"]
    assert sum(f.nbytes for f in ck.load(3)) == sum(r.length for r in ck.reads())


def test_a_loop_counting_a_folder_entry_a_load_sees_each_publish_once_for_every_load_of_it(tmp_path):
    """Upstream's and the fork's checkpoint loops refuse to read more checkpoints than
    the checkpoint folder lists (StreamingStorage.walk_node answers them with this)."""
    one = checkpointers(tmp_path, 1, checkpoint={"num_checkpoints_read": 3})[0].cfg
    assert one.checkpoints_as_loaded(["publish-1", "stray"]) == ["publish-1"] * 3
    assert one.checkpoints_as_loaded(["stray"]) == []
    two = checkpointers(tmp_path, 1, checkpoint={"num_checkpoints_write": 2, "num_checkpoints_read": 3})[0].cfg
    assert two.checkpoints_as_loaded(["publish-2", "publish-1"]) == ["publish-1", "publish-2", "publish-1"]
    assert two.checkpoints_as_loaded(["publish-1"]) == ["publish-1", "publish-1"]
    restore = load_config(OmegaConf.create({"model": SHAPE, "checkpoint": {"num_checkpoints_read": 1}}), 1)
    assert restore.checkpoints_as_loaded(["global_epoch1_step1", "x"]) == ["global_epoch1_step1", "x"]


@pytest.mark.parametrize("layout, storage_type, read_seen", [
    ("safetensors", "s3", 1), ("safetensors", "local_fs", 1), ("deepspeed", "local_fs", None)])
def test_dlio_validates_a_model_load_with_no_more_loads_than_saves_and_gets_its_settings_back(
        monkeypatch, layout, storage_type, read_seen):
    from types import SimpleNamespace

    from dlio_benchmark.common.enumerations import StorageType

    from dlio_ckpt_ext.config import MECHANISM_CLASS
    from dlio_ckpt_ext.dlio import context, storage
    seen = []

    def dlio_validate(args):  # upstream's (e1919d7) and the fork's (f6796ed) checks that concern us
        if args.storage_type == StorageType.S3:
            raise Exception("s3torchconnector is required")
        if args.num_checkpoints_write > 0 and args.num_checkpoints_read > args.num_checkpoints_write:
            raise Exception(f"Number of checkpoints to read {args.num_checkpoints_read} cannot be larger "
                            f"than number of checkpoints to write {args.num_checkpoints_write}")
        seen.append(args.num_checkpoints_read)

    monkeypatch.setattr(context, "_workload", OmegaConf.create({"checkpoint": {"layout": layout}}))
    args = SimpleNamespace(checkpoint_mechanism_classname=MECHANISM_CLASS, storage_type=StorageType(storage_type),
                           num_checkpoints_write=1, num_checkpoints_read=3)
    validate = storage.validating_as_ours(dlio_validate)
    if read_seen is None:  # a restore reading more checkpoints than it saved stays refused
        with pytest.raises(Exception, match="read 3 cannot be larger than number of checkpoints to write 1"):
            validate(args)
    else:
        validate(args)
        assert seen == [read_seen]
    assert (args.num_checkpoints_read, args.storage_type) == (3, StorageType(storage_type))
    args.checkpoint_mechanism_classname = "dlio_benchmark.checkpointing.pytorch_checkpointing.PyTorchCheckpointing"
    with pytest.raises(Exception):  # another mechanism's workload: DLIO's checks as they are
        validate(args)


@pytest.mark.parametrize("model_load, checkpoint, key, words", [
    ({"pattern": "pytorch"}, {}, "workload.model_load.pattern", "safetensors, runai, fastsafetensors"),
    ({}, {"restore": "framework"}, "workload.checkpoint.restore", "own with checkpoint.layout safetensors"),
    ({}, {"share": "broadcast"}, "workload.checkpoint.share", "model_load.pattern"),
    ({}, {"async_mode": "async"}, "workload.checkpoint.async_mode", "disabled with checkpoint.layout safetensors"),
    ({"max_shard_size": "big"}, {}, "workload.model_load.max_shard_size", "'5GB'"),
    ({"read_size": "3000"}, {}, "workload.model_load.read_size", "multiple of 1 MiB"),
])
def test_model_load_settings_no_load_can_have_are_refused_under_their_key(tmp_path, model_load, checkpoint, key,
                                                                           words):
    with pytest.raises(ConfigError) as exc:
        checkpointers(tmp_path, 2, checkpoint=checkpoint, **model_load)
    assert exc.value.key == key and words in str(exc.value), str(exc.value)


def test_runai_buffers_are_the_smallest_that_stream_the_tensors_in_18():
    assert layouts.safetensors.runai_buffer_bytes([10] * 36) == 20  # exactly 2 tensors a buffer
    assert layouts.safetensors.runai_buffer_bytes([10] * 37) == 30  # 20 would take 19 buffers
    assert layouts.safetensors.runai_buffer_bytes([30, 10, 10]) == 30  # never below the largest tensor


@pytest.mark.parametrize("object_store, most_workers", [(True, 8), (False, 16)])
def test_runai_reads_each_tensor_once_cut_where_its_buffers_and_workers_end(object_store, most_workers):
    """runai-model-streamer's tensors pass: whole tensors packed in order into its 18
    buffers, each split among its workers (8 on an object store, 16 threads of its sync
    reader on a file system) in whole read sizes (the first takes the rest), a worker's
    edge inside a file ending a request."""
    read = 64 << 10
    cfg = checkpointers("x", 1, pattern="runai")[0].cfg
    shards = layouts.safetensors.published_shards(cfg.shape, cfg.parallelism)
    job = load_plan.LoadJob("runai", 1, 1, read_size=read, object_store=object_store)
    reads = layouts.rank_reads(cfg.shape, cfg.parallelism, job, 0)
    n = len(shards)
    assert [(r.offset, r.length) for r in reads[1:1 + 2 * n]] == \
        [(0, 8)] * n + [(8, s.data_start - 8) for s in shards]  # every length, then every header
    data = reads[1 + 2 * n:]
    for s in shards:  # the tensors of each file exactly once, in order
        mine = [(r.offset, r.length) for r in data if r.name == s.name]
        assert mine[0][0] == s.data_start and sum(length for _, length in mine) == s.size - s.data_start
        assert all(a + la == b for (a, la), (b, _) in zip(mine, mine[1:]))
    tensors = [t.end - t.begin for s in shards for t in s.tensors]
    buffer = layouts.safetensors.runai_buffer_bytes(tensors)
    assert max(tensors) <= buffer and sum(tensors) <= 18 * buffer
    cuts = [c for r in data for c in r.cuts]
    assert all(r.offset < c < r.offset + r.length for r in data for c in r.cuts)
    # the first buffer, packed as the ring packs it, split among its workers: the
    # first worker's edge is where a request of the first shard ends
    used = 0
    for size in tensors:
        if used + size > buffer:
            break
        used += size
    workers = max(1, min(used // read, most_workers))
    base = used // read // workers * read
    edge = shards[0].data_start + base + (used - workers * base)
    first = [r for r in data if r.name == shards[0].name]
    assert workers > 1 and any(edge in r.cuts for r in first) or edge % read == 0
    assert sum(load_plan.requests(r, read) for r in data) == sum(
        -(-(r.offset + r.length) // read) - r.offset // read for r in data) + sum(1 for c in cuts if c % read)
