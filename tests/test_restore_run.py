"""Restores end to end through dlio_benchmark: checkpoints saved at one world
size read at another, on a local file system and on a real S3 server whose
own request counters must equal what `dlio-ckpt-report plan` says (one DCP
save on S3 serves every restore size)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import BUCKET
from dlio_run import SHRINK, run_dlio

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

DCP = "torchtitan_llama3_8b_checkpoint"
TINY = "llama3_tiny_checkpoint"
SAVE_ONLY = ["++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=0"]
READ_ONLY = ["++workload.checkpoint.num_checkpoints_write=0", "++workload.checkpoint.num_checkpoints_read=1",
             "++workload.streaming.verify=True", "++workload.streaming.read_size=1MiB"]


def framework(saved: int, *more: str) -> list[str]:
    return [*READ_ONLY, "++workload.checkpoint.restore=framework", f"++workload.checkpoint.saved_ranks={saved}", *more]


def loaded(run) -> list[list[tuple[str, int]]]:
    """Per rank, the (file, bytes) it read in its one load, from its own rank stats."""
    out = []
    for stats in run.rank_stats():
        (record,) = stats["phases"]["load"]
        out.append([(f["name"].split("/", 1)[1], f["nbytes"]) for f in record["files"]])
    return out


def plan_counts(workload: str, ranks: int, *overrides: str) -> dict:
    """What `dlio-ckpt-report plan` says of this load, as its --json file has it."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        res = subprocess.run([sys.executable, "-m", "dlio_ckpt_ext.report", "plan", "--workload", workload,
                              "--ranks", str(ranks), "--json", out.name, *overrides],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return json.loads(open(out.name).read())


