"""What a run costs besides its bytes as the ranks grow, counted where it lands:
a real SeaweedFS's own request counters (bench/scale_bench.py extrapolates the
same census to 1024 ranks, docs/benchmarks.md)."""
import pytest

from conftest import BUCKET
from dlio_run import SHRINK, WALKS_PER_RANK, run_dlio

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

RANKS = (1, 2, 4)
TWO_TWO = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=2"]
#: SeaweedFS counts a HEAD as a GET answered 200; the run's reads are all ranged (206)
NON_DATA = ("LIST", "GET 200", "DELETE", "HEAD")
#: rank 0's owner marker of the checkpoint folder (dlio/ownership.py), at any scale: read
#: back after its claim and before its removal (whole GETs), and removed (one DELETE)
MARKER_GETS, MARKER_DELETES = 2, 1


@pytest.fixture(scope="module")
def census(s3, tmp_path_factory):
    """Each rank count's requests by kind, for 2 saves + 2 loads with keep_files=False."""
    workdir = tmp_path_factory.mktemp("census")
    counts = {}
    for n in RANKS:
        before = s3.request_counts()
        run = run_dlio(workdir, n, "llama3_tiny_checkpoint", *SHRINK, *TWO_TWO,
                       "++workload.checkpoint.keep_files=False", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=s3://{BUCKET}/census", env=s3.env(),
                       checkpoint_folder=f"r{n}", out=f"out{n}")
        assert run.returncode == 0, run.stderr[-3000:]
        after = s3.request_counts()
        counts[n] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        counts[n]["objects"] = run.record()["inventory"]["expected"]
        assert f"removed the {counts[n]['objects']} checkpoint files" in run.stdout
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix="census/").get("KeyCount", 0) == 0  # all deleted
    return counts


def test_listings_heads_and_deletes_grow_at_most_linearly_with_the_ranks(census):
    non_data = {n: sum(c.get(k, 0) for k in NON_DATA) for n, c in census.items()}
    for n, c in census.items():
        # the plan knows every size: no HEAD; the only whole GETs are rank 0's marker's
        assert c.get("GET 200", 0) == MARKER_GETS and c.get("HEAD", 0) == 0, (n, c)
        # rank 0's probe, its count of the checkpoints, its inventory of each: the same at any scale
        # (with DLIO's own loop, each further rank's count of them too)
        assert c["LIST"] == census[1]["LIST"] + WALKS_PER_RANK * (n - 1) and census[1]["LIST"] <= 4, (n, c)
    # per rank added: its one delete request (and DLIO's own loop's listing), nothing else
    top = RANKS[-1]
    assert non_data[top] - non_data[1] == (1 + WALKS_PER_RANK) * (top - 1), census
    assert non_data[top] <= top * non_data[1], census


def test_each_rank_deletes_its_own_files_in_one_request_of_many_keys(census):
    for n, c in census.items():
        assert c["DELETE"] == n + MARKER_DELETES, (n, c)
        assert c["objects"] / n == 4  # 2 checkpoints x (model, optimizer) a rank, in its one request


def test_model_loads_of_one_publish_list_it_once_a_run_not_once_a_load(s3, tmp_path):
    """Three loads of one publish, at 1, 2 and 4 ranks: the publish is listed once for every
    load only in the answer to DLIO's count, never by more requests."""
    from test_model_load_run import PRESET, S3, SMALL, loads_of
    published = run_dlio(tmp_path, 2, PRESET, *SMALL, *S3, "++workload.checkpoint.num_checkpoints_read=0",
                         env=s3.env(), checkpoint_folder="census-publish", out="publish")
    assert published.returncode == 0, published.stderr[-3000:]
    counts = {}
    for n in RANKS:
        before = s3.request_counts()
        run = run_dlio(tmp_path, n, PRESET, *SMALL, *S3, *loads_of(n, "safetensors", saved=2),
                       "++workload.checkpoint.num_checkpoints_read=3", env=s3.env(),
                       checkpoint_folder="census-publish", out=f"out{n}")
        assert run.returncode == 0, run.stderr[-3000:]
        after = s3.request_counts()
        counts[n] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        per_load = run.record()["restore"]["storage_requests"]
        assert counts[n]["GET 206"] == 3 * per_load and per_load == n * counts[1]["GET 206"] / 3, counts
    for n, c in counts.items():
        assert (c.get("GET 200", 0), c.get("HEAD", 0), c["DELETE"]) == (MARKER_GETS, 0, MARKER_DELETES), (n, c)
        assert c["LIST"] == counts[1]["LIST"] + WALKS_PER_RANK * (n - 1) and counts[1]["LIST"] <= 4, (n, c)


