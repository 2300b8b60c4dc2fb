"""Model loads end to end through dlio_benchmark: a publish of safetensors
shards, then serving replicas loading it with each loader's pattern, on a
local file system and on a real S3 server whose own request counters must
equal what the results (and `dlio-ckpt-report plan`) say."""
import pytest
from safetensors import safe_open

from conftest import BUCKET
from dlio_run import SHRINK, run_dlio
from test_restore_run import plan_counts

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

PRESET = "llama3_8b_model_load"
SMALL = [*SHRINK, "++workload.model_load.max_shard_size=1MB", "++workload.streaming.verify=True"]
S3 = ["++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/models"]


def loads_of(ranks: int, pattern: str, tensor: int = 1, saved: int = 0) -> list[str]:
    return [f"++workload.model_load.pattern={pattern}", f"++workload.model.parallelism.tensor={tensor}",
            "++workload.checkpoint.num_checkpoints_write=0", "++workload.checkpoint.num_checkpoints_read=2",
            f"++workload.checkpoint.saved_ranks={saved or ranks}"]


def check_results(run, ranks: int, replicas: int) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    record = run.record()
    plan = record["restore"]
    for w in record["load"]["per_checkpoint"]:  # every load: what storage served, every replica timed
        assert w["bytes"] == plan["storage_bytes"] and len(w["replica_s"]) == replicas
        assert w["slowest_replica_s"] == max(w["replica_s"].values()) <= w["duration_s"]
    assert f"MODEL LOAD: pattern={plan['pattern']}" in run.stdout
    assert f"{replicas} replica(s) of {ranks // replicas} rank(s)" in run.stdout
    assert run.metrics()[("load", "I/O")][0] > 0  # the [METRIC] lines of the loads
    assert run.dlio_summary()["metric"]  # DLIO's summary.json
    return plan


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The scaled-down 8B published by 2 ranks on a local file system, then loaded twice by 2
    one-rank replicas with vLLM's default pattern (each rank the pages of its slices)."""
    workdir = tmp_path_factory.mktemp("publish")
    run = run_dlio(workdir, 2, PRESET, *SMALL, "++workload.checkpoint.num_checkpoints_read=2")
    return workdir, run


def test_a_publish_is_safetensors_shards_the_library_reads_and_two_replicas_load_it(published):
    workdir, run = published
    plan = check_results(run, 2, 2)
    folder = workdir / "ckpt" / "publish-1"
    shards = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors")
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    names = set()
    for shard in shards:
        with safe_open(str(shard), "np") as f:
            names |= set(f.keys())
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert len(names) == 3 + 9 * 2 and "model.layers.1.mlp.down_proj.weight" in names
    # one rank a replica: each reads every tensor's pages, the whole model (and the index)
    assert plan["amplification"] > 1.99 and plan["readers_per_file_max"] == 2
    # the publish, timed and reported as a save
    assert "[INFO] checkpoint save 1, every rank done: " in run.stdout
    assert len(run.record()["save"]["per_checkpoint"]) == 1 and run.metrics()[("save", "I/O")][0] > 0


@pytest.mark.parametrize("ranks, pattern, tensor", [(1, "runai", 1), (4, "fastsafetensors", 2)])
def test_other_loaders_read_the_publish_verified(published, tmp_path, ranks, pattern, tensor):
    workdir, _ = published
    run = run_dlio(tmp_path, ranks, PRESET, *SMALL, *loads_of(ranks, pattern, tensor, saved=2),
                   checkpoint_folder=str(workdir / "ckpt"))
    plan = check_results(run, ranks, ranks // tensor)
    counts = plan_counts(PRESET, ranks, *SMALL, *loads_of(ranks, pattern, tensor, saved=2))
    assert {k: counts[k] for k in ("storage_bytes", "storage_requests")} == \
        {k: plan[k] for k in ("storage_bytes", "storage_requests")}
    if pattern == "fastsafetensors":  # each file once a replica from storage, to the other rank by broadcast
        assert plan["storage_readers_per_file_max"] == 2 and plan["broadcast_bytes"] == plan["storage_bytes"]
        assert run.record()["load"]["per_checkpoint"][0]["broadcast_bytes"] == plan["broadcast_bytes"]


@pytest.mark.parametrize("ranks, pattern, tensor", [(2, "runai", 1), (4, "safetensors", 2),
                                                    (4, "fastsafetensors", 2)])
def test_on_s3_the_server_counts_the_requests_the_results_say(s3, tmp_path, ranks, pattern, tensor):
    # runai: a vocabulary large enough (a 64 MiB embedding) that its buffers hold several
    # 1 MiB requests, so its 8 workers split each buffer and end requests between the grid's
    shape = [*SMALL, "++workload.model.transformer.vocab_size=131072"] if pattern == "runai" else SMALL
    folder = "published" + ("-big-vocab" if pattern == "runai" else "")
    if not s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"models/{folder}/").get("KeyCount"):
        saved = run_dlio(tmp_path, 2, PRESET, *shape, *S3, "++workload.checkpoint.num_checkpoints_read=0",
                         env=s3.env(), checkpoint_folder=folder, out="publish")
        assert saved.returncode == 0, saved.stderr[-3000:]
    before = s3.request_counts()
    finer = ["++workload.model_load.read_size=1MiB"] if pattern == "runai" else []
    run = run_dlio(tmp_path, ranks, PRESET, *shape, *S3, *loads_of(ranks, pattern, tensor, saved=2), *finer,
                   env=s3.env(), checkpoint_folder=folder)
    plan = check_results(run, ranks, ranks // tensor)
    gets = s3.request_counts().get("GET 206", 0) - before.get("GET 206", 0)
    assert gets == 2 * plan["storage_requests"]  # two loads, each the planned ranged GETs
    assert plan["storage_bytes"] == plan["storage_amplification"] * plan["checkpoint_bytes"]
