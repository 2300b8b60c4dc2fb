"""torch.distributed.checkpoint layout and async save (torchtitan), end to end
through dlio_benchmark on either DLIO, local and on a real S3 server."""
import re

import pytest

from conftest import BUCKET
from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.shared_plans import plan
from dlio_ckpt_ext.layouts import dcp as dcp_layout
from dlio_run import UPSTREAM, run_dlio

PRESET = "torchtitan_llama3_8b_checkpoint"
SMALL = dict(L=2, h=512, f=1792, V=8192, heads=8, kv=2)
SCALE = [f"++workload.model.num_layers={SMALL['L']}", f"++workload.model.transformer.hidden_size={SMALL['h']}",
         f"++workload.model.transformer.ffn_hidden_size={SMALL['f']}",
         f"++workload.model.transformer.vocab_size={SMALL['V']}",
         f"++workload.model.transformer.num_attention_heads={SMALL['heads']}",
         f"++workload.model.transformer.num_kv_heads={SMALL['kv']}"]
MiB = 1 << 20


def llama_tensors(L, h, f, V, heads, kv):
    dkv = h // heads * kv
    return [(V, h)] + [(h, 1), (h, h), (dkv, h), (dkv, h), (h, h), (h, 1), (f, h), (f, h), (h, f)] * L \
        + [(h, 1), (V, h)]