def restored_as_planned(s3, tmp_path, workload: str, ranks: int, saved: int, common: list[str], folder: str):
    """A restore=framework run at `ranks` of a checkpoint saved at `saved` on S3, verified:
    the server's ranged GETs and the bytes read are the plan command's."""
    before = s3.request_counts()
    run = run_dlio(tmp_path, ranks, workload, *common, *framework(saved), env=s3.env(), checkpoint_folder=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    gets = s3.request_counts().get("GET 206", 0) - before.get("GET 206", 0)
    plan = plan_counts(workload, ranks, *SHRINK, *framework(saved))
    assert gets == plan["storage_requests"], (gets, plan["storage_requests"])
    assert run.record()["load"]["per_checkpoint"][0]["bytes"] == plan["bytes_read"]
    return run


def test_zero3_saved_at_2_restored_at_4_reads_its_universal_checkpoint(finished_runs, tmp_path):
    """DeepSpeed refuses a ZeRO checkpoint at another data-parallel size but its universal
    one: converted first (ds_to_universal), then every rank reads zero/optimizer_state.pt
    and every file of every parameter folder whole (ZeRO-3), as the folder holds them."""
    saved = finished_runs[0].record()["storage"]["root"]  # the tiny preset, ZeRO-3, saved by 2 ranks
    run = run_dlio(tmp_path, 4, TINY, *framework(2), checkpoint_folder=saved)
    assert run.returncode == 0, run.stderr[-3000:]
    universal = os.path.join(saved, "global_epoch1_step1_universal")
    folders = sorted(d for d in os.listdir(os.path.join(universal, "zero")) if d != "optimizer_state.pt")
    [c] = run.record()["conversions"]
    assert c["zero_folders"] == len(folders) and c["load_listings"] == 4 * len(folders)
    model0 = "zero_pp_rank_0_mp_rank_00_model_states.pt"
    files = {model0} | {"zero/optimizer_state.pt"} | {f"zero/{d}/{s}.pt" for d in folders
                                                       for s in ("fp32", "exp_avg", "exp_avg_sq", "step")}
    size = {n: os.path.getsize(os.path.join(universal, n)) for n in files}
    for rank in loaded(run):
        assert rank[:2] == [(model0, size[model0])] * 2  # the first of the list checked, then its own
        assert sorted(rank[2:]) == sorted((n, size[n]) for n in files - {model0})
    assert run.record()["restore"]["readers_per_file_max"] == 4


@pytest.fixture(scope="module")
def zero1_pipeline_on_s3(s3, tmp_path_factory):
    """ZeRO-1 with 2 pipeline stages at 4 ranks (2 data-parallel replicas) on S3:
    saved and restored as DeepSpeed restores, with the server's request counts."""
    workdir = tmp_path_factory.mktemp("zero1pp")
    shape = [*SHRINK, "++workload.model.parallelism.pipeline=2", "++workload.model.parallelism.zero_stage=1",
             "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/restore"]
    runs = {}
    for share, phases in (("none", ["++workload.checkpoint.num_checkpoints_write=1"]),
                          ("broadcast", ["++workload.checkpoint.num_checkpoints_write=0"])):
        overrides = [*shape, *phases, "++workload.checkpoint.num_checkpoints_read=1", "++workload.streaming.verify=True",
                     "++workload.streaming.read_size=1MiB", "++workload.checkpoint.restore=framework",
                     f"++workload.checkpoint.share={share}"]
        before = s3.request_counts()
        run = run_dlio(workdir, 4, TINY, *overrides, env=s3.env(), checkpoint_folder="zero1pp", out=f"out-{share}")
        assert run.returncode == 0, run.stderr[-3000:]
        after = s3.request_counts()
        runs[share] = (run, after.get("GET 206", 0) - before.get("GET 206", 0),
                       plan_counts(TINY, 4, *[o for o in overrides if "storage" not in o]))
    return runs


def test_every_data_parallel_replica_reads_its_stages_layer_files_as_the_server_counts(zero1_pipeline_on_s3):
    run, gets, plan = zero1_pipeline_on_s3["none"]
    names = [[n for n, _ in rank] for rank in loaded(run)]
    # ranks 0 and 2 are stage 0 of replicas 0 and 1: the same layer files, written once by replica 0
    assert [n for n in names[0] if n.startswith("layer_")] == [n for n in names[2] if n.startswith("layer_")] != []
    assert run.record()["restore"]["readers_per_file_max"] == 2
    assert gets == plan["storage_requests"] == plan["requests"]  # the server's ranged GETs, as planned


def test_sharing_serves_the_replicated_files_once_and_every_rank_still_gets_its_bytes(zero1_pipeline_on_s3):
    alone, alone_gets, alone_plan = zero1_pipeline_on_s3["none"]
    run, gets, plan = zero1_pipeline_on_s3["broadcast"]
    assert gets == plan["storage_requests"] < alone_gets
    restore = run.record()["restore"]
    window = run.record()["load"]["per_checkpoint"][0]
    # storage served each layer file once (1/DP of the replicas' reads); the other replica got it by broadcast,
    # verified on arrival (streaming.verify), so every rank still holds every byte it reads alone
    assert window["bytes"] == restore["storage_bytes"] == alone_plan["bytes_read"] - restore["broadcast_bytes"]
    assert window["broadcast_bytes"] == restore["broadcast_bytes"] > 0
    # DP = 2: each layer file came from storage once, to one replica, and by broadcast to the other
    layer_bytes = sum(n for rank in loaded(alone)[:2] for name, n in rank if name.startswith("layer_"))
    assert restore["broadcast_bytes"] == layer_bytes
    assert alone.record()["load"]["per_checkpoint"][0]["bytes"] - window["bytes"] == layer_bytes
    assert "from storage / broadcast" in run.stdout and "received by broadcast" in run.stdout


#: each rank's saved files a DCP restore of a checkpoint saved at 4 reads, at 2 and 3 ranks: those whose
#: rows meet its new rows (here whole: the layers' row splits all fall the same way)
SAVED_FILES = {2: [[0, 1], [2, 3]], 3: [[0, 1], [1, 2], [2, 3]]}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_plan_counts_equal_the_servers_for_a_dcp_restore_at_1_2_3_and_4_ranks(s3, tmp_path, ranks):
    """A DCP checkpoint saved at 4 on S3, restored at 1 to 4 ranks, every byte verified: the server's
    ranged GETs and the bytes read are the plan command's, and at 2 and 3 each rank reads .metadata
    then the overlapping saved files."""
    folder = "dcp4"
    common = [*SHRINK, "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/restore"]
    if not s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"restore/{folder}/").get("KeyCount"):
        saved = run_dlio(tmp_path, 4, DCP, *common, *SAVE_ONLY, env=s3.env(), checkpoint_folder=folder, out="save")
        assert saved.returncode == 0, saved.stderr[-3000:]
    before = s3.request_counts()
    run = run_dlio(tmp_path, ranks, DCP, *common, *framework(4), env=s3.env(), checkpoint_folder=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    gets = s3.request_counts().get("GET 206", 0) - before.get("GET 206", 0)
    plan = plan_counts(DCP, ranks, *SHRINK, *framework(4))
    assert gets == plan["storage_requests"], (gets, plan["storage_requests"])
    assert run.record()["load"]["per_checkpoint"][0]["bytes"] == plan["bytes_read"]
    assert "[INFO] inventory: 5 files present, 5 expected, sizes match" in run.stdout  # the saved layout's
    if ranks not in SAVED_FILES:
        return
    stored = {o["Key"].rsplit("/", 1)[1]: o["Size"]
              for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"restore/{folder}/step-1/")["Contents"]}
    want = [[(".metadata", stored[".metadata"])] + [(f"__{f}_0.distcp", stored[f"__{f}_0.distcp"]) for f in files]
            for files in SAVED_FILES[ranks]]
    assert loaded(run) == want
    total = sum(n for rank in want for _, n in rank)
    record = run.record()
    assert record["load"]["per_checkpoint"][0]["bytes"] == total == record["restore"]["bytes_read"]
    size = sum(stored.values())
    assert record["restore"]["checkpoint_bytes"] == size
    assert f"RESTORE (load): restore=framework share=none, {ranks} ranks reading a checkpoint saved at 4 ranks, " \
           "resharded" in run.stdout
    assert f"{total} ({total / size:.3f}x the checkpoint's {size} bytes)" in run.stdout


@pytest.mark.slow  # ZeRO-3 2 -> 4 runs locally in the default suite; this is the same on S3
def test_zero3_saved_at_2_on_s3_restored_at_4_verified_with_the_planned_requests(s3, tmp_path):
    common = [*SHRINK, "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/restore"]
    saved = run_dlio(tmp_path, 2, TINY, *common, *SAVE_ONLY, env=s3.env(), checkpoint_folder="zero3", out="save")
    assert saved.returncode == 0, saved.stderr[-3000:]
    before = s3.request_counts()
    run = run_dlio(tmp_path, 4, TINY, *common, *framework(2), env=s3.env(), checkpoint_folder="zero3")
    assert run.returncode == 0, run.stderr[-3000:]
    gets = s3.request_counts().get("GET 206", 0) - before.get("GET 206", 0)
    plan = plan_counts(TINY, 4, *SHRINK, *framework(2))
    [c] = run.record()["conversions"]
    # the universal conversion's reads, then the load's: every ranged GET the server answered
    assert gets == c["read_requests"] + plan["storage_requests"]
    assert run.record()["load"]["per_checkpoint"][0]["bytes"] == plan["bytes_read"]
    assert all(rank[0][0] == "zero_pp_rank_0_mp_rank_00_model_states.pt" and
               sum(1 for n, _ in rank if n.endswith("/fp32.pt")) == c["zero_folders"] for rank in loaded(run))
