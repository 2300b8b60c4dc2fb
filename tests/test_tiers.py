"""Two tiers without DLIO: NVIDIA's local names and replication groups, the
local tier's files on a real directory, the refusals, the persist thread's
priority, the TIERS figures from windows, CLOSED and the plan command."""
import os
import threading

import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.shared_plans import tier_plan
from dlio_ckpt_ext.checkpoint.local_tier import LocalTier
from dlio_ckpt_ext.checkpoint.priority import io_class_of_this_thread, lower_this_thread
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.results import tiers as tier_report
from dlio_ckpt_ext.engine.threads import ThreadBudget
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.report.load_plans import plan_command
from dlio_ckpt_ext.submission.submit import Submission, check_closed_rules, effective_config
from test_restore import SHAPE


def tiered(tmp_path, ranks=4, **tiers):
    tiers = {"local_root": str(tmp_path / "local"), "persistent_every": 2, "interval_s": 5.0, **tiers}
    return load_config(OmegaConf.create({
        "model": SHAPE, "streaming": {"chunk_size": "1MiB"}, "tiers": tiers,
        "checkpoint": {"checkpoint_folder": str(tmp_path / "ckpt"), "num_checkpoints_write": 4,
                       "num_checkpoints_read": 0}}), ranks)


def test_nvrx_names_its_local_files_by_iteration_and_rank():
    assert tier_plan.local_name(7, 3) == "iter_0000007_3_local.pt"
    assert tier_plan.local_name(1234567, 12, dirty=True) == "iter_1234567_12_local.dirty.pt"


def test_replication_groups_are_f_ranks_a_jump_apart_and_must_tile_the_job():
    # 16 ranks, 4 a node, F=2: rank 1 keeps node 1's rank 5's part, and 5 keeps 1's
    assert tier_plan.group(1, 2, 4) == (1, 5) and tier_plan.group(5, 2, 4) == (5, 1)
    assert tier_plan.group(9, 2, 4) == (9, 13) and tier_plan.group(2, 3, 1) == (2, 0, 1)
    assert tier_plan.group(6, 1, 4) == (6,)
    tier_plan.check_replication(16, 2, 4)
    with pytest.raises(ConfigError, match=r"workload.tiers.replication=2; .*multiple of 4 x replication"):
        tier_plan.check_replication(4, 2, 4)  # one node of 4: its copies would have no other node
    assert tier_plan.local_bytes(1, 2, 4, lambda r: 10 * r) == 10 + 50


def test_tiers_keys_are_checked_against_each_other_and_the_checkpoint_folder(tmp_path):
    cfg = tiered(tmp_path)
    assert cfg.has_tiers and cfg.is_async and cfg.steps_saved() == [2, 4]
    refusals = [
        ({"local_root": str(tmp_path / "ckpt" / "local")}, "workload.tiers.local_root=.*outside the checkpoint folder"),
        ({"local_root": str(tmp_path)}, "workload.tiers.local_root=.*not holding it"),
        ({"interval_s": 0.0}, "workload.tiers.interval_s=0.0; allowed: seconds > 0, or DLIO's computation "
                              r"between checkpoints to take it from \(checkpoint.time_between_checkpoints > 0"),
        ({"persistent_every": 5}, "workload.checkpoint.num_checkpoints_write=4; allowed: at least "
                                  r"tiers.persistent_every \(5\)"),
        ({"persistent_io": "realtime"}, "workload.tiers.persistent_io='realtime'; allowed: idle or normal"),
        ({"persistent_nice": 20}, "workload.tiers.persistent_nice=20"),
        ({"replication": 0}, "workload.tiers.replication=0"),
    ]
    for tiers, message in refusals:
        with pytest.raises(ConfigError, match=message):
            tiered(tmp_path, **tiers)


