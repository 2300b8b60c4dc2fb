"""A job coming back at another size, no DLIO: each layout learns the world size
its checkpoint was saved at from the checkpoint, as its framework does
(docs/recovery.md), the requests counted; the load is then planned at that
size, resharded, and every byte it reads verified; what disagrees is refused
naming both values."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape, resumed_job
from dlio_ckpt_ext.shared_plans.plan import Parallelism
from test_recovery import LAYOUTS, SHAPE

#: DeepSpeed's as the presets save them (ZeRO-3: a ZeRO-0 save's files are the same at any data-parallel size)
RESIZED = {**LAYOUTS, "deepspeed": ({}, {"zero_stage": 3}),
           "deepspeed_files": ({"deepspeed_files": "deepspeed"}, {"zero_stage": 3})}
RESIZABLE = [name for name in RESIZED if name != "safetensors"]
#: the requests rank 0 makes past the framework's search to learn the saved shape
SHAPE_REQUESTS = {
    "deepspeed": {},                   # the names its listing of the candidate gave
    "deepspeed_files": {},             # the names every rank's glob of the tag gave
    "dcp": {"GET": 1},                 # .metadata
    "megatron": {"GET": 1},            # .metadata (the sharded metadata)
    "orbax": {"GET": 1, "LIST": 1},    # items/_sharding, then the ocdbt.process_* folders
}


def checkpointer(folder: Path, layout: str, ranks: int, rank: int, **checkpoint) -> Checkpointer:
    extra, parallelism = RESIZED[layout]
    cfg = load_config(OmegaConf.create({
        "model": {**SHAPE, "parallelism": parallelism},
        "streaming": {"chunk_size": "1MiB", "read_size": "1MiB", "verify": True},
        "checkpoint": {"checkpoint_folder": str(folder), "layout": layout.split("_")[0], **extra,
                       **checkpoint}}), ranks)
    ck = Checkpointer(cfg, rank, ranks, ranks)
    ck.prepare()
    return ck


def saved_at(folder: Path, layout: str, ranks: int, steps: int = 2) -> None:
    """`steps` checkpoints as `ranks` ranks save them (rank 0, which commits, last)."""
    cks = [checkpointer(folder, layout, ranks, rank, num_checkpoints_write=steps, num_checkpoints_read=0)
           for rank in reversed(range(ranks))]
    for step in range(1, steps + 1):
        for ck in cks:
            ck.save(step)
    for ck in cks:
        ck.close()


def resumed(folder: Path, layout: str, ranks: int, rank: int = 0, **checkpoint) -> Checkpointer:
    return checkpointer(folder, layout, ranks, rank, num_checkpoints_write=0, num_checkpoints_read=1,
                        resume="latest", **checkpoint)


@pytest.mark.parametrize("layout", RESIZABLE)
def test_each_layout_learns_the_saved_world_from_the_checkpoint_and_reshards_every_byte_verified(tmp_path, layout):
    folder = tmp_path / "ckpt"
    saved_at(folder, layout, 4)
    ck = resumed(folder, layout, 2)
    look = discovery.Look(ck.backend, 0)
    latest = ck.layout.find_latest(look, ck.checkpoint_files)
    searched = dict(look.requests)
    shape = discovery.saved_shape(ck.layout, look, latest)
    # a whole checkpoint saved at 4 is never half-written at 2
    assert (latest.checkpoint, latest.skipped) == ((2, 1), [])
    assert shape.world == 4
    extra = {k: look.requests[k] - searched.get(k, 0) for k in look.requests if look.requests[k] != searched.get(k)}
    assert extra == SHAPE_REQUESTS[layout]
    job, refusal = resumed_job(ck.job, shape, 0, ck.cfg.parallelism, "ckpt")
    assert refusal is None
    assert (job.ranks, job.saved_ranks, job.pattern) == (2, 4, "framework")
    # both ranks of the job read the plan's ranges of the checkpoint saved at 4, every byte compared
    read = 0
    for rank in range(2):
        ck = resumed(folder, layout, 2, rank)
        ck.use_job(job)
        files = ck.load(2)
        assert sum(f.nbytes for f in files) == ck.load_bytes() > 0
        read += ck.load_bytes()
        ck.close()
    assert read == ck.layout.summary(ck.cfg.shape, ck.cfg.parallelism, job, ck.cfg.read_size)["bytes_read"]


def test_each_record_says_what_it_was_saved_with():
    p = Parallelism(tensor=2, pipeline=1, zero_stage=1)
    head = saved_shape.header(8, p) + b"\x00rest of the file"
    shape = saved_shape.from_header(head, "DCP's .metadata plan")
    assert (shape.world, shape.tensor, shape.pipeline, shape.data, shape.zero_stage) == (8, 2, 1, 4, 1)
    assert shape.describe() == "8 ranks, TP 2 PP 1 DP 4 ZeRO-1"
    assert saved_shape.from_header(b"\x93random bytes", "x") is None  # a .metadata of another writer
    names = [f"zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(3) for m in range(2)]
    ds = saved_shape.from_deepspeed_names(names + ["mp_rank_00_model_states.pt"])
    assert (ds.world, ds.model_parallel, ds.data) == (6, 2, 3)
    assert saved_shape.from_deepspeed_names(["latest", "mp_rank_00_model_states.pt"]) is None
    assert saved_shape.from_deepspeed_names(names[:2]) is None  # DP 1 or ZeRO-0: any DP loads these
    sharding = b'{"a": "{\\"device_mesh\\": {\\"mesh\\": [{\\"id\\": 0}, {\\"id\\": 1}, {\\"id\\": 2}, {\\"id\\": 3}]}}"}'
    orbax = saved_shape.from_orbax(sharding, 2)
    assert (orbax.world, orbax.devices_per_rank) == (2, 2)
    assert saved_shape.from_orbax(sharding, 3) is None  # 4 devices cannot be 3 processes' alike


def test_what_disagrees_with_the_checkpoint_is_refused_naming_both(tmp_path):
    folder = tmp_path / "ckpt"
    saved_at(folder, "dcp", 4, steps=1)
    ck = resumed(folder, "dcp", 2)
    shape = SavedShape(4, "DCP's .metadata plan", 1, 1, zero_stage=3)
    _, refusal = resumed_job(ck.job, shape, 3, ck.cfg.parallelism, "s3://b/ckpt/step-1")
    assert refusal == ("workload.checkpoint.saved_ranks=3 disagrees with s3://b/ckpt/step-1: its DCP's .metadata "
                       "plan says it was saved by 4 ranks (leave saved_ranks unset: the checkpoint says)")
    _, refusal = resumed_job(ck.job, SavedShape(4, "x", 2, 1), 0, ck.cfg.parallelism, "f")
    assert refusal.startswith("workload.model.parallelism.tensor=1 disagrees with f: saved with 2 (its x)")
    # the same size: the run's own restore, nothing resharded
    job, refusal = resumed_job(ck.job, SavedShape(2, "x"), 0, ck.cfg.parallelism, "f")
    assert (refusal, job.pattern, job.saved_ranks) == (None, "own", 2)
    # nothing in the checkpoint says: the run's settings stand
    assert resumed_job(ck.job, None, 0, ck.cfg.parallelism, "f") == (ck.job, None)


def test_a_resume_naming_another_saved_size_reads_it_as_the_framework_reshards(tmp_path):
    ck = resumed(tmp_path / "ckpt", "dcp", 2, saved_ranks=4)
    assert (ck.job.pattern, ck.job.saved_ranks) == ("framework", 4)
