"""Load plans: which byte ranges each rank of a loading job reads, checked
against an independent row-by-row computation and the frameworks' rules."""
import json
import subprocess
import sys

import pytest

from dlio_ckpt_ext import layouts

from dlio_ckpt_ext.shared_plans import load_plan as lp, plan, universal_plan as up
from dlio_ckpt_ext.errors import ConfigError

TINY = plan.ModelShape(4, 512, 1792, 8192, 8, 2)
#: tensors of 4 and 8 rows: their FSDP shards fall on different saved ranks at 3 ranks
ODD = plan.ModelShape(1, 8, 8, 4, 2, 1)


def dcp(tensor=1, pipeline=1, zero=0):
    return plan.Parallelism(tensor, pipeline, zero, None, "default", "dcp")


def deepspeed(tensor=1, pipeline=1, zero=1):
    return plan.Parallelism(tensor, pipeline, zero, None, "default", "deepspeed")


def held_rows(rows: int, world: int, rank: int) -> set[int]:
    """torch.chunk's split of range(rows) into world pieces, piece `rank`, as a set."""
    per = -(-rows // world)
    return set(list(range(rows))[rank * per:(rank + 1) * per])


def brute_force_dcp_bytes(m, saved, ranks, rank) -> int:
    """Bytes of every saved item (parameter, then the two moments, each wrapped
    by torch.save: 1,577 B more) whose rows meet this rank's new rows, by sets of
    row numbers: the item is read whole; a saved file all of whose items are
    met is read whole (its byte items too)."""
    total = 0
    tensors = plan.dcp_tensors(m)
    for s in range(saved):
        held = [(rows, cols) for rows, cols in tensors if held_rows(rows, saved, s)]
        met = [(rows, cols) for rows, cols in held if held_rows(rows, saved, s) & held_rows(rows, ranks, rank)]
        if met and len(met) == len(held):
            total += layouts.rank_plan(m, dcp(), saved, s).files[0].size
            continue
        for rows, cols in met:
            n = len(held_rows(rows, saved, s)) * cols
            total += n * plan.DTYPE_BYTES[m.model_datatype] + 2 * n * plan.DTYPE_BYTES[m.optimizer_datatype] + 3 * 1577
    return total


@pytest.mark.parametrize("m", [TINY, ODD], ids=["tiny", "odd"])
@pytest.mark.parametrize("saved, ranks", [(4, 2), (4, 3), (2, 4), (3, 5), (4, 4)])
def test_dcp_resharded_reads_exactly_the_saved_items_overlapping_the_new_rows(m, saved, ranks):
    job = lp.LoadJob("framework", ranks, saved)
    metadata = layouts.rank_plan(m, dcp(), saved, 0).commit_files[0]
    for rank in range(ranks):
        reads = layouts.rank_reads(m, dcp(), job, rank)
        assert reads[0] == lp.ReadRange(".metadata", 0, metadata.size, 0, metadata.size)  # every rank, first
        data = reads[1:]
        assert sum(r.length for r in data) == brute_force_dcp_bytes(m, saved, ranks, rank)
        for r in data:  # inside their files, not overlapping one another
            assert r.name == f"__{r.writer}_0.distcp" and 0 <= r.offset and r.offset + r.length <= r.file_size
        spans = sorted((r.name, r.offset, r.offset + r.length) for r in data)
        assert all(a[0] != b[0] or a[2] < b[1] for a, b in zip(spans, spans[1:]))  # coalesced: gaps between


def test_an_odd_shape_reads_part_of_a_saved_file_in_several_ranges():
    reads = layouts.rank_reads(ODD, dcp(), lp.LoadJob("framework", 3, 4), 1)
    size = layouts.rank_plan(ODD, dcp(), 4, 1).files[0].size
    partial = [r for r in reads if r.name == "__1_0.distcp"]
    assert partial and sum(r.length for r in partial) < size


def test_own_and_same_world_framework_are_the_files_each_rank_wrote():
    for p in (dcp(), deepspeed(zero=3)):
        job = lp.LoadJob("own", 4, 4)
        for rank in range(4):
            mine = layouts.rank_plan(TINY, p, 4, rank)
            names = [f.name for f in layouts.rank_plan(TINY, p, 4, 0).commit_files + mine.files]
            assert [r.name for r in layouts.rank_reads(TINY, p, job, rank)] == names
    # recovery_rank_shift: the files of rank (r + shift) % ranks
    shifted = layouts.rank_reads(TINY, deepspeed(zero=3), lp.LoadJob("own", 4, 4, shift=2), 1)
    assert {r.writer for r in shifted} == {3}
    assert layouts.rank_reads(TINY, dcp(), lp.LoadJob("framework", 4, 4), 2) == \
        layouts.rank_reads(TINY, dcp(), lp.LoadJob("own", 4, 4), 2)


def test_deepspeed_pipeline_replicas_each_read_their_stages_layer_files():
    # ZeRO-1, 2 pipeline stages, 3 data-parallel replicas: 6 ranks
    p = deepspeed(pipeline=2, zero=1)
    s = layouts.summary(TINY, p, lp.LoadJob("framework", 6, 6), 8 << 20)
    layer_files = [n for n in layouts.of(p).saved_files(TINY, p, 6) if n.startswith("layer_")]
    readers = {n: [r for r in range(6) if n in {x.name for x in layouts.rank_reads(TINY, p, lp.LoadJob("framework", 6, 6), r)}]
               for n in layer_files}
    assert all(len(v) == 3 for v in readers.values())  # every replica of the stage
    assert s["readers_per_file_max"] == 3
    model = sum(layouts.rank_plan(TINY, p, 6, r).total_bytes for r in range(2))  # dp rank 0's files: model + optim
    optim = sum(f.size for r in range(6) for f in layouts.rank_plan(TINY, p, 6, r).files if f.kind == "optimizer")
    assert s["bytes_read"] == 3 * (model - sum(f.size for r in range(2) for f in layouts.rank_plan(TINY, p, 6, r).files
                                               if f.kind == "optimizer")) + optim


def test_deepspeed_reads_model_parallel_rank_0s_model_states_first_as_its_loader_checks_them():
    p = deepspeed(tensor=2, zero=1)
    for rank, names in ((0, ["mp_rank_00_model_states.pt", "mp_rank_00_model_states.pt",
                             "zero_pp_rank_0_mp_rank_00_optim_states.pt"]),
                        (3, ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
                             "zero_pp_rank_1_mp_rank_01_optim_states.pt"])):
        assert [r.name for r in layouts.rank_reads(TINY, p, lp.LoadJob("framework", 4, 4), rank)] == names


