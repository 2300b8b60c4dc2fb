"""The megatron layout end to end through dlio_benchmark: Megatron-LM's files on a
local file system and on a real S3 server, restores at the same and another
world size, every byte verified, the server's own counters equal to the plan."""
import pytest

from conftest import BUCKET
from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.tools.presets import compose_config
from dlio_run import SHRINK, run_dlio
from test_restore_run import SAVE_ONLY, framework, loaded, restored_as_planned

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PRESET = "megatron_llama3_8b_checkpoint"
TP2 = ["++workload.model.parallelism.tensor=2"]


def planned_files(ranks: int, *overrides: str) -> dict[str, int]:
    cfg = compose_config(PRESET, [*SHRINK, *overrides], ranks)
    return cfg.layout.saved_files(cfg.shape, cfg.parallelism, ranks)


def test_saves_write_megatrons_files_and_the_shared_restore_verifies_on_a_local_file_system(tmp_path):
    """4 ranks at TP2 (2 data-parallel replicas): 2 saves, then the fully parallel load
    (restore=framework, share=broadcast) of the last, every byte checked."""
    run = run_dlio(tmp_path, 4, PRESET, *SHRINK, *TP2, "++workload.checkpoint.num_checkpoints_write=2",
                   "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.restore=framework",
                   "++workload.checkpoint.share=broadcast", "++workload.streaming.verify=True",
                   "++workload.streaming.read_size=1MiB")
    assert run.returncode == 0, run.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    want = planned_files(4, *TP2)
    for step in (1, 2):
        assert {p.name: p.stat().st_size for p in (ckpt / f"iter_{step:07d}").iterdir()} == want
    assert (ckpt / "latest_checkpointed_iteration.txt").read_bytes() == b"2"
    assert sorted(want) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp",
                            "metadata.json"]
    assert "[INFO] inventory: 13 files present, 13 expected, sizes match" in run.stdout
    restore = run.record()["restore"]
    cfg = compose_config(PRESET, [*SHRINK, *TP2, "++workload.checkpoint.restore=framework"], 4)
    job = cfg.load_job(4)
    plain = cfg.layout.summary(cfg.shape, cfg.parallelism, job, 1 << 20)
    # the data-parallel pair reads each weight once between them: storage serves what the plain
    # load reads less one replica's weights (and the .metadata files every other rank reads)
    assert restore["storage_bytes"] == run.record()["load"]["per_checkpoint"][0]["bytes"] < plain["storage_bytes"]
    assert restore["bytes_read"] == plain["bytes_read"] == restore["storage_bytes"] + restore["broadcast_bytes"]
    assert "RESTORE (load): restore=framework share=broadcast, 4 ranks reading the checkpoint saved at the same " \
           "world size" in run.stdout


def test_a_checkpoint_saved_by_2_ranks_on_s3_restored_at_4_with_the_planned_requests(s3, tmp_path):
    common = [*SHRINK, "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/megatron"]
    saved = run_dlio(tmp_path, 2, PRESET, *common, *SAVE_ONLY, env=s3.env(), checkpoint_folder="dp2", out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="megatron/dp2/")["Contents"]
    got = {o["Key"][len("megatron/dp2/"):]: o["Size"] for o in listed}
    assert {k: v for k, v in got.items() if k.startswith("iter_")} == {
        f"iter_0000001/{name}": size for name, size in planned_files(2).items()}
    tracker = s3.client().get_object(Bucket=BUCKET, Key="megatron/dp2/latest_checkpointed_iteration.txt")
    assert tracker["Body"].read() == b"1"
    run = restored_as_planned(s3, tmp_path, PRESET, 4, 2, common, "dp2")
    # every rank: .metadata and metadata.json whole, then parts of the two saved files
    assert all([n for n, _ in rank][:2] == [".metadata", "metadata.json"] for rank in loaded(run))
    assert layouts.get("megatron").reads_inside_files(compose_config(PRESET, [*SHRINK, *framework(2)], 4).load_job(4))
