"""A job coming back at another size, end to end through dlio_benchmark
(docs/recovery.md): each layout saved at 2 ranks, then resumed with
checkpoint.resume=latest and no other key at 4 ranks and at 1, every byte
verified (the smallest worlds that grow and shrink: each rank start costs
DLIO's imports, about 5 s of a core); RESULTS names the world size the checkpoint was saved at and where
it was read. On SeaweedFS for DCP. A run that fails leaves no claim on its
folders, and the next one starts without a warning."""
import pytest

from conftest import BUCKET
from dlio_ckpt_ext.result_files import OWNER_FILE
from dlio_ckpt_ext.tools.presets import compose_config
from dlio_run import SHRINK, run_dlio
from test_recovery_run import recovery

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

VERIFY = "++workload.streaming.verify=True"
SAVE = ["++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=0",
        "++workload.checkpoint.keep_files=True"]
RESUME = ["++workload.checkpoint.num_checkpoints_write=0", "++workload.checkpoint.num_checkpoints_read=1",
          "++workload.checkpoint.resume=latest", VERIFY]
#: each framework's preset (DLIO's own files: MLPerf's), and where its record says how it was saved
LAYOUTS = {
    "dlio": ("llama3_8b_checkpoint", [], "the zero_pp_rank_*_mp_rank_* names (DeepSpeed's glob)"),
    "deepspeed": ("llama3_8b_checkpoint", ["++workload.checkpoint.deepspeed_files=deepspeed"],
                  "the zero_pp_rank_*_mp_rank_* names (DeepSpeed's glob)"),
    "dcp": ("torchtitan_llama3_8b_checkpoint", [], "DCP's .metadata plan"),
    "megatron": ("megatron_llama3_8b_checkpoint", [], "Megatron's sharded metadata (.metadata)"),
    "orbax": ("maxtext_llama3_8b_checkpoint", ["++workload.checkpoint.devices_per_rank=1"],
              "items/_sharding's device mesh and the ocdbt.process_* folders"),
}


#: the world a checkpoint is saved at, and the worlds it comes back at (grown, shrunk)
SAVED_AT, RESUMED_AT = 2, (4, 1)


def restored(preset: str, extra: list[str], ranks: int, saved: int) -> int:
    """Bytes the resharded load of a checkpoint saved at `saved` reads at `ranks`, by the layout's plan."""
    cfg = compose_config(preset, [*SHRINK, *extra, *RESUME, "++workload.checkpoint.restore=framework",
                                  f"++workload.checkpoint.saved_ranks={saved}"], ranks)
    return cfg.layout.summary(cfg.shape, cfg.parallelism, cfg.load_job(ranks), cfg.read_size)["bytes_read"]


#: DeepSpeed's own file names come back at another size through the same universal conversion as
#: DLIO's: without DLIO in tests/test_resume_resized.py (every layout), end to end here by DLIO's files
RESUMED_END_TO_END = [name for name in LAYOUTS if name != "deepspeed"]


