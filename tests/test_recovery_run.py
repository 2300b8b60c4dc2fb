"""Recoveries end to end through dlio_benchmark (docs/recovery.md): a tiered
job coming back from its local tier, a lost rank's part moved from its peer
over MPI, a clique that lost every copy sent to the persistent tier, a later
run resuming from the newest whole persistent step on a file system and on a
real S3 server (SeaweedFS), every byte verified, RECOVERY's figures checked
against the plan and the server's own request counters."""
import re
from pathlib import Path

import pytest

from conftest import BUCKET
from dlio_ckpt_ext.tools.presets import compose_config
from dlio_run import SHRINK, UPSTREAM, run_dlio
from test_recovery import killed_during
from test_tiers_run import tiers

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PRESET = "llama3_8b_checkpoint"
VERIFY = ["++workload.streaming.verify=True"]


def recovered(local: Path, *extra: str) -> list[str]:
    """Four saves, the 2nd and 4th also persistent, then one recovery, every byte verified."""
    return [*tiers(local), "++workload.checkpoint.num_checkpoints_read=1", *VERIFY, *extra]


def parts(ranks: int, *overrides: str, model: str = PRESET) -> list[int]:
    cfg = compose_config(model, [*SHRINK, *overrides], ranks)
    return [cfg.layout.rank_plan(cfg.shape, cfg.parallelism, ranks, r).total_bytes for r in range(ranks)]


def restored(ranks: int, *overrides: str, model: str = PRESET) -> int:
    """Bytes a restore of one checkpoint reads, all ranks, by the layout's load plan."""
    cfg = compose_config(model, [*SHRINK, *overrides], ranks)
    return cfg.layout.summary(cfg.shape, cfg.parallelism, cfg.load_job(ranks), cfg.read_size)["bytes_read"]


def recovery(run) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    [r] = run.record()["recovery"]
    assert f"  recovery 1: {r['tier']} tier, " in run.stdout
    assert re.search(rf"^    time to resume +{r['time_to_resume_s']:.4f} s ", run.stdout, re.M)
    assert 0 < r["discovery_s"] <= r["time_to_resume_s"]
    return r


def test_a_tiered_job_comes_back_from_its_local_tier_and_a_later_run_resumes_from_the_persistent_one(workdir):
    local = workdir / "local"
    r = recovery(run_dlio(workdir, 4, PRESET, *SHRINK, *recovered(local)))
    size = parts(4)
    assert (r["tier"], r["step"], r["moved_bytes"], r["storage_bytes"]) == ("local", 4, 0, 0)
    assert r["local_bytes"] == sum(size)
    assert r["reason"] == "every part held locally (0 from a peer)"
    # every rank lists its local folder once; DLIO's files are found by rank 0's listings alone
    assert r["requests"] == {"local LIST": 4, "LIST": 2}
    # a later run, no tiers: the newest whole persistent step, found and read back, every byte verified
    later = run_dlio(workdir, 4, PRESET, *SHRINK, "++workload.checkpoint.num_checkpoints_write=0",
                     "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.resume=latest", *VERIFY,
                     out="later")
    r = recovery(later)
    assert (r["tier"], r["step"], r["checkpoint"], r["storage_bytes"]) == ("persistent", 4, "global_epoch1_step4",
                                                                           sum(size))
    assert later.record()["load"]["per_checkpoint"][0]["bytes"] == sum(size)


def test_a_lost_rank_gets_its_part_from_its_peer_over_mpi(workdir):
    local = workdir / "local"
    run = run_dlio(workdir, 4, PRESET, *SHRINK, *recovered(local, "++workload.recovery.lost_ranks=[1]"))
    r = recovery(run)
    size = parts(4)
    assert (r["tier"], r["step"], r["moved_to"], r["storage_bytes"]) == ("local", 4, [1], 0)
    assert r["moved_bytes"] == size[1]  # the part's bytes crossed once, from rank 0 (its clique peer)
    assert r["local_bytes"] == sum(size)  # three own parts and the one sent
    assert not list((local / "1").iterdir())  # the lost rank's disk stays empty
    assert "    lost ranks                 [1]; parts received from a peer by [1]" in run.stdout