@pytest.mark.parametrize("zero, saved, ranks", [(3, 2, 4), (1, 4, 2), (1, 2, 4), (1, 3, 2)])
def test_deepspeed_at_another_world_size_reads_the_universal_checkpoint(zero, saved, ranks):
    """DeepSpeed refuses a ZeRO checkpoint at another data-parallel size; its universal
    one loads: every rank reads zero/optimizer_state.pt, then every file of each
    parameter folder it holds a slice of (ZeRO-3: all of them; ZeRO-1: those its new
    partition of the flat buffer overlaps, in order, so the ranks' sets meet at most
    at the parameter straddling their boundary), and no saved optimizer file."""
    p = deepspeed(zero=zero)
    job = lp.LoadJob("framework", ranks, saved)
    names = [x.name for x in up.params(TINY, 1)]
    held = []
    for rank in range(ranks):
        reads = [r.name for r in layouts.rank_reads(TINY, p, job, rank)]
        assert not [n for n in reads if n.endswith("optim_states.pt")]
        assert next(n for n in reads if n.startswith("zero/")) == "zero/optimizer_state.pt"
        folders = list(dict.fromkeys(n.split("/")[1] for n in reads if n.startswith("zero/") and n.count("/") == 2))
        assert all(f"zero/{x}/{s}.pt" in reads for x in folders for s in ("fp32", "exp_avg", "exp_avg_sq", "step"))
        held.append(folders)
    if zero == 3:
        assert all(h == names for h in held)
    else:
        assert held[0][0] == names[0] and held[-1][-1] == names[-1]
        for a, b in zip(held, held[1:]):
            assert names.index(b[0]) in (names.index(a[-1]), names.index(a[-1]) + 1)