@pytest.mark.parametrize("layout", RESUMED_END_TO_END)
def test_a_checkpoint_saved_at_2_ranks_is_resumed_at_4_and_at_1(workdir, layout):
    preset, extra, source = LAYOUTS[layout]
    saved = run_dlio(workdir, SAVED_AT, preset, *SHRINK, *extra, *SAVE, out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    for ranks, keep in zip(RESUMED_AT, (True, False)):
        run = run_dlio(workdir, ranks, preset, *SHRINK, *extra, *RESUME, f"++workload.checkpoint.keep_files={keep}",
                       out=f"resume{ranks}", timeout=600)
        r = recovery(run)
        assert (r["tier"], r["step"], r["skipped"], r["saved_ranks"], r["restore"]) == \
            ("persistent", 1, [], SAVED_AT, "framework")
        assert r["saved_shape"]["world"] == SAVED_AT and r["saved_shape"]["source"] == source
        assert r["storage_bytes"] == restored(preset, extra, ranks, SAVED_AT)
        assert f"    saved by                   {SAVED_AT} ranks" in run.stdout
        assert f"({source}); restored at {ranks} ranks through " in run.stdout
        assert "half-written" not in run.output
        if layout in ("dlio", "deepspeed"):  # ZeRO-3 at another DP size: ds_to_universal first
            c = r["conversion"]
            assert c["zero_folders"] == 2 * 6 + 3  # one a parameter of the 2-layer model
            assert c["deleted_files"] == 4 * SAVED_AT * c["zero_folders"] and c["load_listings"] == ranks * 15
            assert "    universal conversion       " in run.stdout
            universal = workdir / "ckpt" / f"{r['checkpoint']}_universal"
            if keep:  # the universal checkpoint stays, as ds_to_universal leaves it: no fragments left
                assert len(list((universal / "zero").iterdir())) == c["zero_folders"] + 1  # + optimizer_state.pt
                assert not (universal / "tmp").exists()
            else:  # keep_files=False: the conversion's files go with the run, the checkpoint stays
                assert not universal.exists() and not (workdir / "ckpt" / "latest_universal").exists()
                assert (workdir / "ckpt" / r["checkpoint"]).is_dir()
    if layout == "dlio":  # a restore named by hand at another size converts too, and says so
        run = run_dlio(workdir, 1, preset, *SHRINK, *extra, "++workload.checkpoint.num_checkpoints_write=0",
                       "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.restore=framework",
                       f"++workload.checkpoint.saved_ranks={SAVED_AT}", VERIFY, out="restore")
        assert run.returncode == 0, run.stderr[-3000:]
        [c] = run.record()["conversions"]
        assert (c["checkpoint"], c["zero_folders"], c["load_listings"]) == ("global_epoch1_step1", 15, 15)
        assert "CONVERSION (DeepSpeed's universal checkpoint, made before the load; docs/recovery.md)" in run.stdout
        assert run.record()["load"]["per_checkpoint"][0]["bytes"] == restored(preset, extra, 1, SAVED_AT)


def test_on_s3_a_dcp_checkpoint_saved_at_2_ranks_is_resumed_at_1(s3, workdir):
    storage = ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/resized"]
    preset, extra, source = LAYOUTS["dcp"]
    saved = run_dlio(workdir, 2, preset, *SHRINK, *storage, *SAVE, env=s3.env(), checkpoint_folder="titan",
                     out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    run = run_dlio(workdir, 1, preset, *SHRINK, *storage, *RESUME, env=s3.env(), checkpoint_folder="titan",
                   out="resume")
    r = recovery(run)
    assert (r["step"], r["saved_ranks"], r["saved_shape"]["source"]) == (1, 2, source)
    assert r["storage_bytes"] == restored(preset, extra, 1, 2)
    # torchtitan's search (a listing, two markers probed in the one step folder) on the rank,
    # then its read of .metadata
    assert r["requests"] == {"LIST": 1, "HEAD": 2, "GET": 1}


def test_a_run_that_fails_leaves_no_claim_and_the_next_starts_without_a_warning(workdir):
    preset, extra, _ = LAYOUTS["dcp"]
    ckpt = workdir / "ckpt"
    saved = run_dlio(workdir, 2, preset, *SHRINK, *SAVE, out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    # refused: a saved_ranks the checkpoint contradicts (every rank stops together, exit 2)
    refused = run_dlio(workdir, 1, preset, *SHRINK, *RESUME, "++workload.checkpoint.saved_ranks=8", out="refused")
    assert refused.returncode == 2, refused.output[-3000:]
    assert "workload.checkpoint.saved_ranks=8 disagrees with " in refused.stderr
    assert not (ckpt / OWNER_FILE).exists() and not (workdir / "refused" / OWNER_FILE).exists()
    # failed: a load whose file is short (exit 1 from the rank that found it)
    data = ckpt / "step-1" / "__1_0.distcp"
    data.write_bytes(data.read_bytes()[:-4096])
    failed = run_dlio(workdir, 2, preset, *SHRINK, "++workload.checkpoint.num_checkpoints_write=0",
                      "++workload.checkpoint.num_checkpoints_read=1", out="failed")
    assert failed.returncode != 0 and "__1_0.distcp" in failed.stderr, failed.output[-3000:]
    assert not (ckpt / OWNER_FILE).exists() and not (workdir / "failed" / OWNER_FILE).exists()
    later = run_dlio(workdir, 2, preset, *SHRINK, *SAVE, "++workload.checkpoint.keep_files=False", out="later")
    assert later.returncode == 0, later.stderr[-3000:]
    assert "taking over" not in later.output


def test_a_tiered_job_coming_back_at_another_size_restores_from_the_persistent_tier(workdir):
    """NVRx's local checkpoints come back only at the world size they were saved
    at: a tiered job saved at 4 and recovering at 2 restores the persistent
    step, resharded, and RECOVERY says why (2 is the least the tiers take: a
    copy on another node)."""
    from test_tiers_run import tiers
    local = workdir / "local"
    saved = run_dlio(workdir, 4, "llama3_8b_checkpoint", *tiers(local), "++workload.checkpoint.keep_files=True",
                     out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    run = run_dlio(workdir, 2, "llama3_8b_checkpoint", *tiers(local, writes=0),
                   "++workload.checkpoint.num_checkpoints_read=1", VERIFY, out="resume")
    r = recovery(run)
    assert (r["tier"], r["step"], r["saved_ranks"], r["local_bytes"]) == ("persistent", 4, 4, 0)
    assert r["reason"] == ("the local tier restores only at the world size it was saved at (NVRx's cliques), and "
                           "the job was saved by 4 ranks, comes back with 2")
    assert r["storage_bytes"] == restored("llama3_8b_checkpoint", [], 2, 4)