def test_a_clique_that_lost_every_copy_sends_the_job_to_the_persistent_tier(workdir):
    local = workdir / "local"
    run = run_dlio(workdir, 4, PRESET, *SHRINK, *recovered(local, "++workload.recovery.lost_ranks=[0,1]"))
    r = recovery(run)
    assert (r["tier"], r["step"], r["moved_bytes"], r["local_bytes"]) == ("persistent", 4, 0, 0)
    assert r["reason"] == "clique [0, 1] lost every copy of rank 0's part of iteration 4"
    assert r["storage_bytes"] == sum(parts(4))


MEGATRON = "megatron_llama3_8b_checkpoint"


def test_on_s3_a_lost_clique_restores_from_the_bucket_and_a_later_run_passes_over_a_half_written_step(s3, workdir):
    """2 ranks, Megatron's files on SeaweedFS: both ranks lost (one clique), so the
    job restores persistent step 4 from the bucket; then step 4 is left as a
    killed save leaves it (no .metadata, the tracker naming 2) and a later run
    with resume=latest restores step 2, naming step 4, every byte verified."""
    storage = ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/recovery"]
    env = s3.env()
    run = run_dlio(workdir, 2, MEGATRON, *SHRINK, *storage, *recovered(workdir / "local", "++workload.recovery."
                                                                        "lost_ranks=[0,1]"),
                   env=env, checkpoint_folder="mega")
    r = recovery(run)
    size = restored(2, model=MEGATRON)
    assert (r["tier"], r["step"], r["checkpoint"]) == ("persistent", 4, "iter_0000004")
    assert r["storage_bytes"] == size and r["local_bytes"] == r["moved_bytes"] == 0
    # every rank: the tracker probed and read, the iteration folder listed, metadata.json probed and read;
    # rank 0 lists the checkpoint folder (ours, to name what was passed over) and reads .metadata (how it was
    # saved); each rank lists its local folder
    assert r["requests"] == {"HEAD": 4, "GET": 5, "LIST": 3, "local LIST": 2}
    # the killed save: rank 0's commit files gone, the tracker still naming iteration 2
    client = s3.client()
    for key in (".metadata", "metadata.json"):
        client.delete_object(Bucket=BUCKET, Key=f"recovery/mega/iter_0000004/{key}")
    client.put_object(Bucket=BUCKET, Key="recovery/mega/latest_checkpointed_iteration.txt", Body=b"2")
    later = run_dlio(workdir, 2, MEGATRON, *SHRINK, *storage, "++workload.checkpoint.num_checkpoints_write=0",
                     "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.resume=latest", *VERIFY,
                     env=env, checkpoint_folder="mega", out="later")
    r = recovery(later)
    assert (r["tier"], r["step"], r["skipped"]) == ("persistent", 2, ["iter_0000004"])
    assert r["storage_bytes"] == size
    assert ("[WARNING] half-written checkpoint iter_0000004 skipped (no commit, or files missing or short): "
            "restoring iter_0000002") in later.output
    assert "    passed over                iter_0000004 (half-written)" in later.stdout


def test_the_server_counts_the_requests_the_discovery_counts(s3, workdir):
    """torchtitan's search at 2 ranks for checkpoints saved at 4: every request our client counted,
    SeaweedFS answered."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("discovery_bench", Path(__file__).parents[1] / "bench" /
                                                  "discovery_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from conftest import tool
    got = bench.measure(s3, "dcp", 2, tool("mpirun"), BUCKET, saved_at=4)
    assert (got["found"], got["skipped"], got["saved_world"]) == ("step-2", ["step-3"], 4)
    # 2 ranks x (a listing, and two markers probed in each of 3 step folders), then rank 0's read of .metadata
    assert got["ours"] == {"LIST": 2, "HEAD": 12, "GET": 1}
    assert sum(got["server"].values()) == 15 and got["server"]["LIST"] == 2


def test_on_s3_a_lost_rank_s_part_moves_from_its_peer_and_nothing_is_read_from_the_bucket(s3, workdir):
    storage = ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/peer"]
    run = run_dlio(workdir, 2, MEGATRON, *SHRINK, *storage, *recovered(workdir / "local", "++workload.recovery."
                                                                        "lost_ranks=[1]"),
                   env=s3.env(), checkpoint_folder="mega")
    r = recovery(run)
    size = parts(2, model=MEGATRON)
    assert (r["tier"], r["step"], r["moved_to"], r["storage_bytes"]) == ("local", 4, [1], 0)
    assert r["moved_bytes"] == size[1] and r["local_bytes"] == sum(size)
    assert "[INFO] checkpoint recovery 1/1: returned after " in run.stdout or UPSTREAM