@pytest.mark.parametrize("job, key, words", [
    (lp.LoadJob("latest", 2, 2), "checkpoint.restore", "own or framework"),
    (lp.LoadJob("own", 2, 4), "checkpoint.saved_ranks", "restore=framework"),
    (lp.LoadJob("framework", 2, 0), "checkpoint.saved_ranks", "a positive integer"),
])
def test_impossible_loads_are_refused_naming_the_key(job, key, words):
    with pytest.raises(ConfigError) as exc:
        layouts.get("dcp").validate_job(TINY, dcp(), job)
    assert exc.value.key == key and words in str(exc.value)


def test_a_saved_world_size_the_layout_cannot_have_is_refused():
    with pytest.raises(ConfigError) as exc:
        layouts.get("deepspeed").validate_job(TINY, deepspeed(pipeline=2), lp.LoadJob("framework", 4, 3))
    assert exc.value.key == "checkpoint.saved_ranks" and "multiple of tensor*pipeline = 2" in str(exc.value)


def test_sharing_serves_each_range_once_from_storage():
    p = deepspeed(pipeline=2, zero=1)
    job = lp.LoadJob("framework", 6, 6)
    alone, shared = (layouts.summary(TINY, p, job, 1 << 20, share) for share in ("none", "broadcast"))
    assert alone["bytes_read"] == shared["bytes_read"] == alone["storage_bytes"]
    layer_bytes = sum(size for n, size in layouts.of(p).saved_files(TINY, p, 6).items() if n.startswith("layer_"))
    assert alone["storage_bytes"] - shared["storage_bytes"] == 2 * layer_bytes  # 3 replicas -> 1 read
    assert shared["broadcast_bytes"] == 2 * layer_bytes


def test_plan_command_at_1024_ranks_prints_and_writes_every_ranks_counts(tmp_path):
    out = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "dlio_ckpt_ext.report", "plan", "--workload",
                          "torchtitan_llama3_8b_checkpoint", "--ranks", "1024", "--json", str(out),
                          "++workload.checkpoint.restore=framework", "++workload.checkpoint.saved_ranks=512"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert len(data["per_rank"]) == 1024 and data["saved_ranks"] == 512 and data["layout"] == "dcp"
    assert sum(r["bytes"] for r in data["per_rank"]) == data["bytes_read"]
    assert data["amplification"] > 1 and data["readers_per_file_max"] == 1024  # .metadata: every rank
    assert "resharded" in res.stdout.splitlines()[0] and f"{data['bytes_read']}" in res.stdout


def test_plan_command_takes_overrides_before_and_after_its_options(tmp_path):
    out = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "dlio_ckpt_ext.report", "plan", "--workload", "llama3_tiny_checkpoint",
                          "++workload.checkpoint.restore=framework", "--ranks", "2", "--json", str(out),
                          "++workload.checkpoint.saved_ranks=4", "++workload.checkpoint.num_checkpoints_write=0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert (data["pattern"], data["ranks"], data["saved_ranks"]) == ("framework", 2, 4)
    res = subprocess.run([sys.executable, "-m", "dlio_ckpt_ext.report", "plan", "--workload", "llama3_tiny_checkpoint",
                          "--ranks", "2", "--bogus"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr


def test_plan_command_refuses_an_impossible_load_in_one_line():
    res = subprocess.run([sys.executable, "-m", "dlio_ckpt_ext.report", "plan", "--workload", "llama3_tiny_checkpoint",
                          "--ranks", "2", "++workload.checkpoint.saved_ranks=4"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "workload.checkpoint.saved_ranks" in res.stderr and len(res.stderr.strip().splitlines()) == 1
