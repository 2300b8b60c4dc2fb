"""The orbax layout end to end through dlio_benchmark: MaxText's Orbax checkpoints
on a local file system (written into the temporary folder, renamed at the
commit) and on a real S3 server (in place, with commit_success.txt), restores
at the same and another world size, every byte verified, the server's own
counters equal to the plan."""
import pytest

from conftest import BUCKET
from dlio_ckpt_ext.tools.presets import compose_config
from dlio_run import SHRINK, run_dlio
from test_restore_run import SAVE_ONLY, restored_as_planned

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PRESET = "maxtext_llama3_8b_checkpoint"
REPLICAS = ["++workload.checkpoint.replicas=2"]


def summary(ranks: int, *overrides: str, share: str = "none") -> dict:
    cfg = compose_config(PRESET, [*SHRINK, *overrides], ranks)
    return cfg.layout.summary(cfg.shape, cfg.parallelism, cfg.load_job(ranks), cfg.read_size, share)


def test_two_replicas_save_renamed_checkpoints_and_restore_them_from_the_first_replica(tmp_path):
    """4 ranks, 2 replicas of 2 FSDP processes: 2 saves, then the single-replica
    restore (restore=framework, share=broadcast) of the last, every byte checked."""
    run = run_dlio(tmp_path, 4, PRESET, *SHRINK, *REPLICAS, "++workload.checkpoint.num_checkpoints_write=2",
                   "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.restore=framework",
                   "++workload.checkpoint.share=broadcast", "++workload.streaming.verify=True",
                   "++workload.streaming.read_size=1MiB")
    assert run.returncode == 0, run.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["1", "2"]  # no temporary folder
    cfg = compose_config(PRESET, [*SHRINK, *REPLICAS], 4)
    want = cfg.layout.saved_files(cfg.shape, cfg.parallelism, 4)
    for step in ("1", "2"):
        got = {str(p.relative_to(ckpt / step)): p.stat().st_size for p in (ckpt / step).rglob("*") if p.is_file()}
        assert got == want
    # Orbax's text, the folder named relative to the checkpoint folder (the plan knows no absolute path)
    assert (ckpt / "2" / "commit_success.txt").read_text() == "Checkpoint commit was successful to ."
    assert (ckpt / "2" / "items" / "commit_success.txt").read_text() == "Checkpoint commit was successful to items"
    assert len(list((ckpt / "2" / "items").glob("ocdbt.process_*"))) == 4  # a folder a rank of 8 devices
    assert f"[INFO] inventory: {2 * len(want)} files present, {2 * len(want)} expected, sizes match" in run.stdout
    restore = run.record()["restore"]
    plain = summary(4, *REPLICAS, "++workload.checkpoint.restore=framework")
    shared = summary(4, *REPLICAS, "++workload.checkpoint.restore=framework", share="broadcast")
    assert restore["storage_bytes"] == shared["storage_bytes"] == run.record()["load"]["per_checkpoint"][0]["bytes"]
    # the chunks come from storage once, not once a replica (the metadata every rank reads aside)
    metadata = sum(size for name, size in want.items() if name in (
        "_CHECKPOINT_METADATA", "items/_METADATA", "items/manifest.ocdbt") or name.startswith("items/d/"))
    assert 2 * (shared["storage_bytes"] - metadata) == plain["storage_bytes"] - 4 * metadata
    assert restore["bytes_read"] == plain["bytes_read"] == restore["storage_bytes"] + restore["broadcast_bytes"]


def test_a_checkpoint_saved_by_2_processes_on_s3_restored_at_4_with_the_planned_requests(s3, tmp_path):
    common = [*SHRINK, "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/orbax"]
    saved = run_dlio(tmp_path, 2, PRESET, *common, *SAVE_ONLY, env=s3.env(), checkpoint_folder="fsdp2", out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="orbax/fsdp2/")["Contents"]
    got = {o["Key"][len("orbax/fsdp2/"):]: o["Size"] for o in listed}
    cfg = compose_config(PRESET, list(SHRINK), 2)
    # an object store cannot rename: written in place, the commit said by commit_success.txt
    assert {k: v for k, v in got.items() if k.startswith("1/")} == {
        f"1/{name}": size for name, size in cfg.layout.saved_files(cfg.shape, cfg.parallelism, 2).items()}
    assert "1/commit_success.txt" in got and "1/items/commit_success.txt" in got
    restored_as_planned(s3, tmp_path, PRESET, 4, 2, common, "fsdp2")