def test_a_run_of_many_files_and_chunks_a_rank_keeps_its_output_folder_small(workdir):
    # 1T-shaped (pipeline stages of many layer files, ZeRO-1), scaled down:
    # 4 ranks x ~10 files x 5 checkpoints each way, in 1 MiB chunks
    run = run_dlio(workdir, 4, "llama3_tiny_checkpoint", "++workload.model.num_layers=32",
                   "++workload.model.parallelism.pipeline=4", "++workload.model.parallelism.zero_stage=1",
                   "++workload.model.transformer.hidden_size=256", "++workload.model.transformer.ffn_hidden_size=896",
                   "++workload.model.transformer.vocab_size=1024", "++workload.model.transformer.num_attention_heads=4",
                   "++workload.checkpoint.num_checkpoints_write=5", "++workload.checkpoint.num_checkpoints_read=5",
                   "++workload.streaming.chunk_size=1MiB", "++workload.checkpoint.keep_files=False")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = run.rank_stats()
    files = [f for r in stats for p in ("save", "load") for rec in r["phases"][p] for f in rec["files"]]
    planned = run.record()["inventory"]["expected"]  # every file of the 5 checkpoints
    assert len(files) == 2 * planned and planned / 5 / 4 >= 9
    chunks = sum(f["chunk_count"] for f in files)
    assert chunks > 4 * 400  # many chunks a rank, none of them listed one by one
    assert all("chunks" not in f and f["chunk_io_gib_s"]["p10"] <= f["chunk_io_gib_s"]["p50"] for f in files)
    size = sum(p.stat().st_size for p in run.out.rglob("*") if p.is_file())
    assert size / 4 < 1 << 20, f"{size} bytes for 4 ranks"


@pytest.mark.parametrize("preset, tracker_gets, files_a_rank, rank0_files", [
    # a distcp a rank; rank 0 also .metadata, metadata.json and the tracker (read back whole by the inventory)
    ("megatron_llama3_8b_checkpoint", 1, 1, 4),
    # a process: 2 data files (a commit each), its manifest and its array_metadatas file; process 0: 3
    # metadata commits' files and 3 data files, manifest, array_metadatas, _CHECKPOINT_METADATA,
    # _sharding, then the merged B-tree and manifest, _METADATA and the two commit_success.txt
    ("maxtext_llama3_8b_checkpoint", 0, 4, 15)])
def test_the_other_frameworks_layouts_cost_each_rank_the_same_requests_at_1_and_4_ranks(
        s3, tmp_path, preset, tracker_gets, files_a_rank, rank0_files):
    counts = {}
    for n in (1, 4):
        before = s3.request_counts()
        run = run_dlio(tmp_path, n, preset, *SHRINK, *TWO_TWO, "++workload.checkpoint.keep_files=False",
                       "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/layouts",
                       env=s3.env(), checkpoint_folder=f"{preset}-{n}", out=f"out{n}-{preset}")
        assert run.returncode == 0, run.stderr[-3000:]
        after = s3.request_counts()
        counts[n] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        # 2 checkpoints' files: a rank's own, rank 0's extra ones (and the tracker, once)
        assert run.record()["inventory"]["expected"] == 2 * ((n - 1) * files_a_rank + rank0_files) - tracker_gets
    for n, c in counts.items():
        assert (c.get("GET 200", 0), c.get("HEAD", 0)) == (MARKER_GETS + tracker_gets, 0), (n, c)
        assert c["DELETE"] == n + MARKER_DELETES, (n, c)  # each rank its own files, in one request
        assert c["LIST"] == counts[1]["LIST"] + WALKS_PER_RANK * (n - 1) and counts[1]["LIST"] <= 4, (n, c)
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix="layouts/").get("KeyCount", 0) == 0  # all deleted


def test_a_tiered_run_costs_each_rank_the_same_requests_at_2_and_4_ranks(s3, tmp_path):
    """The persistent tier's requests are an async run's: whole GETs the marker's only, no
    HEAD, a DELETE a rank, constant LISTs; the local tier is each rank's own folder
    (replication 2: two files a local save), emptied by keep_files=False."""
    counts = {}
    for n in (2, 4):
        local = tmp_path / f"local{n}"
        before = s3.request_counts()
        run = run_dlio(tmp_path, n, "llama3_tiny_checkpoint", *SHRINK, "++workload.checkpoint.num_checkpoints_write=4",
                       "++workload.checkpoint.num_checkpoints_read=0", "++workload.checkpoint.keep_files=False",
                       f"++workload.tiers.local_root={local}", "++workload.tiers.persistent_every=2",
                       "++workload.tiers.interval_s=60", "++workload.tiers.replication_jump=1",
                       "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/tiers",
                       env=s3.env(), checkpoint_folder=f"t{n}", out=f"out-tiers{n}")
        assert run.returncode == 0, run.stderr[-3000:]
        after = s3.request_counts()
        counts[n] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        persistent = run.record()["inventory"]["expected"]
        assert persistent == 2 * 2 * n  # checkpoints 2 and 4: (model, optimizer) a rank
        # the persistent files, and each rank's last local iteration: its own part and its peer's
        assert f"removed the {persistent + 2 * n} checkpoint files this run wrote" in run.stdout
        assert [p for p in local.rglob("*") if p.is_file()] == []
    for n, c in counts.items():
        assert (c.get("GET 200", 0), c.get("HEAD", 0)) == (MARKER_GETS, 0), (n, c)
        assert c["DELETE"] == n + MARKER_DELETES, (n, c)
        assert c["LIST"] == counts[2]["LIST"] + WALKS_PER_RANK * (n - 2) and counts[2]["LIST"] <= 4 + WALKS_PER_RANK, \
            (n, c)
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix="tiers/").get("KeyCount", 0) == 0
