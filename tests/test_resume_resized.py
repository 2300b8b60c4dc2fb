"""A job coming back at another size, no DLIO: each layout learns the world size
its checkpoint was saved at from the checkpoint, as its framework does
(docs/recovery.md), the requests counted; the load is then planned at that
size, resharded, and every byte it reads verified; what disagrees is refused
naming both values."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.checkpoint import universal
from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape, resumed_job
from dlio_ckpt_ext.shared_plans.plan import Parallelism
from test_recovery import LAYOUTS, SHAPE

#: DeepSpeed's as the presets save them (ZeRO-3: a ZeRO-0 save's files are the same at any data-parallel size)
RESIZED = {**LAYOUTS, "deepspeed": ({}, {"zero_stage": 3}),
           "deepspeed_files": ({"deepspeed_files": "deepspeed"}, {"zero_stage": 3}),
           "deepspeed_zero1": ({}, {"zero_stage": 1})}
#: model-parallel ZeRO saves, converted apart (not in RESIZABLE: the search tests keep DP-only shapes)
MODEL_PARALLEL = {"deepspeed_tp2z1": ({}, {"zero_stage": 1, "tensor": 2}),
                  "deepspeed_tp2z3": ({}, {"zero_stage": 3, "tensor": 2}),
                  "deepspeed_pp2z1": ({}, {"zero_stage": 1, "pipeline": 2})}
RESIZABLE = [name for name in RESIZED if name != "safetensors"]
#: the requests rank 0 makes past the framework's search to learn the saved shape
SHAPE_REQUESTS = {
    "deepspeed": {},                   # the names its listing of the candidate gave
    "deepspeed_files": {},             # the names every rank's glob of the tag gave
    "deepspeed_zero1": {},
    "dcp": {"GET": 1},                 # .metadata
    "megatron": {"GET": 1},            # .metadata (the sharded metadata)
    "orbax": {"GET": 1, "LIST": 1},    # items/_sharding, then the ocdbt.process_* folders
}


def checkpointer(folder: Path, layout: str, ranks: int, rank: int, **checkpoint) -> Checkpointer:
    extra, parallelism = {**RESIZED, **MODEL_PARALLEL}[layout]
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
    cks = [resumed(folder, layout, 2, rank) for rank in range(2)]
    for each in cks:
        each.use_job(job)
    if ck.layout.converts(ck.cfg.parallelism, job):  # DeepSpeed's ZeRO: the universal checkpoint first
        converted(cks, ck.directory(2))
    # both ranks of the job read the plan's ranges of the checkpoint saved at 4, every byte compared
    read = 0
    for each in cks:
        files = each.load(2)
        assert sum(f.nbytes for f in files) == each.load_bytes() > 0
        read += each.load_bytes()
        each.close()
    assert read == ck.layout.summary(ck.cfg.shape, ck.cfg.parallelism, job, ck.cfg.read_size)["bytes_read"]


def converted(cks: list[Checkpointer], directory: str) -> list[dict]:
    """Every rank's part of the universal conversion, a thread each (their barriers meet)."""
    return universal.convert_in_threads(cks, directory)


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


@pytest.mark.parametrize("layout", ["deepspeed_zero1", "deepspeed"])
def test_a_zero_checkpoint_at_another_size_is_converted_as_ds_to_universal_converts_it(tmp_path, layout):
    """zero/ holds one folder a parameter with its three states whole and its step,
    each state the parameter's elements in fp32; the fragments are gone; every
    file read was one the save or the extraction wrote, every byte verified."""
    folder = tmp_path / "ckpt"
    saved_at(folder, layout, 4, steps=1)
    cks = [resumed(folder, layout, 2, rank) for rank in range(2)]
    job, _ = resumed_job(cks[0].job, SavedShape(4, "x"), 0, cks[0].cfg.parallelism, "f")
    for ck in cks:
        ck.use_job(job)
    figures = converted(cks, "global_epoch1_step1")
    out = folder / "global_epoch1_step1_universal"
    h, f, v, layers = 256, 512, 1024, 2
    dkv = h // 4 * 2
    numel = {"word_embeddings.weight": v * h, "lm_head.weight": v * h, "final_layernorm.weight": h}
    for i in range(layers):
        numel |= {f"layers.{i}.input_layernorm.weight": h, f"layers.{i}.post_attention_layernorm.weight": h,
                  f"layers.{i}.self_attention.query_key_value.weight": h * (h + 2 * dkv),
                  f"layers.{i}.self_attention.dense.weight": h * h, f"layers.{i}.mlp.dense_h_to_4h.weight": 2 * h * f,
                  f"layers.{i}.mlp.dense_4h_to_h.weight": h * f}
    assert sorted(p.name for p in (out / "zero").iterdir()) == sorted([*numel, "optimizer_state.pt"])
    for name, n in numel.items():
        sizes = {p.name: p.stat().st_size for p in (out / "zero" / name).iterdir()}
        assert sizes == {"fp32.pt": 4 * n + 1577, "exp_avg.pt": 4 * n + 1577, "exp_avg_sq.pt": 4 * n + 1577,
                         "step.pt": 1581}
    assert not (out / "tmp").exists()
    assert (folder / "latest_universal").read_text() == "global_epoch1_step1_universal"
    saved = sorted(p.name for p in (folder / "global_epoch1_step1").iterdir())
    assert sorted(p.name for p in out.iterdir()) == sorted(["zero"] + [n for n in saved if "model_states" in n])
    # each of the 4 optimizer files yields 4 files (3 states, step) for each parameter its partition touches
    fragments = sum(x["deleted_files"] for x in figures)
    assert fragments == sum(x["written_files"] for x in figures) - 4 * len(numel) - 1 - sum(
        1 for n in saved if "model_states" in n)
    if layout == "deepspeed":  # ZeRO-3 extracts every parameter from every file, empty or not
        assert fragments == 4 * 4 * len(numel)
    # read: the save's files, the fragments (each once), and the first optimizer file again
    saved_bytes = sum((folder / "global_epoch1_step1" / n).stat().st_size for n in saved)
    assert sum(x["read_files"] for x in figures) == len(saved) + fragments + 1
    assert sum(x["read_bytes"] for x in figures) > saved_bytes


@pytest.mark.parametrize("layout", MODEL_PARALLEL)
def test_a_model_parallel_zero_checkpoint_converts_and_loads_at_another_size(tmp_path, layout):
    """TP 2 or PP 2 (model-parallel size 2), saved at 4 ranks (DP 2), loaded at 8
    (DP 4): the fragments of every model-parallel rank merge into whole
    parameters, and each of the 8 ranks reads its plan's files, every byte verified."""
    folder = tmp_path / "ckpt"
    saved_at(folder, layout, 4, steps=1)
    cks = [resumed(folder, layout, 8, rank) for rank in range(8)]
    job, refusal = resumed_job(cks[0].job, SavedShape(4, "names", model_parallel=2), 0, cks[0].cfg.parallelism, "f")
    assert refusal is None
    for ck in cks:
        ck.use_job(job)
    figures = converted(cks, "global_epoch1_step1")
    assert not (folder / "global_epoch1_step1_universal" / "tmp").exists()
    assert sum(f["deleted_files"] for f in figures) > 0
    read = 0
    for ck in cks:
        read += sum(f.nbytes for f in ck.load(1))
        ck.close()
    assert read == cks[0].layout.summary(cks[0].cfg.shape, cks[0].cfg.parallelism, job,
                                         cks[0].cfg.read_size)["bytes_read"]
