"""The orbax layout (Orbax OCDBT, zarr3 + zstd, as MaxText writes it): its files
against an independent computation from the shape, and saves (into the
temporary folder, renamed at the commit) and loads through the checkpointer
onto a real directory, every byte verified."""
import json
import re
from pathlib import Path

import pytest

from dlio_ckpt_ext import layouts

from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.layouts import orbax
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob
from test_restore import SHAPE, checkpointers, load_verified, run_in_threads

ORBAX = layouts.get("orbax")
SMALL = plan.ModelShape(2, 256, 512, 1024, 4, 2, "fp32", "fp32")
EIGHT_B = plan.ModelShape(32, 4096, 14336, 128256, 32, 8, "fp32", "fp32")
HEX = re.compile(r"^items/ocdbt\.process_(\d+)/d/[0-9a-f]{32}$")


def par(replicas=None):
    return plan.Parallelism(1, 1, 0, None, "default", "orbax", replicas=replicas or 1)


def maxtext_arrays(L, h, f, V, heads, kv):
    """(elements, FSDP-sharded) of MaxText's LLaMA parameters, layers stacked: the
    embedding, per layer the two norm scales, q, k, v, out and the three MLP kernels,
    the final norm and the unembedding."""
    hd = h // heads
    return [(V * h, True), (h * L, False), (h * L * heads * hd, True), (h * L * kv * hd, True),
            (h * L * kv * hd, True), (heads * L * hd * h, True), (h * L, False), (h * L * f, True),
            (h * L * f, True), (f * L * h, True), (h, False), (h * V, True)]


