"""End to end on Azure Blob and GCS: mpirun + dlio_benchmark against Azurite
and fake-gcs-server on loopback, checked with each cloud's SDK."""
import os
import re
import signal
import subprocess
import time

import pytest

from cloud_servers import CONTAINER, KINDS, Objects, needs, start_server
from conftest import tool
from dlio_ckpt_ext.dlio.ownership import HEARTBEAT_S
from dlio_run import WALKS_PER_RANK, dlio_command, run_dlio
from test_dlio_run import TINY, zero3_file_sizes

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

OBJECT = ["++workload.storage.storage_type=s3", "++workload.checkpoint.num_checkpoints_write=1",
          "++workload.checkpoint.num_checkpoints_read=1"]


def tiny_objects(folder: str, steps=(1, 2)) -> dict[str, int]:
    model, optim = zero3_file_sizes(**TINY, ranks=2)
    return {f"{folder}/global_epoch1_step{s}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt": size
            for s in steps for r in (0, 1) for kind, size in (("model", model), ("optim", optim))}


@pytest.mark.install_check
@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs(k)) for k in KINDS])
def test_tiny_preset_writes_exact_objects_and_reads_them_back_verified(kind, workdir):
    server = start_server(kind, workdir / "data", request_log=kind == "az")
    before = server.request_counts() if kind == "az" else {}
    try:
        started = time.monotonic()
        run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *OBJECT, "++workload.streaming.verify=True",
                       f"++workload.storage.storage_root={kind}://{CONTAINER}/e2e", env=server.env(),
                       checkpoint_folder="tiny")
        # the owner marker's heartbeat renews it every HEARTBEAT_S while the run holds the folder: a
        # run slowed by a busy machine renews it more often (the run's wall time bounds how often)
        heartbeats = int((time.monotonic() - started) // HEARTBEAT_S)
        assert run.returncode == 0, run.stderr[-3000:]
        assert Objects(server).sizes("e2e/") == tiny_objects("e2e/tiny", steps=(1,))  # the owner marker gone
        if kind == "az":
            after = server.request_counts()
            census = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            # a block per 16 MiB chunk of each file, one commit a file, no HEAD nor per-rank listing:
            # rank 0's probe, its count of the checkpoints, its inventory, the owner marker's write and delete
            # (and its heartbeats); with DLIO's own loop, the second rank's count of them too
            blocks = sum(-(-size // (16 << 20)) for size in tiny_objects("e2e/tiny", steps=(1,)).values())
            assert (census["BLOCK"], census["COMMIT"]) == (blocks, 4), census
            assert "HEAD" not in census and census["LIST"] <= 3 + WALKS_PER_RANK, census
            assert census.get("PUT", 0) <= 1 + heartbeats, (census, heartbeats)
            assert sum(n for k, n in census.items() if k not in ("BLOCK", "COMMIT", "GET range")) \
                <= 6 + WALKS_PER_RANK + heartbeats, (census, heartbeats)
    finally:
        server.stop()
    assert "[INFO] inventory: 4 files present, 4 expected, sizes match" in run.stdout
    record = run.record()
    assert record["storage"]["scheme"] == kind and record["storage"]["blocks_in_flight"] >= 1
    assert set(run.metrics()) == {("save", "duration"), ("save", "I/O"), ("load", "duration"), ("load", "I/O")}
    # no SDK request log (DLIO sets the root logger to INFO) and no credential anywhere
    assert "Request URL" not in run.output and "x-ms-" not in run.output
    outputs = [run.stdout, run.stderr] + [p.read_text() for p in run.out.rglob("*.json")]
    assert not any(server.key in text for text in outputs)


@needs("az")
def test_a_run_killed_mid_save_leaves_blocks_that_status_lists_and_removes(workdir):
    """SIGKILL of the whole job while checkpoint 2 uploads: nothing of it is
    committed but what was whole; `status` names the incomplete checkpoint and
    its uncommitted blobs, and --remove-incomplete leaves checkpoint 1 alone."""
    server = start_server("az", workdir / "data")
    objects = Objects(server)
    cmd = dlio_command(workdir, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=az://{CONTAINER}/killed",
                       "++workload.checkpoint.num_checkpoints_write=4", "++workload.checkpoint.num_checkpoints_read=0",
                       checkpoint_folder="c")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **server.env()}, start_new_session=True)
    try:
        for line in proc.stdout:
            if "checkpoint save 1/" in line or "Finished saving checkpoint 1 " in line:
                break
        deadline = time.monotonic() + 30
        while not objects.uncommitted("killed/c/global_epoch1_step2/") and time.monotonic() < deadline:
            time.sleep(0.01)
        # the whole job at once, ranks included (Open MPI's ranks are not in mpirun's process group)
        import psutil
        job = psutil.Process(proc.pid)
        for p in [job, *job.children(recursive=True)]:
            p.send_signal(signal.SIGKILL)
        proc.wait()
        step1 = tiny_objects("killed/c", steps=(1,))
        found = objects.sizes("killed/c/global_epoch1_step")
        assert {k: v for k, v in found.items() if "step1" in k} == step1
        # blocks the ranks had sent still land after the kill (later on a loaded server): what they left,
        # once it stopped changing for 2 s
        left, since = objects.uncommitted("killed/c/"), time.monotonic()
        while time.monotonic() - since < 2:
            time.sleep(0.2)
            now = objects.uncommitted("killed/c/")
            if now != left:
                left, since = now, time.monotonic()
        assert left and all("step2" in k for k in left)
        status = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out")], capture_output=True,
                                text=True, env={**os.environ, **server.env()})
        assert status.returncode == 1, status.stdout + status.stderr
        assert "complete (every file at its planned size): 1" in status.stdout
        named = re.findall(r"open upload: (\S+) \(uncommitted blocks\)", status.stdout)
        assert set(named) == set(objects.uncommitted("killed/c/")) >= set(left), status.stdout
        assert f"checkpoint 2 incomplete ({len(named)} open upload{'s' if len(named) > 1 else ''}): " \
            in status.stdout, status.stdout
        removed = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out"), "--remove-incomplete"],
                                 capture_output=True, text=True, env={**os.environ, **server.env()})
        assert f"and aborted {len(named)} open upload(s)" in removed.stdout, removed.stdout + removed.stderr
        assert objects.uncommitted("killed/") == []
        assert objects.sizes("killed/c/global_epoch1_step") == step1
    finally:
        proc.kill()
        server.stop()
