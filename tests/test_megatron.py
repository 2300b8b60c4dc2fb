"""The megatron layout (Megatron-core dist_checkpointing, torch_dist): its files
against an independent computation from the shape, and saves and loads through
the checkpointer onto a real directory, every byte verified."""
import json

import pytest

from dlio_ckpt_ext import layouts

from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob
from test_restore import SHAPE, checkpointers, load_verified

MEGATRON = layouts.get("megatron")
EIGHT_B = plan.ModelShape(32, 4096, 14336, 128256, 32, 8, "bf16", "fp32")
SEVENTY_B = plan.ModelShape(80, 8192, 28672, 128256, 64, 8, "bf16", "fp32")
SMALL = plan.ModelShape(2, 256, 512, 1024, 4, 2, "bf16", "fp32")


def par(tensor=1, pipeline=1):
    return plan.Parallelism(tensor, pipeline, 1, None, "default", "megatron")


def megatron_parameters(L, h, f, V, heads, kv, tp):
    """Every parameter Megatron allocates for a LLaMA model, the vocabulary padded to
    a multiple of 128 x TP: embedding and output layer untied, per layer the fused
    QKV with its norm, the output projection, the fused gate/up with its norm and
    the down projection, and the final norm."""
    vp = -(-V // (128 * tp)) * 128 * tp
    dkv = h // heads * kv
    return 2 * vp * h + h + L * (h + (h + 2 * dkv) * h + h * h + h + 2 * f * h + f * h)


@pytest.mark.parametrize("shape, tp, pp, world, vocab", [(EIGHT_B, 1, 1, 8, 128256), (SEVENTY_B, 4, 8, 64, 128512),
                                                         (SMALL, 2, 1, 4, 1024), (SMALL, 1, 2, 4, 1024)])
def test_files_counts_and_bytes_equal_the_shapes_14_bytes_a_parameter(shape, tp, pp, world, vocab):
    n = megatron_parameters(shape.num_layers, shape.hidden_size, shape.ffn_hidden_size, shape.vocab_size,
                            shape.num_attention_heads, shape.num_kv_heads, tp)
    assert -(-shape.vocab_size // (128 * tp)) * 128 * tp == vocab
    plans = [MEGATRON.rank_plan(shape, par(tp, pp), world, r) for r in range(world)]
    assert [f.name for p in plans for f in p.files] == [f"__{r}_0.distcp" for r in range(world)]
    assert [f.name for f in plans[0].commit_files] == [".metadata", "metadata.json"]
    assert all(not p.commit_files for p in plans[1:])
    data = sum(f.size for p in plans for f in p.files)
    # as megatron-core 0.19.2 saved it (fidelity/manifests/megatron-*): bf16 weights once (the
    # fully parallel save writes each replicated tensor once) and fp32 main parameters with
    # Adam's two moments sharded: 2 + 3 x 4 bytes a parameter, every tensor-parallel rank
    # saving its own norms' state; each tensor item wrapped by torch.save (1,577 B); the
    # objects: rank 0's common state (30,317 B), 4 linear layers' _extra_state a layer
    # (1,261 B), and per model-parallel position its RNG state and 3 optimizer objects
    metadata, config = plans[0].commit_files
    assert metadata.size % 313 == 0  # 313 B a saved item
    h, layers = shape.hidden_size, shape.num_layers
    objects = 1 + 4 * layers + 4 * tp * pp
    object_bytes = 30317 + 1261 * 4 * layers + (15449 + 1837 + 1325 + 1325) * tp * pp
    tensor_items = metadata.size // 313 - objects
    assert data == 2 * n + 12 * (n + (tp - 1) * (2 * h * layers + h)) + 1577 * tensor_items + object_bytes
    assert tensor_items > world  # a tensor item a chunk of every weight and optimizer part
    assert json.loads(config.prefix) == {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    assert config.size == len(config.prefix)
    assert MEGATRON.checkpoint_dir(1) == "iter_0000001" and MEGATRON.tracker(12) == (
        "latest_checkpointed_iteration.txt", b"12")


def test_every_rank_writes_about_the_total_over_the_world():
    """The fully parallel save: the 8B model's weights, replicated over 8 data-parallel
    ranks, spread so that no rank writes more than the average and one tensor chunk."""
    sizes = [MEGATRON.rank_plan(EIGHT_B, par(), 8, r).files[0].size for r in range(8)]
    biggest = 128256 * 4096 * 2  # the embedding, the largest chunk
    assert max(sizes) - sum(sizes) / 8 < biggest and min(sizes) > 0.9 * sum(sizes) / 8


def test_ranks_are_numbered_tensor_then_data_then_pipeline():
    """Megatron's default order (tp-cp-ep-dp-pp): at TP2 PP2 on 8 ranks, ranks 0-3 are
    the first stage (the embedding's), 4-7 the last (the output layer's)."""
    first = [MEGATRON.rank_plan(SMALL, par(2, 2), 8, r) for r in range(4)]
    last = [MEGATRON.rank_plan(SMALL, par(2, 2), 8, r) for r in range(4, 8)]
    assert [(p.tp_rank, p.dp_rank, p.pp_rank) for p in first + last] == [
        (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]


def test_impossible_shapes_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="model.parallelism.zero_stage=3; allowed: 1 with checkpoint.layout megatron"):
        MEGATRON.rank_plan(SMALL, plan.Parallelism(1, 1, 3, None, "default", "megatron"), 2, 0)
    with pytest.raises(ConfigError, match="MPI world size=6; allowed: a multiple of tensor\\*pipeline = 4"):
        MEGATRON.rank_plan(SMALL, par(2, 2), 6, 0)
    with pytest.raises(ConfigError, match="checkpoint.mode='subset'"):
        MEGATRON.rank_plan(SMALL, plan.Parallelism(1, 1, 1, 8, "subset", "megatron"), 2, 0)


def test_the_broadcast_load_reads_the_replicated_weights_once_a_group():
    """restore=framework: each rank reads every weight of its model-parallel position and
    its own optimizer part; shared (the fully parallel load), a data-parallel group reads
    each weight once, so storage serves the weights 1/DP as often."""
    world, dp = 8, 4
    p = par(2)
    job = LoadJob("framework", world, world)
    plain, shared = MEGATRON.summary(SMALL, p, job, 1 << 20), MEGATRON.summary(SMALL, p, job, 1 << 20, "broadcast")
    metadata = sum(f.size for f in MEGATRON.rank_plan(SMALL, p, world, 0).commit_files)
    weights = 2 * megatron_parameters(2, 256, 512, 1024, 4, 2, 2)  # bf16, all positions
    norms = 2 * 256 * (2 * 2 + 1)  # replicated over TP: each TP rank reads tensor rank 0's
    # a group's weight items, each wrapped by torch.save (1,577 B): per TP rank the embedding,
    # per layer qkv, proj, fc1's two halves and fc2 and the two norms, the final norm, the output
    group_weights = weights + norms + 1577 * 2 * (1 + 7 * 2 + 2)
    # every TP rank saves (and reads) its own buffer's optimizer state, its norms' included
    optimizer = 12 * (megatron_parameters(2, 256, 512, 1024, 4, 2, 2) + 256 * 5)
    assert plain["storage_bytes"] - shared["storage_bytes"] == (world - 1) * metadata + (dp - 1) * group_weights
    optimizer_read = shared["storage_bytes"] - metadata - group_weights
    assert (optimizer_read - optimizer) % 1577 == 0 and optimizer_read > optimizer
    assert plain["bytes_read"] == shared["bytes_read"] == shared["storage_bytes"] + shared["broadcast_bytes"]


@pytest.mark.parametrize("tensor, pipeline, saved, ranks", [(2, 1, 4, 4), (2, 1, 4, 2), (1, 2, 2, 4)])
def test_a_save_and_a_restore_at_the_same_and_another_world_size_verify(tmp_path, tensor, pipeline, saved, ranks):
    parallel = {"zero_stage": 1, "tensor": tensor, "pipeline": pipeline}
    writers = checkpointers(tmp_path, saved, SHAPE, parallel, layout="megatron", num_checkpoints_read=0)
    for ck in writers:  # rank 0's commit (.metadata, metadata.json, then the tracker) needs no barrier here
        ck.prepare()
        ck.save(1)
    assert writers[0].inventory([(1, 1)], saved=True)["ok"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_bytes() == b"1"
    assert sorted(p.name for p in (tmp_path / "iter_0000001").iterdir()) == sorted(
        [".metadata", "metadata.json"] + [f"__{r}_0.distcp" for r in range(saved)])
    readers = checkpointers(tmp_path, ranks, SHAPE, parallel, layout="megatron", restore="framework",
                            saved_ranks=saved, num_checkpoints_write=0, num_checkpoints_read=1)
    assert load_verified(readers) == MEGATRON.summary(readers[0].cfg.shape, readers[0].cfg.parallelism,
                                                      readers[0].job, readers[0].cfg.read_size)["bytes_read"]


def test_keep_files_false_removes_the_tracker_with_the_checkpoint(tmp_path):
    writers = checkpointers(tmp_path, 2, SHAPE, {"zero_stage": 1}, layout="megatron", num_checkpoints_read=0)
    for ck in writers:
        ck.prepare()
        ck.save(1)
    assert sum(ck.remove_written([(1, 1)]) for ck in writers) == 2 + 2 + 1  # the distcp files, rank 0's two, the tracker
    writers[0].remove_empty_dirs([(1, 1)])
    assert list(tmp_path.iterdir()) == []