def test_the_interval_is_dlio_s_training_time_between_persistent_saves_unless_given(tmp_path):
    cfg = load_config(OmegaConf.create({
        "model": SHAPE, "tiers": {"local_root": str(tmp_path / "l"), "persistent_every": 3},
        "checkpoint": {"checkpoint_folder": str(tmp_path / "c"), "num_checkpoints_write": 7,
                       "num_checkpoints_read": 0, "time_between_checkpoints": 2.5}}), 2)
    assert cfg.persistent_interval_s == 7.5 and cfg.steps_saved() == [3, 6]
    # a training workflow's computation: steps between checkpoints x computation_time (its mean)
    for compute in (0.5, {"mean": 0.5, "stdev": 0.1}):
        trained = load_config(OmegaConf.create({
            "model": SHAPE, "workflow": {"train": True, "checkpoint": True}, "train": {"computation_time": compute},
            "tiers": {"local_root": str(tmp_path / "l"), "persistent_every": 3},
            "checkpoint": {"checkpoint_folder": str(tmp_path / "c"), "num_checkpoints_write": 7,
                           "num_checkpoints_read": 0, "steps_between_checkpoints": 20}}), 2)
        assert trained.persistent_interval_s == 3 * 20 * 0.5
    with pytest.raises(ConfigError, match="workload.checkpoint.num_checkpoints_read=2; allowed: 0 or 1 with tiers: "
                                          "a tiered run's read is its recovery"):
        load_config(OmegaConf.create({"model": SHAPE, "tiers": {"local_root": str(tmp_path / "l"), "interval_s": 1},
                                      "checkpoint": {"checkpoint_folder": str(tmp_path / "c"),
                                                     "num_checkpoints_write": 5, "num_checkpoints_read": 2}}), 2)


def part(rank: int) -> int:
    return (3 + rank) << 20


def test_the_local_tier_writes_its_groups_parts_renamed_and_keeps_at_most_two_iterations(tmp_path):
    cfg = tiered(tmp_path, replication_jump=1)
    tiers = [LocalTier(cfg, r, 4, part, ThreadBudget(1.0, 1)) for r in range(4)]
    assert [t.refusal() for t in tiers] == [None] * 4  # each makes its rank's folder
    seen = []
    for step in (1, 2, 3):
        for t in tiers:
            t.save(step)
        seen.append(sorted(os.listdir(tmp_path / "local" / "1")))
        for t in tiers:  # every rank holds `step` whole: the older go
            t.retire()
    # before the retire, the new iteration beside the one before it; never a .dirty once saved
    assert seen[1] == ["iter_0000001_0_local.pt", "iter_0000001_1_local.pt",
                       "iter_0000002_0_local.pt", "iter_0000002_1_local.pt"]
    for r, t in enumerate(tiers):
        got = {p.name: p.stat().st_size for p in (tmp_path / "local" / str(r)).iterdir()}
        assert got == {tier_plan.local_name(3, m): part(m) for m in tier_plan.group(r, 2, 1)}
        assert t.bytes_per_save == sum(got.values())
    assert tiers[0].remove_all() == 2 and not (tmp_path / "local" / "0").exists()
    for t in tiers:
        t.close()


def test_a_local_tier_with_another_runs_files_or_no_room_is_refused_naming_the_key(tmp_path):
    cfg = tiered(tmp_path, replication_jump=1)
    tier = LocalTier(cfg, 0, 4, part, ThreadBudget(1.0, 1))
    assert tier.refusal() is None and tier.room_refusal(1 << 20) is None
    assert tier.room_refusal(1 << 60).startswith(f"workload.tiers.local_root: {tmp_path / 'local'} has ")
    (tmp_path / "local" / "0" / "iter_0000009_0_local.pt").write_bytes(b"x")
    assert tier.refusal() == (f"workload.tiers.local_root: {tmp_path / 'local' / '0'} holds local checkpoints "
                              "(iter_0000009_0_local.pt) of an earlier or live run; remove them or choose "
                              "another local_root")


def test_a_persist_thread_lowers_its_own_priority_and_its_threads_inherit_it():
    seen = {}

    def persist():
        seen["applied"] = lower_this_thread(10, "idle")
        child = threading.Thread(target=lambda: seen.update(
            child=(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), io_class_of_this_thread())))
        child.start()
        child.join()
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=persist)
    t.start()
    t.join()
    assert seen["applied"] == {"nice": max(before, 10), "io_class": "idle"}
    assert seen["child"] == (max(before, 10), 3)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the foreground's is untouched


def window(step, start, end, nbytes=1 << 30, hosts=None):
    hosts = hosts or {"a": {"throughput_gib_s": nbytes / (1 << 30) / (end - start)}}
    return {"step": step, "start": start, "end": end, "duration_s": end - start, "bytes": nbytes,
            "throughput_gib_s": nbytes / (1 << 30) / (end - start), "hosts": hosts}


