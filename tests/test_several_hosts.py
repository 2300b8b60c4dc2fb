"""Several hosts through mpirun --host, as a user runs a real cluster, on the
emulated cluster of tests/cluster.py (network and UTS namespaces; root only)."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from cluster import Cluster, why_not
from conftest import BUCKET, tool
from dlio_run import MLCOMMONS, Run, submitted_or_only_timing_broken
from s3_server import start_s3_server
from test_dlio_integration import on_disk

pytestmark = [pytest.mark.skipif(why_not() is not None, reason=f"no emulated cluster: {why_not()}"),
              # the fork runs upstream's checkpoint loop, which these tests cover; CI's time is counted
              pytest.mark.skipif(MLCOMMONS, reason="several hosts are tested on DLIO 2.0.0 and upstream main"),
              pytest.mark.e2e]

TWO_ONE = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=1"]


@pytest.fixture
def cluster(request):
    with Cluster(request.param) as c:
        yield c


def mpirun_on(cluster: Cluster, ranks_per_host: int, *command: str) -> list[str]:
    # --bind-to none, as dlio-ckpt-submit runs it: each rank's share is its host's CPUs over its ranks
    return [tool("mpirun"), "--allow-run-as-root", *cluster.mpirun_args(ranks_per_host), "--bind-to", "none",
            "-np", str(ranks_per_host * len(cluster.names)), *command]


def dlio_on(cluster: Cluster, workdir: Path, ranks_per_host: int, *overrides: str, env: dict | None = None,
            timeout: int = 400) -> Run:
    cmd = mpirun_on(cluster, ranks_per_host, tool("dlio_benchmark"), "workload=llama3_tiny_checkpoint",
                    f"++workload.output.folder={workdir / 'out'}",
                    f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}", *overrides)
    for _ in range(2):
        res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **cluster.env(), **(env or {})})
        # Open MPI's daemon on an emulated host can miss its call back to mpirun on a loaded
        # machine (exit 213, before any rank starts): that launch, not the run, is tried once more
        if not (res.returncode == 213 and "A daemon failed to report back" in res.stdout + res.stderr):
            break
    return Run(res.returncode, res.stdout, res.stderr, workdir / "out")


def saved_files(run: Run) -> dict[str, int]:
    return {f["name"]: f["nbytes"] for r in run.rank_stats() for rec in r["phases"]["save"] for f in rec["files"]}


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_two_hosts_two_ranks_each_and_the_recovery_shift_reads_the_other_hosts_files(cluster, workdir):
    run = dlio_on(cluster, workdir, 2, *TWO_ONE, "++workload.checkpoint.recovery_rank_shift=True")
    assert run.returncode == 0, run.output[-3000:]
    assert run.dlio_summary()["num_hosts"] == 2
    record = run.record()
    assert (record["num_hosts"], record["hosts"], record["ranks_per_node"]) == (2, ["node1", "node2"], 2)
    ranks = run.rank_stats()
    host_of = {r["rank"]: r["hostname"] for r in ranks}
    assert host_of == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert all(r["ranks_per_node"] == 2 for r in ranks)
    files = saved_files(run)
    assert len(files) == 2 * 4 * 2 and on_disk(workdir / "ckpt") == files
    assert "[INFO] inventory: 16 files present, 16 expected, sizes match" in run.stdout
    assert {k[0] for k in run.metrics()} == {"save", "load"}
    for r in ranks:  # shifted by ranks per node: every rank reads a rank's files of the other host
        source = r["source_rank_for_loads"]
        assert host_of[source] != host_of[r["rank"]]
        read = [f["name"] for rec in r["phases"]["load"] for f in rec["files"]]
        assert read and all(f"zero_pp_rank_{source}_" in name for name in read)


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_three_hosts_one_rank_each_get_a_host_to_themselves_in_the_dcp_layout(cluster, workdir):
    run = dlio_on(cluster, workdir, 1, *TWO_ONE, "++workload.checkpoint.layout=dcp")
    assert run.returncode == 0, run.output[-3000:]
    usable = len(os.sched_getaffinity(0))  # every emulated host is this machine
    for r in run.rank_stats():
        # the generator budget of a host to itself (usable CPUs / 1 rank on it),
        # not the node's CPUs over the world size (3 ranks)
        assert (r["ranks_per_node"], r["cpu_share"]) == (1, usable), r
        assert r["gen_thread_budget"]["limit"] == usable
    record = run.record()
    assert (record["num_hosts"], record["ranks_per_node"], record["layout"]) == (3, 1, "dcp")
    files = saved_files(run)
    assert on_disk_all(workdir / "ckpt") == files and any(name.endswith(".metadata") for name in files)


def on_disk_all(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_s3_from_two_hosts(cluster, workdir):
    server = start_s3_server(workdir / "seaweedfs", address=cluster.address)
    try:
        server.client().create_bucket(Bucket=BUCKET)
        run = dlio_on(cluster, workdir, 1, *TWO_ONE, "++workload.storage.storage_type=s3",
                      f"++workload.storage.storage_root=s3://{BUCKET}", "++workload.checkpoint.checkpoint_folder=run",
                      env=server.env())
        assert run.returncode == 0, run.output[-3000:]
        listed = server.client().list_objects_v2(Bucket=BUCKET, Prefix="run/")["Contents"]
        assert {o["Key"][len("run/"):]: o["Size"] for o in listed} == saved_files(run)
        assert {r["hostname"] for r in run.rank_stats()} == {"node1", "node2"}
        assert "[INFO] inventory: 8 files present, 8 expected, sizes match" in run.stdout
    finally:
        server.stop()


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_submission_on_two_hosts_drops_each_hosts_cache_and_records_both(cluster, tmp_path, apart):
    # the gap verdict (rule 2.1.24: DLIO's start-up on these 2 cores is longer than tiny
    # invocations) is allowed, nothing else: so no idle time between checkpoints to outlast it
    from test_submission import ORG, SYSTEM, TINY_8B, model_folder
    results, ckpt = tmp_path / "results", apart
    cmd = [tool("dlio-ckpt-submit"), "--model", "llama3-8b", "--hosts", ",".join(cluster.names), "--num-processes",
           "2", "--open", "--accelerator-type", "b200", "--org", ORG, "--system", SYSTEM, "--results-dir", str(results), "--checkpoint-folder",
           str(ckpt), *(f"--mpirun-arg={a}" for a in cluster.launch_args()), "--", *TINY_8B]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **cluster.env()})
    assert submitted_or_only_timing_broken(res.returncode, res.stderr), res.stdout[-3000:] + res.stderr[-3000:]
    # one drop per host, each run on that host
    assert "[submit] page cache dropped on every host (node1, node2; " in res.stdout
    folder = model_folder(results, "open")
    stamps = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert len(stamps) == 2
    for stamp in stamps:
        run = folder / stamp
        ranks = [json.loads(p.read_text()) for p in sorted((run / "rank_stats").glob("*.json"))]
        per_host = {h: sum(r["hostname"] == h for r in ranks) for h in cluster.names}
        assert per_host == {"node1": 1, "node2": 1}  # ranks per host as asked on each host, not on average
        record = json.loads((run / "ckpt_ext_summary.json").read_text())
        assert (record["num_hosts"], record["hosts"], record["ranks_per_node"]) == (2, cluster.names, 1)
        assert json.loads((run / "summary.json").read_text())["num_hosts"] == 2
    report = json.loads((folder / "results.json").read_text())
    assert report["valid"] == (res.returncode == 0)
    assert all(v.startswith("2.1.2") for v in report["timing_rule_violations"]), report["timing_rule_violations"]
    assert report["hosts"] == cluster.names and report["ranks_per_host"] == 1


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_a_host_lost_mid_save_ends_the_job_naming_it_and_claims_no_result(cluster, workdir):
    cmd = mpirun_on(cluster, 1, tool("dlio_benchmark"), "workload=llama3_tiny_checkpoint",
                    f"++workload.output.folder={workdir / 'out'}", f"++workload.checkpoint.checkpoint_folder={workdir / 'c'}",
                    "++workload.checkpoint.num_checkpoints_write=30", "++workload.checkpoint.num_checkpoints_read=0",
                    "++workload.model.transformer.hidden_size=1024", "++workload.model.transformer.ffn_hidden_size=3584")
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **cluster.env()})
    lost_at, out = None, []
    try:
        for line in proc.stdout:
            out.append(line)
            if re.search(r"checkpoint save 2/|Finished saving checkpoint 2 ", line):
                # checkpoint 3 is being written: its first file is there (a fixed pause could fall
                # between two checkpoints on a fast disk, and find nothing half-written)
                step3, deadline = workdir / "c" / "global_epoch1_step3", time.monotonic() + 30
                while not (step3.is_dir() and any(step3.iterdir())) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert cluster.kill("node2")
                lost_at = time.monotonic()
                break
        out.append(proc.communicate(timeout=120)[0])
    finally:
        proc.kill()
    text = "".join(out)
    assert lost_at is not None, text[-3000:]
    assert time.monotonic() - lost_at < 60  # ended, not hung on the lost ranks
    # mpirun names the host it lost ("A daemon failed to report back ... Remote host: node2", or "PRTE has
    # lost communication with a remote daemon ... Remote daemon: [...] on node node2")
    assert re.search(r"Remote (host|daemon):.*node2", text), text[-3000:]
    assert "[METRIC]" not in text
    assert not (workdir / "out" / "summary.json").exists()
    assert not (workdir / "out" / "ckpt_ext_summary.json").exists()
    # what the lost host left half-written is listed, measured here against checkpoint 1 (complete: saved
    # before the kill): every file of a later checkpoint at checkpoint 1's size, or not
    ckpt = workdir / "c"
    # (beside them the dead run's owner marker, which a later run takes over)
    sizes = {d.name: {f.name: f.stat().st_size for f in d.iterdir()} for d in ckpt.iterdir() if d.is_dir()}
    reference = sizes["global_epoch1_step1"]
    incomplete = {d: sorted(n for n in reference if files.get(n) != reference[n])
                  for d, files in sizes.items() if files != reference}
    assert incomplete, sizes  # the kill came mid-save
    status = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out")], capture_output=True, text=True)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "the run did not finish" in status.stdout and "ranks on node1, node2" in status.stdout
    listed = dict(re.findall(r"(?:partial|missing): (\S+)/(\S+)", status.stdout))
    assert {d: sorted(n for dd, n in re.findall(r"(?:partial|missing): (\S+)/(\S+)", status.stdout) if dd == d)
            for d in listed} == incomplete
    for d, names in incomplete.items():
        for n in names:
            if n in sizes[d]:
                assert f"partial: {d}/{n} ({sizes[d][n]} of {reference[n]} bytes)" in status.stdout
    removed = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out"), "--remove-incomplete"],
                             capture_output=True, text=True)
    assert removed.returncode == 1, removed.stdout + removed.stderr
    left = {d.name for d in ckpt.iterdir() if d.is_dir()}
    assert left == set(sizes) - set(incomplete)  # the incomplete checkpoints gone, the complete ones kept
    assert all({f.name: f.stat().st_size for f in (ckpt / d).iterdir()} == reference for d in left)



@pytest.mark.parametrize("cluster", [4], indirect=True)
def test_a_slow_host_among_four_is_named_in_results_and_the_record(cluster, workdir):
    server = start_s3_server(workdir / "seaweedfs", address=cluster.address)
    try:
        server.client().create_bucket(Bucket=BUCKET)
        cluster.slow_link("node3", 40)  # 5 MB/s; the others share the bridge at memory speed
        # a rank a host: DLIO's start-up of 8 ranks costs these 2 cores 30 s; two a host are tested above
        run = dlio_on(cluster, workdir, 1, "++workload.checkpoint.num_checkpoints_write=2",
                      "++workload.checkpoint.num_checkpoints_read=1", "++workload.storage.storage_type=s3",
                      f"++workload.storage.storage_root=s3://{BUCKET}", "++workload.checkpoint.checkpoint_folder=skew",
                      "++workload.model.num_layers=2", "++workload.model.transformer.hidden_size=256",
                      "++workload.model.transformer.ffn_hidden_size=512", "++workload.model.transformer.vocab_size=4096",
                      "++workload.model.transformer.num_attention_heads=4", "++workload.model.transformer.num_kv_heads=2",
                      env=server.env())
    finally:
        server.stop()
    assert run.returncode == 0, run.output[-3000:]
    host_of = {r["rank"]: r["hostname"] for r in run.rank_stats()}
    record = run.record()
    for phase, steps in (("save", (1, 2)), ("load", (1,))):
        for w in record[phase]["per_checkpoint"]:
            hosts = w["hosts"]
            assert sorted(hosts) == cluster.names and all(h["ranks"] == 1 for h in hosts.values())
            assert w["slowest_host"] == "node3" and w["last_done_host"] == "node3", w
            assert host_of[w["last_done_rank"]] == "node3"
            others = [h["throughput_gib_s"] for name, h in hosts.items() if name != "node3"]
            # on a loaded machine every host is slow; node3's cap keeps it the slowest
            assert hosts["node3"]["throughput_gib_s"] < min(others)
            assert w["first_done_s"] <= w["last_done_s"] == pytest.approx(w["duration_s"])
            assert w["spread_s"] == pytest.approx(w["last_done_s"] - w["first_done_s"])
        lines = [line for line in run.stdout.splitlines() if re.match(rf"  {phase} \d: first / last done", line)]
        assert len(lines) == len(steps), run.stdout[-3000:]
        assert all("on node3)" in line and "slowest host node3 " in line and "(4 hosts)" in line for line in lines)


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_a_lost_hosts_part_crosses_the_network_from_its_peer_on_the_other_host(cluster, workdir):
    """A tiered run, a rank a host, rank 1 lost: its part comes from rank 0, its clique peer on
    node1, through node2's link (Open MPI's TCP between hosts, not a copy in shared memory)."""
    from test_recovery_run import parts, recovered, recovery
    into_node2 = Path(f"/sys/class/net/{cluster.veth(2)}/statistics/tx_bytes")  # the bridge's side of its veth
    before = int(into_node2.read_text())
    run = dlio_on(cluster, workdir, 1, *recovered(workdir / "local", "++workload.recovery.lost_ranks=[1]"))
    r = recovery(run)
    crossed = int(into_node2.read_text()) - before
    size = parts(2, model="llama3_tiny_checkpoint")
    assert {s["rank"]: s["hostname"] for s in run.rank_stats()} == {0: "node1", 1: "node2"}
    assert (r["tier"], r["step"], r["moved_to"], r["moved_bytes"], r["storage_bytes"]) == ("local", 4, [1], size[1],
                                                                                           0)
    # the whole run sent node2 little else (MPI's wire-up, barriers, the recovery decision)
    assert size[1] <= crossed < size[1] + (4 << 20)
