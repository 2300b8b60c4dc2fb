"""One rank's checkpoints through the plan, the engine and a real directory."""
import os

import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer, inventory_error
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.errors import ConfigError
from memory_maps import resident_bytes

TINY = {"model": {"num_layers": 2, "parallelism": {"zero_stage": 3},
                  "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                  "num_attention_heads": 4, "num_kv_heads": 2}},
        "streaming": {"chunk_size": "1MiB", "verify": True}}


def checkpointers(tmp_path, ranks=2):
    cfg = load_config(OmegaConf.create({**TINY, "checkpoint": {"checkpoint_folder": str(tmp_path)}}), ranks)
    return [Checkpointer(cfg, r, ranks, ranks) for r in range(ranks)]


def test_inventory_matches_what_was_written_and_catches_missing_and_short_files(tmp_path):
    cks = checkpointers(tmp_path)
    for ck in cks:
        ck.prepare()
        ck.save(1)
    result = cks[0].inventory([(1, 1)])
    assert result["ok"] and result["message"] == "4 files present, 4 expected, sizes match"
    files = sorted(tmp_path.rglob("*.pt"))
    os.unlink(files[0])
    os.truncate(files[1], files[1].stat().st_size - 1)
    result = cks[0].inventory([(1, 1)])
    assert not result["ok"]
    assert result["message"] == "3 files present, 4 expected, 1 missing, 1 with a wrong size"
    message = str(inventory_error(result))
    assert f"missing {files[0].relative_to(tmp_path)}" in message
    assert f"{files[1].relative_to(tmp_path)} has {files[1].stat().st_size} bytes" in message


def test_both_pools_are_resident_before_the_windows(tmp_path):
    ck = checkpointers(tmp_path, ranks=1)[0]
    ck.prepare()
    try:
        for pool in (ck.write_buffers(), ck.read_buffers()):
            assert [resident_bytes(b) for b in pool.buffers] == [pool.buffer_size] * pool.depth
    finally:
        ck.close()


def test_recovery_rank_shift_reads_another_ranks_files_and_verifies_them(tmp_path):
    cfg = load_config(OmegaConf.create({**TINY, "checkpoint": {"checkpoint_folder": str(tmp_path),
                                                               "recovery_rank_shift": True}}), 4)
    cks = [Checkpointer(cfg, r, 4, 2) for r in range(4)]  # 2 ranks per node, 2 nodes
    for ck in cks:
        ck.prepare()
        ck.save(1)
    assert [ck.source_rank() for ck in cks] == [2, 3, 0, 1]
    loaded = cks[0].load(1)
    assert [f.name for f in loaded] == [f"global_epoch1_step1/zero_pp_rank_2_mp_rank_00_{k}_states.pt"
                                        for k in ("model", "optim")]


@pytest.mark.parametrize("options, key, allowed", [
    ({"write_mod": "direct"}, "workload.storage.storage_options.write_mod", "write_mode"),
    ({"write_mode": "fast"}, "workload.storage.storage_options.write_mode", "direct or buffered"),
    ({"fadvise": "sometimes"}, "workload.storage.storage_options.fadvise", "not a valid bool"),
])
def test_bad_storage_options_name_the_key(tmp_path, options, key, allowed):
    cfg = load_config(OmegaConf.create({**TINY, "checkpoint": {"checkpoint_folder": str(tmp_path)},
                                        "storage": {"storage_options": options}}), 1)
    with pytest.raises(ConfigError) as err:
        Checkpointer(cfg, 0, 1, 1)
    assert err.value.key == key and allowed in str(err.value)


@pytest.mark.parametrize("root, allowed", [("ftp://host/x", "a URI starting with s3://, file://, direct://, az://, gs://"),
                                           ("az:///x", "az://CONTAINER/PREFIX"), ("gs:///x", "gs://BUCKET/PREFIX")])
def test_object_schemes_we_do_not_stream_are_refused(root, allowed):
    cfg = load_config(OmegaConf.create({**TINY, "storage": {"storage_type": "s3", "storage_root": root}}), 1)
    with pytest.raises(ConfigError) as err:
        Checkpointer(cfg, 0, 1, 1)
    assert err.value.key == "workload.storage.storage_root" and allowed in str(err.value)


def test_reads_keep_several_requests_in_flight_by_default_and_one_when_content_cannot_seek(tmp_path):
    default = load_config(OmegaConf.create(TINY), 2)
    assert (default.read_parallelism, default.read_size) == (16, 8 << 20)  # local_fs
    on_s3 = load_config(OmegaConf.create({**TINY, "storage": {"storage_type": "s3"}}), 2)
    assert on_s3.read_parallelism == 32
    ck = Checkpointer(default, 0, 2, 2)
    assert ck.concurrency()["load"] == {"requests_in_flight": 16, "request_bytes": 8 << 20,
                                        "note": "per file or range read, at most one request per read_size piece of it"}
    squeezed = {**TINY, "checkpoint": {"checkpoint_folder": str(tmp_path)},
                "streaming": {**TINY["streaming"], "compress_ratio": 2, "read_size": "1MiB"}}
    cks = [Checkpointer(load_config(OmegaConf.create(squeezed), 2), r, 2, 2) for r in range(2)]
    assert cks[0].cfg.read_parallelism == 1  # verified content with ratios regenerates from the start only
    for ck in cks:
        ck.prepare()
        ck.save(1)
    for ck in cks:
        assert sum(f.nbytes for f in ck.load(1)) == ck.rank_bytes(ck.rank)


def test_async_staging_then_persist_writes_the_same_bytes_as_a_synchronous_save(tmp_path):
    """Same seeds, same bytes: a staged-and-persisted checkpoint reads back
    verified, and equals the synchronous save of the same step byte for byte."""
    def make(folder, mode):
        cfg = load_config(OmegaConf.create({**TINY, "checkpoint": {"checkpoint_folder": str(folder), "layout": "dcp",
                                                                  "async_mode": mode}}), 1)
        ck = Checkpointer(cfg, 0, 1, 1)
        ck.prepare()
        return ck
    sync, staged = make(tmp_path / "sync", "disabled"), make(tmp_path / "async", "async")
    sync.save(1)
    blocked = staged.stage(1)
    assert blocked["bytes"] == staged.rank_plan(0).files[0].size and blocked["staging_s"] > 0
    written = staged.persist(1)
    assert [os.path.basename(f.name) for f in written] == ["__0_0.distcp", ".metadata"]
    assert written[0].fill_s == blocked["fill_s"]  # generation was staging's, reported with the file
    for name in ("__0_0.distcp", ".metadata"):
        assert (tmp_path / "sync/step-1" / name).read_bytes() == (tmp_path / "async/step-1" / name).read_bytes()
    assert [f.nbytes for f in staged.load(1)] == [r.length for r in staged.reads()]  # verify is on


def test_with_a_barrier_only_rank_0_makes_the_directory_and_each_rank_deletes_only_its_own(tmp_path):
    cks = checkpointers(tmp_path, ranks=2)
    made = []
    for ck in cks:
        real = ck.backend.prepare
        ck.backend.prepare = lambda d, rank=ck.rank, real=real: (made.append((rank, d)), real(d))
        ck.prepare()
    made.clear()
    barriers = []
    # rank 0 first, as the barrier orders them: rank 1 finds the directory made
    for ck in cks:
        ck.save(1, barrier=lambda: barriers.append(1))
    assert made == [(0, "global_epoch1_step1")]  # one mkdir, not one a rank
    assert len(barriers) == 2
    ours = {r: sorted(p.name for p in tmp_path.rglob(f"zero_pp_rank_{r}_*")) for r in (0, 1)}
    assert cks[1].remove_written([(1, 1)]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*.pt")) == ours[0]  # rank 0's files untouched
    assert cks[0].remove_written([(1, 1)]) == 2
    cks[0].remove_empty_dirs([(1, 1)])
    assert list(tmp_path.iterdir()) == []