def dcp_expected(ranks, steps, L, h, f, V, heads, kv):
    """As torch 2.14.1 saved our test model (fidelity/manifests/dcp-*): step-N/__{r}_0.distcp
    holds rank r's torch.chunk row slices of every tensor x 12 bytes (fp32 weight + 2
    fp32 Adam moments), each of its 3 items wrapped by torch.save (1,577 B more); the
    ranks after 0 share out evenly each tensor's `step` (1,581 B) and its 11 param_groups
    values (1,261 B each). .metadata: 231 B a key (15 a tensor), 237 a saved chunk."""
    tensors = llama_tensors(L, h, f, V, heads, kv)

    def rank_rows(rows, r):
        per = -(-rows // ranks)
        pieces = [range(rows)[i:i + per] for i in range(0, rows, per)]
        return len(pieces[r]) if r < len(pieces) else 0

    def shared(count, r):  # of `count` replicated items, rank r's
        if ranks == 1:
            return count
        return 0 if r == 0 else len([i for i in range(count) if 1 + i * (ranks - 1) // count == r])
    out = {}
    for s in steps:
        for r in range(ranks):
            held = [(rows, cols) for rows, cols in tensors if rank_rows(rows, r)]
            out[f"step-{s}/__{r}_0.distcp"] = (12 * sum(rank_rows(rows, r) * cols for rows, cols in held)
                                              + 3 * 1577 * len(held) + 1581 * shared(len(tensors), r)
                                              + 1261 * shared(11 * len(tensors), r))
        chunks = sum(3 for r in range(ranks) for rows, _ in tensors if rank_rows(rows, r))
        out[f"step-{s}/.metadata"] = 231 * 15 * len(tensors) + 237 * chunks
    return out


# -- the plan -------------------------------------------------------------------
def test_torchtitan_8b_is_12_bytes_per_parameter_and_deepspeed_14():
    shape = plan.ModelShape(32, 4096, 14336, 128256, 32, 8, "fp32", "fp32")
    n = plan.num_parameters(shape)
    assert round(n / 1e9, 2) == 8.03
    dcp = plan.Parallelism(zero_stage=3, layout="dcp")
    shards = sum(layouts.rank_plan(shape, dcp, 8, r).files[0].size for r in range(8))
    items = 8 * 3 * (9 * 32 + 3)
    assert shards == 12 * n + 1577 * items + (1581 + 11 * 1261) * (9 * 32 + 3) and round(shards / 1e9, 1) == 96.4
    assert layouts.checkpoint_bytes(shape, dcp, 8) == shards + 231 * 15 * (9 * 32 + 3) + 237 * items
    expected = dcp_expected(8, [1], 32, 4096, 14336, 128256, 32, 8)
    assert {f"step-1/{f.name}": f.size for r in range(8) for f in
            layouts.rank_plan(shape, dcp, 8, r).files + layouts.rank_plan(shape, dcp, 8, r).commit_files} == expected
    deepspeed = plan.ModelShape(32, 4096, 14336, 128256, 32, 8, "fp16", "fp32")
    assert abs(layouts.checkpoint_bytes(deepspeed, plan.Parallelism(zero_stage=3), 8) / n - 14) < 0.01


def test_uneven_rows_follow_torch_chunk_and_only_rank_0_commits():
    shape = plan.ModelShape(1, 8, 12, 10, 2, 1, "fp32", "fp32")
    dcp = plan.Parallelism(layout="dcp")
    plans = [layouts.rank_plan(shape, dcp, 3, r) for r in range(3)]
    expected = dcp_expected(3, [1], 1, 8, 12, 10, 2, 1)
    assert [p.files[0].size for p in plans] == [expected[f"step-1/__{r}_0.distcp"] for r in range(3)]
    rows = [sum(x[2] for x in dcp_layout.items(shape, 3, r)) for r in range(3)]
    assert rows[0] > rows[2]  # the last rank's chunks run short
    assert sum(p.files[0].size for p in plans) - sum(expected[f"step-1/__{r}_0.distcp"] for r in range(3)) == 0
    assert sum(p.files[0].size for p in plans) > 12 * plan.num_parameters(shape)
    assert [p.commit_files for p in plans[1:]] == [(), ()] and plans[0].commit_files[0].name == ".metadata"


def test_subset_mode_writes_the_full_jobs_shards_of_the_ranks_that_run():
    shape = plan.ModelShape(2, 64, 128, 100, 4, 2, "fp32", "fp32")
    full = [layouts.rank_plan(shape, plan.Parallelism(layout="dcp"), 8, r) for r in range(2)]
    subset = [layouts.rank_plan(shape, plan.Parallelism(data=8, mode="subset", layout="dcp"), 2, r) for r in range(2)]
    assert subset == full  # the shards (and .metadata) of ranks 0 and 1 of an 8-rank job


@pytest.mark.parametrize("par, key", [(plan.Parallelism(tensor=2, layout="dcp"), "model.parallelism.tensor"),
                                      (plan.Parallelism(layout="fsdp"), "checkpoint.layout")])
def test_layouts_we_cannot_plan_are_refused_by_name(par, key):
    with pytest.raises(Exception, match=key):
        layouts.rank_plan(plan.ModelShape(2, 64, 128, 100, 4, 2), par, 2, 0)


# -- end to end -----------------------------------------------------------------
def _persist_order(run, steps):
    """Per step: the latest end of any rank's shard file, and .metadata's start."""
    shards, commits = {}, {}
    for stats in run.rank_stats():
        for rec in stats["phases"]["save"]:
            for f in rec["files"]:
                step = f["name"].split("/")[0]
                if f["name"].endswith(".metadata"):
                    commits[step] = f["start"]
                else:
                    shards[step] = max(shards.get(step, 0.0), f["end"])
    return [(shards[f"step-{s}"], commits[f"step-{s}"]) for s in steps]


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["disabled", "async"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_dcp_layout_two_ranks_sync_and_async(request, workdir, mode, where):
    env, folder = None, None
    extra = [f"++workload.checkpoint.async_mode={mode}", "++workload.checkpoint.num_checkpoints_write=2",
             "++workload.checkpoint.num_checkpoints_read=2", "++workload.streaming.verify=True"]
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        env, folder = s3.env(), f"dcp-{mode}"
        extra += ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/t"]
    run = run_dlio(workdir, 2, PRESET, *SCALE, *extra, env=env, checkpoint_folder=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = dcp_expected(2, [1, 2], **SMALL)
    if where == "s3":
        listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"t/{folder}/")["Contents"]
        found = {o["Key"][len(f"t/{folder}/"):]: o["Size"] for o in listed}
    else:
        found = {str(p.relative_to(workdir / "ckpt")): p.stat().st_size for p in (workdir / "ckpt").rglob("*")
                 if p.is_file()}
    assert found == expected
    for shard_end, commit_start in _persist_order(run, [1, 2]):
        assert commit_start >= shard_end  # .metadata only once every rank's file is closed
    rec = run.record()
    assert rec["inventory"]["ok"] and rec["layout"] == "dcp" and rec["async_mode"] == mode
    # verify was on: every byte read (the .metadata by both ranks, then each file) was compared
    loaded = [f["name"] for s in run.rank_stats() for r in s["phases"]["load"] for f in r["files"]]
    assert sorted(loaded) == sorted([f"step-{s}/.metadata" for s in (1, 2)] * 2
                                    + [f"step-{s}/__{r}_0.distcp" for s in (1, 2) for r in (0, 1)])
    assert ("async" in rec) == (mode == "async")
    if mode == "async":
        assert "[METRIC] Checkpoint save blocked duration" in run.stdout


def _async_run(workdir, interval, **kw):
    run = run_dlio(workdir, 2, PRESET, *SCALE, "++workload.checkpoint.async_mode=async",
                   "++workload.checkpoint.num_checkpoints_write=3", "++workload.checkpoint.num_checkpoints_read=0",
                   f"++workload.checkpoint.time_between_checkpoints={interval}", **kw)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.e2e
def test_async_interval_shorter_than_persist_waits_longer_does_not(workdir):
    short = _async_run(workdir, 0, out="short")
    rows = short.record()["async"]["per_checkpoint"]
    persist = short.record()["save"]["per_checkpoint"]
    assert [r["waited"] for r in rows] == [False, True, True]
    assert [r["kept_up"] for r in rows] == [False, False, None]
    for row, previous in zip(rows[1:], persist):
        # the wait was real: more than nothing, at most the previous persist's length
        assert 0 < row["wait_s"] <= previous["duration_s"] + 0.05
    long = _async_run(workdir, 3, out="long", checkpoint_folder=str(workdir / "ckpt2"))
    rec = long.record()["async"]
    assert [r["waited"] for r in rec["per_checkpoint"]] == [False, False, False]
    assert rec["kept_up"] == rec["judged"] == 2
    assert all(p["duration_s"] < 3 for p in long.record()["save"]["per_checkpoint"])
    for run in (short, long):
        for stats in run.rank_stats():
            for b in stats["async_blocked"]:
                assert b["staging_s"] > 0 and b["blocked_s"] == b["wait_s"] + b["staging_s"]
                assert b["call_s"] >= b["blocked_s"]  # measured around the whole call
        assert "[METRIC] Checkpoint persist duration" in run.stdout
        rec = run.record()["async"]
        if not UPSTREAM:  # our summary.json on 2.0.0 carries the async fields; upstream's is DLIO's own
            metric = run.dlio_summary()["metric"]
            assert metric["checkpoint_save_blocked_mean_seconds"] == pytest.approx(rec["blocked_s"]["mean"])
            assert metric["checkpoint_persist_kept_up"] == rec["kept_up"]
        else:
            assert "DLIO's own [METRIC] save lines time the save call" in run.stdout


@pytest.mark.e2e
def test_async_peak_rss_is_staging_plus_the_usual_bound(workdir):
    """An async run's peak RSS is a synchronous run's (same settings, same
    environment) plus the staging area and the chunk its content is generated
    into: measured both ways, so the process's own size (DLIO, TensorFlow, ...)
    cancels out."""
    sync = run_dlio(workdir, 2, PRESET, *SCALE, "++workload.checkpoint.num_checkpoints_write=3",
                    "++workload.checkpoint.num_checkpoints_read=0", out="sync", checkpoint_folder=str(workdir / "c1"))
    assert sync.returncode == 0, sync.stderr[-3000:]
    run = _async_run(workdir, 0, out="async", checkpoint_folder=str(workdir / "c2"))
    staged = dcp_expected(2, [1], **SMALL)
    baseline = {s["rank"]: s["peak_rss_bytes"] for s in sync.rank_stats()}
    for stats in run.rank_stats():
        share = staged[f"step-1/__{stats['rank']}_0.distcp"]
        assert stats["staging_bytes"] >= share
        grown = stats["peak_rss_bytes"] - baseline[stats["rank"]]
        # the staging area is really resident, and little else grows (the source chunk, a thread)
        assert 0.9 * share < grown <= stats["staging_bytes"] + 32 * MiB + 64 * MiB


@pytest.mark.e2e
def test_async_staging_that_does_not_fit_is_refused_before_any_io(workdir):
    # the real preset on 2 ranks: 48 GB of staging per rank on a 24 GiB machine
    run = run_dlio(workdir, 2, PRESET, "++workload.checkpoint.async_mode=async")
    assert run.returncode != 0
    assert "workload.checkpoint.async_mode" in run.stderr and "async staging" in run.stderr
    shares = dcp_expected(2, [1], 32, 4096, 14336, 128256, 32, 8)  # each rank's .distcp, as torch writes it
    said = [f"async staging (the rank's whole checkpoint share) {(shares[f'step-1/__{r}_0.distcp'] + 32 * MiB) / 2**30:.2f} GiB"
            for r in range(2)]
    assert any(text in run.stderr for text in said), said
    assert "GiB available" in run.stderr
    assert not (workdir / "ckpt").exists() or not any((workdir / "ckpt").rglob("*"))
    assert not re.search(r"^\[METRIC\] Checkpoint", run.output, re.M)


@pytest.mark.e2e
def test_a_failing_background_persist_aborts_the_job_with_a_message(workdir):
    # checkpoint 2's directory cannot be made: a file holds its name
    (workdir / "ckpt").mkdir()
    (workdir / "ckpt" / "step-2").write_text("in the way")
    run = run_dlio(workdir, 2, PRESET, *SCALE, "++workload.checkpoint.async_mode=async",
                   "++workload.checkpoint.num_checkpoints_write=3", "++workload.checkpoint.num_checkpoints_read=0",
                   timeout=120)
    assert run.returncode != 0
    assert "checkpoint persist failed" in run.stderr and "step-2" in run.stderr
    assert not re.search(r"^\[METRIC\] Checkpoint", run.output, re.M)
    assert not (run.out / "ckpt_ext_summary.json").exists()