def test_tiers_figures_pair_each_local_save_with_the_persists_it_overlapped():
    local = [window(1, 0, 1), window(2, 2, 4), window(3, 5, 6), window(4, 7, 9)]
    persist = [window(2, 4.5, 7.5, 2 << 30)]  # beside local save 3 and the start of 4
    s = tier_report.tiers_summary(local, persist, 2.0, 4, [{"step": 2, "staging_s": 0.1, "wait_s": 0.0}])
    assert [x["during_persist"] for x in s["local"]] == [False, False, True, True]
    assert s["local_s_during_persist"] == 1.5 and s["local_s_alone"] == 1.5 and s["foreground_slowdown"] == 1.0
    assert s["local"][1]["per_rank_gib_s"] == 0.125
    assert s["persistent"] == [{"step": 2, "start": 4.5, "duration_s": 3.0, "gib_s": 2 / 3, "interval_s": 2.0, "slack_s": -1.0,
                                "fit": False, "staging_s": 0.1, "wait_s": 0.0}]
    assert tier_report.overrun_warnings(s) == [
        "[WARNING] persistent save(s) of checkpoint step(s) 2 did not fit in their 2 s interval "
        "(workload.tiers.interval_s): 3.000 s; the storage under test cannot keep this schedule"]
    alone = tier_report.tiers_summary(local, [], 2.0, 4)
    assert alone["foreground_slowdown"] is None and tier_report.overrun_warnings(alone) == []


def test_closed_refuses_tiers():
    sub = Submission("llama3_8b_checkpoint", ["n1"], 8, ["++workload.tiers.local_root=/nvme",
                                                         "++workload.tiers.interval_s=60",
                                                         "++workload.checkpoint.num_checkpoints_read=0"])
    problems = check_closed_rules(sub, effective_config(sub), True, 64 << 30)
    assert any(p.startswith("4.6.3 tiers.local_root=/nvme: CLOSED saves every checkpoint") for p in problems)


def test_the_plan_gives_each_tiers_bytes_per_rank_and_node_at_1024_ranks(tmp_path):
    lines = plan_command("llama3_8b_checkpoint", 1024, ["++workload.tiers.local_root=/nvme",
                                                        "++workload.tiers.interval_s=600"],
                         str(tmp_path / "plan.json"))
    import json
    s = json.loads((tmp_path / "plan.json").read_text())
    cfg = effective_config(Submission("llama3_8b_checkpoint", ["n1"], 8))
    total = cfg.layout.checkpoint_bytes(cfg.shape, cfg.parallelism, 1024)
    assert s["persistent_bytes"] == total and s["nodes"] == 128 and s["replication_jump"] == 8
    # every rank's part is the same here: a rank keeps two, a node's 8 ranks 16, room for two iterations
    assert s["local_rank_bytes_max"] == 2 * s["persistent_rank_bytes_max"]
    assert s["local_node_bytes_max"] == 8 * s["local_rank_bytes_max"]
    assert s["local_room_node_bytes"] == 2 * s["local_node_bytes_max"]
    assert abs(s["persistent_gib_s_to_fit"] - total / 2**30 / 600) < 1e-9
    assert lines[0].startswith("tiers plan: 1024 ranks, 8 a node (128 nodes)")
    assert f"persistent save      {total} bytes" in lines[1]


def test_a_local_root_refusing_o_direct_is_written_buffered_and_fsynced(tmp_path, monkeypatch):
    from dlio_ckpt_ext.checkpoint import local_tier
    assert local_tier.takes_direct_io(str(tmp_path))  # a disk file system: the default O_DIRECT stays
    monkeypatch.setattr(local_tier, "takes_direct_io", lambda folder: False)
    tier = LocalTier(tiered(tmp_path, replication_jump=1), 0, 4, part, ThreadBudget(1.0, 1))
    assert tier.backend.write_cache_method == "O_DIRECT writes, fsync before close"
    assert tier.refusal() is None
    assert tier.backend.write_cache_method == "buffered writes, fsync before close"
    tier.save(1)
    assert (tmp_path / "local" / "0" / "iter_0000001_0_local.pt").stat().st_size == part(0)
    tier.close()


def test_a_tiered_run_counts_its_staging_and_its_local_pool_in_the_memory_it_refuses(tmp_path):
    from dlio_ckpt_ext.checkpoint.memory import check_memory, rank_buffers, staging_bytes
    cfg = tiered(tmp_path)
    keys = {k: n for k, _, n in rank_buffers(cfg, 4)}
    assert keys["workload.tiers.persistent_every"] == staging_bytes(cfg, 4) + cfg.chunk_size
    assert keys["workload.tiers.local_root"] == 4 * cfg.chunk_size  # pool_depth buffers of its own
    with pytest.raises(ConfigError, match=r"async staging \(the rank's whole checkpoint share\) [\d.]+ GiB \+ "
                                          r"local tier buffers [\d.]+ GiB"):
        check_memory(cfg, 4, 4, available=1 << 20)