def stored(raw_bytes, ratio):
    """zstd's output at the measured ratio and the zarr3 shard's 20-byte index."""
    return -(-raw_bytes * round(ratio * 1e6) // 10**6) + 20


@pytest.mark.parametrize("world, replicas", [(4, None), (4, 2), (2, None)])
def test_each_process_writes_its_shards_compressed_and_the_totals_equal_the_shapes(world, replicas):
    arrays = maxtext_arrays(2, 256, 512, 1024, 4, 2)
    assert sum(n for n, _ in arrays) == plan.num_parameters(SMALL)
    fsdp, r = world // (replicas or 1), replicas or 1
    plans = [ORBAX.rank_plan(SMALL, par(replicas), world, rank) for rank in range(world)]
    for rank, p in enumerate(plans):
        data = [f for f in p.files if HEX.match(f.name) and f.kind == "state"]
        tiny = [f.size for f in p.files if HEX.match(f.name) and f.kind != "state"]
        # process 0's first commits hold the arrays' zarr.json entries; then every process's data
        # commits, each a file padded to 4 KiB, the first cut early as TensorStore's first flush
        assert tiny == ([273, 700, 700] if rank == 0 else [])
        assert len(data) == (3 if rank == 0 else 2) and all(HEX.match(f.name).group(1) == str(rank) for f in data)
        assert all(f.size % 4096 == 0 for f in data) and data[0].size < data[-1].size
        # every array sharded over FSDP; each shard's R copies written as R slices (the
        # replica-parallel save); a replicated norm sliced over every process
        want = entries = inline = 0
        for state in ("params", "mu", "nu"):
            ratio = orbax.ZSTD_STORED[(state, 4)]
            for n, sharded in arrays:
                piece = n // fsdp // r if sharded else n // world
                size = stored(4 * piece, ratio)
                entries += 1
                if size > 1024:
                    want += size
                else:
                    inline += 4 * piece
        # the chunks, then each file's B-tree node so far (at most 93 B an entry and the inline values)
        assert want <= sum(f.size for f in data) <= want + len(data) * (93 * entries + inline + 4096)
        # each commit rewrites the process's manifest through a lock file: 94 B and 42 a version
        manifests = [f for f in p.files if f.name == f"items/ocdbt.process_{rank}/manifest.ocdbt"]
        assert [(f.size, f.tmp_suffix) for f in manifests] == [(94 + 42 * v, ".__lock")
                                                              for v in range(1, len(tiny) + len(data) + 1)]
        assert f"items/array_metadatas/process_{rank}" in {f.name for f in p.files}
        assert ("items/_sharding" in {f.name for f in p.files}) == (rank == 0)
    assert [f.name for f in plans[0].commit_files] == [
        plans[0].commit_files[0].name, "items/manifest.ocdbt", "items/_METADATA", "items/commit_success.txt",
        "_CHECKPOINT_METADATA", "commit_success.txt"]
    assert all(not p.commit_files for p in plans[1:])
    metadata = json.loads(plans[0].commit_files[2].prefix)
    # 12 arrays of params, mu and nu; the step and two counts; opt_state.1 (None)
    assert metadata["use_ocdbt"] and metadata["use_zarr3"] and len(metadata["tree_metadata"]) == 3 * 12 + 3 + 1


def test_the_8b_is_12_bytes_a_parameter_before_zstd_and_its_data_files_roll_over_at_2_gib():
    n = plan.num_parameters(EIGHT_B)
    files = [f for r in range(8) for f in ORBAX.rank_plan(EIGHT_B, par(), 8, r).files if HEX.match(f.name)]
    total = sum(f.size for f in files)
    assert 0.90 * 12 * n < total < 0.92 * 12 * n  # fp32 params, mu and nu: zstd keeps 87-93% of each
    biggest_chunk = stored(4096 // 8 * 32 * 14336 * 4, orbax.ZSTD_STORED[("params", 4)])
    per_rank = {}
    for f in files:
        if f.kind == "state":
            per_rank.setdefault(HEX.match(f.name).group(1), []).append(f.size)
    for sizes in per_rank.values():
        # a file closes once it reaches the target (at most one chunk and its B-tree over), or
        # at a commit: the first flushes (two on process 0, one elsewhere) cut files short
        assert all(0 < s < (2 << 30) + biggest_chunk + (1 << 20) for s in sizes)
        assert any(s >= 2 << 30 for s in sizes) and len(sizes) <= -(-sum(sizes) // (2 << 30)) + 2


@pytest.mark.parametrize("state, itemsize", sorted(orbax.ZSTD_STORED))
def test_the_stored_ratios_are_what_zstd_makes_of_such_tensors(state, itemsize):
    """The layout's ratios against zstd level 3 itself, on fresh tensors of each state
    (another seed and size than bench/zstd_ratio.py's recorded run)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from zstd_ratio import stored_ratio
    assert abs(stored_ratio(state, itemsize, 8 << 20, seed=7) - orbax.ZSTD_STORED[(state, itemsize)]) < 0.005


def test_impossible_meshes_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="MPI world size=3; allowed: a world whose FSDP degree \\(3: 1 devices a "
                                          "rank\\) divides hidden_size 256"):
        ORBAX.rank_plan(SMALL, par(), 3, 0)
    with pytest.raises(ConfigError, match="model.parallelism.tensor=2"):
        ORBAX.rank_plan(SMALL, plan.Parallelism(2, 1, 0, None, "default", "orbax"), 2, 0)
    with pytest.raises(ConfigError, match="MPI world size=4; allowed: a world whose devices \\(1 a rank\\) are a "
                                          "multiple of checkpoint.replicas = 3"):
        ORBAX.rank_plan(SMALL, par(3), 4, 0)


def test_the_single_replica_restore_reads_each_chunk_once_from_the_first_replica():
    """Two replicas of 2 FSDP processes: restored plainly every replica reads its shards;
    shared (replica_axis_index), storage serves each chunk once, read by replica 0."""
    job = LoadJob("framework", 4, 4)
    plain, shared = ORBAX.summary(SMALL, par(2), job, 1 << 20), ORBAX.summary(SMALL, par(2), job, 1 << 20, "broadcast")
    metadata = sum(f.size for f in ORBAX.rank_plan(SMALL, par(2), 4, 0).commit_files
                   if f.name in ("_CHECKPOINT_METADATA", "items/_METADATA", "items/manifest.ocdbt")
                   or f.name.startswith("items/d/"))
    chunks = plain["storage_bytes"] - 4 * metadata
    assert shared["storage_bytes"] == metadata + chunks // 2
    for rank in range(4):
        for r in ORBAX.rank_reads(SMALL, par(2), job, rank):
            if HEX.match(r.name):
                assert ORBAX.read_owner(SMALL, par(2), job, rank, r, ()) in (0, 1)  # the first replica's


def save(folder, ranks, parallelism, **checkpoint):
    writers = checkpointers(folder, ranks, SHAPE, parallelism, layout="orbax", num_checkpoints_read=0,
                            **checkpoint)
    for ck in reversed(writers):  # rank 0 last: its commit renames the temporary folder
        ck.prepare()
        ck.save(1)
    return writers


@pytest.mark.parametrize("replicas, saved, ranks", [(None, 4, 4), (2, 4, 4), (None, 4, 2), (None, 2, 4)])
def test_a_save_renamed_at_its_commit_and_restores_at_the_same_and_another_world_size_verify(
        tmp_path, replicas, saved, ranks):
    parallel = {"zero_stage": 0}
    writers = save(tmp_path, saved, parallel, replicas=replicas or 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # no temporary folder left
    assert writers[0].inventory([(1, 1)])["ok"]
    assert (tmp_path / "1" / "commit_success.txt").is_file() and (tmp_path / "1" / "items" / "_METADATA").is_file()
    readers = checkpointers(tmp_path, ranks, SHAPE, parallel, layout="orbax", restore="framework",
                            saved_ranks=saved, num_checkpoints_write=0, num_checkpoints_read=1, replicas=replicas or 1)
    assert load_verified(readers) == ORBAX.summary(readers[0].cfg.shape, readers[0].cfg.parallelism,
                                                   readers[0].job, readers[0].cfg.read_size)["bytes_read"]


def test_the_shared_restore_reads_each_chunk_once_and_every_rank_gets_its_bytes(tmp_path):
    parallel = {"zero_stage": 0}
    save(tmp_path, 4, parallel, replicas=2)
    readers = checkpointers(tmp_path, 4, SHAPE, parallel, layout="orbax", restore="framework",
                            num_checkpoints_write=0, num_checkpoints_read=1, share="broadcast", replicas=2)
    got = run_in_threads(readers, lambda ck: (sum(f.nbytes for f in ck.load(1)), dict(ck.last_broadcast),
                                              sum(r.length for r in dict.fromkeys(ck.reads()))))
    ck = readers[0]
    shared = ORBAX.summary(ck.cfg.shape, ck.cfg.parallelism, ck.job, ck.cfg.read_size, "broadcast")
    assert sum(s for s, _, _ in got) == shared["storage_bytes"] < shared["bytes_read"]
    assert all(s + b["broadcast_bytes"] == wanted for s, b, wanted in got)


def test_a_second_run_cannot_rename_onto_the_step_the_first_left(tmp_path):
    save(tmp_path, 2, {"zero_stage": 0})
    again = checkpointers(tmp_path, 2, SHAPE, {"zero_stage": 0}, layout="orbax", num_checkpoints_read=0)
    with pytest.raises(StorageError, match=f"{tmp_path}/1 holds a checkpoint: Orbax .* commits step 1 by renaming "
                                           "its temporary folder to it; remove it or choose another checkpoint_folder"):
        again[0].prepare()


@pytest.mark.parametrize("replicas, ranks, saved", [(None, 4, 4), (2, 4, 4), (None, 2, 4), (None, 4, 2), (2, 8, 4)])
def test_the_readers_of_a_chunk_are_exactly_the_ranks_whose_reads_hold_it(replicas, ranks, saved):
    """range_readers answers from the mesh (O(readers)); the generic answer filters every
    candidate by its reads (O(ranks x ranges)): the same groups."""
    from dlio_ckpt_ext.layouts.base import Layout
    job = LoadJob("framework", ranks, saved)
    for rank in range(ranks):
        for r in ORBAX.rank_reads(SMALL, par(replicas), job, rank):
            assert ORBAX.range_readers(SMALL, par(replicas), job, r, rank) == \
                Layout.range_readers(ORBAX, SMALL, par(replicas), job, r, rank)


def test_keep_files_false_leaves_no_file_nor_folder_of_the_checkpoint(tmp_path):
    writers = save(tmp_path, 2, {"zero_stage": 0})
    # each file once, the manifest rewritten at every commit too
    assert sum(ck.remove_written([(1, 1)]) for ck in writers) == sum(
        len({f.name for f in ck.rank_plan(ck.rank).all_files}) for ck in writers)
    writers[0].remove_empty_dirs([(1, 1)])  # the process folders, the item's, then the step's
    assert list(tmp_path.iterdir()) == []


def par_devices(devices, replicas=1, replica_parallel=True):
    return plan.Parallelism(1, 1, 0, None, "default", "orbax", replicas=replicas, devices=devices,
                            replica_parallel=replica_parallel)


def test_a_rank_with_4_devices_writes_their_4_shards_into_one_process_folder():
    """A JAX process drives its host's devices: 2 ranks of 4 devices store exactly the
    chunks 8 ranks of one device store, each rank's folder the union of its 4 devices'."""
    one = [orbax.process_chunks(SMALL, par_devices(1), 8, r) for r in range(8)]
    four = [orbax.process_chunks(SMALL, par_devices(4), 2, r) for r in range(2)]
    key = lambda c: (c.leaf, c.shard, c.piece, c.stored)  # noqa: E731
    for rank in range(2):
        assert sorted(map(key, four[rank])) == sorted(key(c) for r in range(4 * rank, 4 * rank + 4) for c in one[r])
    plans = [ORBAX.rank_plan(SMALL, par_devices(4), 2, r) for r in range(2)]
    assert {HEX.match(f.name).group(1) for p in plans for f in p.files if HEX.match(f.name)} == {"0", "1"}
    sharding = json.loads(plans[0].files[-1].prefix)  # every device of the mesh listed
    assert all(len(json.loads(v)["device_mesh"]["mesh"]) == 8 for v in sharding.values())


def test_on_gpus_replica_0_writes_every_replicated_array_whole():
    """checkpoint.platform=gpu: Orbax turns the replica-parallel save off, so a norm
    (replicated over every device) is written whole by the first process alone."""
    norm = next(i for i, leaf in enumerate(orbax.leaves(SMALL)) if leaf.axis is None)
    on = [c for r in range(4) for c in orbax.process_chunks(SMALL, par_devices(1), 4, r) if c.leaf == norm]
    off = {r: [c for c in orbax.process_chunks(SMALL, par_devices(1, replica_parallel=False), 4, r) if c.leaf == norm]
           for r in range(4)}
    assert len(on) == 4 and sum(c.elements for c in on) == orbax.leaves(SMALL)[norm].elements
    assert [len(off[r]) for r in range(4)] == [1, 0, 0, 0] and off[0][0].elements == orbax.leaves(SMALL)[norm].elements


def test_a_save_with_4_devices_a_rank_restores_verified_at_another_world_size(tmp_path):
    writers = save(tmp_path, 2, {"zero_stage": 0}, devices_per_rank=4)
    assert writers[0].inventory([(1, 1)])["ok"]
    assert sorted(p.name for p in (tmp_path / "1" / "items").iterdir() if p.name.startswith("ocdbt")) == [
        "ocdbt.process_0", "ocdbt.process_1"]
    readers = checkpointers(tmp_path, 4, SHAPE, {"zero_stage": 0}, layout="orbax", restore="framework", saved_ranks=2,
                            num_checkpoints_write=0, num_checkpoints_read=1, devices_per_rank=4)
    assert load_verified(readers) == ORBAX.summary(readers[0].cfg.shape, readers[0].cfg.parallelism,
                                                   readers[0].job, readers[0].cfg.read_size)["bytes_read"]


def test_a_commit_past_the_target_size_goes_on_in_next_files_without_a_manifest_between():
    """The 8B on one process of 8 devices: 33 data files, most cut at the 2 GiB
    target; the process manifest is rewritten once a commit (3 metadata commits,
    the 2 flushes, the end), not once a file."""
    m = plan.ModelShape(32, 4096, 14336, 128256, 32, 8, "bf16", "fp32")
    p = plan.Parallelism(1, 1, 0, None, "default", "orbax", devices=8)
    rp = layouts.of(p).rank_plan(m, p, 1, 0)
    names = [f.name for f in rp.files]
    data = [f for f in rp.files if f.name.startswith("items/ocdbt.process_0/d/")]
    manifests = [i for i, n in enumerate(names) if n.endswith("manifest.ocdbt")]
    assert len(data) == 33 and len(manifests) == orbax.METADATA_COMMITS + len(orbax.FLUSHES[0]) + 1
    assert all(rp.files[i].tmp_suffix == orbax.LOCK_SUFFIX for i in manifests)
    # within a commit, every file but its last reached the target before the next began
    ends = {i - 1 for i in manifests}
    assert all(f.size >= orbax.TARGET_DATA_FILE_BYTES for i, f in enumerate(rp.files)
               if f in data and i not in ends)
