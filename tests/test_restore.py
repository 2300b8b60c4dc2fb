"""Restores through the checkpointer onto a real directory, no DLIO: a
checkpoint saved at one world size read at another, every byte verified."""
import os

import pytest

from test_resume_resized import converted
from omegaconf import OmegaConf

from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.errors import ConfigError, VerificationError

SHAPE = {"num_layers": 2, "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                          "num_attention_heads": 4, "num_kv_heads": 2}}
#: layers of 4 and 8 rows: at 3 ranks a saved file is read in parts
ODD = {"num_layers": 1, "transformer": {"hidden_size": 8, "ffn_hidden_size": 8, "vocab_size": 4,
                                        "num_attention_heads": 2, "num_kv_heads": 1}}
STREAM = {"chunk_size": "1MiB", "read_size": "1MiB", "verify": True}


def checkpointers(folder, ranks, shape, parallelism, **checkpoint):
    cfg = load_config(OmegaConf.create({"model": {**shape, "parallelism": parallelism}, "streaming": STREAM,
                                        "checkpoint": {"checkpoint_folder": str(folder), **checkpoint}}), ranks)
    return [Checkpointer(cfg, r, ranks, ranks) for r in range(ranks)]


def save(folder, ranks, shape, parallelism, layout):
    writers = checkpointers(folder, ranks, shape, parallelism, layout=layout)
    for ck in writers:
        ck.prepare()
        ck.save(1)
    for ck in writers:  # DCP's commit: rank 0's .metadata once every rank is done
        ck._save_generated(ck.directory(1), ck.rank_plan(ck.rank).commit_files, None, 1)
    return writers


def restore(folder, ranks, saved, shape, parallelism, layout):
    return checkpointers(folder, ranks, shape, parallelism, layout=layout, restore="framework", saved_ranks=saved,
                         num_checkpoints_write=0, num_checkpoints_read=1)


@pytest.mark.parametrize("layout, zero, shape, saved, ranks", [
    ("dcp", 0, SHAPE, 4, 2), ("dcp", 0, SHAPE, 4, 3), ("dcp", 0, ODD, 4, 3),
    ("deepspeed", 3, SHAPE, 2, 4), ("deepspeed", 1, SHAPE, 4, 2),
])
def test_a_resharded_restore_reads_its_plan_and_every_byte_verifies(tmp_path, layout, zero, shape, saved, ranks):
    save(tmp_path, saved, shape, {"zero_stage": zero}, layout)
    readers = restore(tmp_path, ranks, saved, shape, {"zero_stage": zero}, layout)
    assert readers[0].inventory([(1, 1)])["ok"]  # the saved layout's files, at the saved world size
    if readers[0].layout.converts(readers[0].cfg.parallelism, readers[0].job):  # DeepSpeed's ZeRO: universal first
        for ck in readers:
            ck.prepare()
        converted(readers, readers[0].directory(1))
    assert load_verified(readers) == layouts.summary(readers[0].cfg.shape, readers[0].cfg.parallelism,
                                                     readers[0].job, readers[0].cfg.read_size)["bytes_read"]


def load_verified(readers) -> int:
    """Every reader's load, one after another: the ranges its plan names, each
    verified against the content at its offset (verify=True); the bytes of all."""
    total = 0
    for ck in readers:
        ck.prepare()
        loaded = ck.load(1)
        assert [(f.name.split("/", 1)[1], f.nbytes) for f in loaded] == [(r.name, r.length) for r in ck.reads()]
        total += sum(f.nbytes for f in loaded)
        ck.close()
    return total


def test_a_damaged_byte_inside_a_range_read_is_named_at_its_offset(tmp_path):
    save(tmp_path, 4, ODD, {"zero_stage": 0}, "dcp")
    ck = restore(tmp_path, 3, 4, ODD, {"zero_stage": 0}, "dcp")[1]
    r = next(r for r in ck.reads() if r.name.endswith(".distcp") and r.offset > 0)
    path = tmp_path / ck.directory(1) / r.name
    with open(path, "r+b") as fh:
        fh.seek(r.offset + 3)
        byte = fh.read(1)
        fh.seek(r.offset + 3)
        fh.write(bytes([byte[0] ^ 0xFF]))
    ck.prepare()
    with pytest.raises(VerificationError, match=f"{r.name} differs from the written data at byte offset {r.offset + 3}"):
        ck.load(1)


def test_a_restore_of_a_checkpoint_saved_at_another_size_checks_the_saved_files(tmp_path):
    save(tmp_path, 2, SHAPE, {"zero_stage": 3}, "deepspeed")
    readers = restore(tmp_path, 4, 4, SHAPE, {"zero_stage": 3}, "deepspeed")  # told 4: it was 2
    result = readers[0].inventory([(1, 1)])
    assert not result["ok"] and result["message"] == "4 files present, 8 expected, 4 missing, 4 with a wrong size"


@pytest.mark.parametrize("checkpoint, key, words", [
    ({"saved_ranks": 4}, "workload.checkpoint.saved_ranks", "0 or this run's 2 ranks while it writes"),
    ({"saved_ranks": 4, "num_checkpoints_write": 0}, "workload.checkpoint.saved_ranks", "restore=framework"),
    ({"restore": "latest"}, "workload.checkpoint.restore", "own or framework"),
    ({"share": "multicast"}, "workload.checkpoint.share", "none or broadcast"),
    ({"restore": "framework", "recovery_rank_shift": True}, "workload.checkpoint.recovery_rank_shift",
     "False with restore=framework"),
    ({"restore": "framework", "saved_ranks": 3, "num_checkpoints_write": 0, "layout": "deepspeed"},
     "workload.checkpoint.saved_ranks", "a world size the layout can be saved at"),
])
def test_restore_settings_no_job_can_have_are_refused_under_their_key(tmp_path, checkpoint, key, words):
    with pytest.raises(ConfigError) as exc:
        parallel = {"pipeline": 2, "zero_stage": 1} if checkpoint.get("saved_ranks") == 3 else {}
        load_config(OmegaConf.create({"model": {**SHAPE, "parallelism": parallel},
                                      "checkpoint": {"checkpoint_folder": str(tmp_path), **checkpoint}}), 2)
    assert exc.value.key == key and words in str(exc.value), str(exc.value)


class ThreadGroup:
    """engine.share.Broadcast among threads: what MPI's Bcast does, for a test without MPI."""

    def __init__(self, members, rank, shared):
        self.index, self.size, self.shared = members.index(rank), len(members), shared

    def bcast(self, buf, root):
        box, barrier = self.shared
        if self.index == root:
            box[0] = bytes(buf)
        barrier.wait()
        if self.index != root:
            buf[:] = box[0]
        barrier.wait()


def run_in_threads(readers, action):
    import threading
    groups, lock, errors = {}, threading.Lock(), []

    def sharer_for(rank):
        def sharer(members):
            with lock:
                shared = groups.setdefault(members, ([None], threading.Barrier(len(members))))
            return ThreadGroup(members, rank, shared)
        return sharer

    results = [None] * len(readers)

    def one(i, ck):
        try:
            ck.sharer = sharer_for(ck.rank)
            ck.prepare()
            results[i] = action(ck)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            for _, barrier in groups.values():
                barrier.abort()
    threads = [threading.Thread(target=one, args=(i, ck)) for i, ck in enumerate(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("layout, zero, pipeline, saved, ranks", [
    ("deepspeed", 1, 2, 6, 6),   # every layer file read by the 3 replicas of its stage
    ("dcp", 0, 1, 4, 3),         # resharded: the new ranks overlapping a saved file share it
    ("megatron", 1, 2, 4, 4),    # the fully parallel load: each stage's data-parallel pair reads a weight once
])
def test_sharing_reads_each_range_once_from_storage_and_every_rank_gets_its_bytes(
        tmp_path, layout, zero, pipeline, saved, ranks):
    parallel = {"zero_stage": zero, "pipeline": pipeline}
    save(tmp_path, saved, SHAPE, parallel, layout)
    readers = checkpointers(tmp_path, ranks, SHAPE, parallel, layout=layout, restore="framework", saved_ranks=saved,
                            num_checkpoints_write=0, num_checkpoints_read=1, share="broadcast")
    got = run_in_threads(readers, lambda ck: (sum(f.nbytes for f in ck.load(1)), dict(ck.last_broadcast),
                                              sum(r.length for r in dict.fromkeys(ck.reads()))))
    ck = readers[0]
    plan = layouts.summary(ck.cfg.shape, ck.cfg.parallelism, ck.job, ck.cfg.read_size, "broadcast")
    assert sum(storage for storage, _, _ in got) == plan["storage_bytes"] < plan["bytes_read"]
    for storage, broadcast, wanted in got:  # verify=True: every received piece checked too
        assert storage + broadcast["broadcast_bytes"] == wanted
