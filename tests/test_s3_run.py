"""End to end on object storage: mpirun + dlio_benchmark against a real SeaweedFS."""
import json
import os
import pty
import re
import signal
import subprocess
import time

import pytest

from conftest import BUCKET, tool
from dlio_run import dlio_command, run_dlio
from s3_server import SECRET_KEY, S3Server, free_port, start_s3_server
from test_dlio_run import TINY, zero3_file_sizes

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

S3 = ["++workload.storage.storage_type=s3", "++workload.checkpoint.num_checkpoints_write=2",
      "++workload.checkpoint.num_checkpoints_read=1"]


def assert_tiny_objects(s3, folder: str) -> None:
    """Exactly the tiny preset's 2 checkpoints x 2 ranks x (model, optim), whole,
    and no upload left open."""
    model, optim = zero3_file_sizes(**TINY, ranks=2)
    prefix = folder.split("/")[0] + "/"
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {
        f"{folder}/global_epoch1_step{s}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt": size
        for s in (1, 2) for r in (0, 1) for kind, size in (("model", model), ("optim", optim))}
    assert s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []) == []


@pytest.mark.install_check
def test_tiny_preset_on_s3_every_object_present_with_exact_size(s3, workdir):
    # credentials through storage_options this time: they must not leak into any output
    env = {k: v for k, v in s3.env().items() if k != "AWS_SECRET_ACCESS_KEY"}
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *S3, "++workload.streaming.verify=True",
                   f"++workload.storage.storage_root=s3://{BUCKET}/e2e",
                   f"++workload.storage.storage_options.secret_access_key={SECRET_KEY}",
                   env={**env, "AWS_SECRET_ACCESS_KEY": ""}, checkpoint_folder="tiny")
    assert run.returncode == 0, run.stderr[-3000:]
    assert_tiny_objects(s3, "e2e/tiny")
    assert "[INFO] inventory: 8 files present, 8 expected, sizes match" in run.stdout
    summary = run.record()
    assert summary["inventory"]["ok"] and summary["storage"]["scheme"] == "s3"
    assert summary["storage"]["s3dlio_runtime_threads"] >= 1
    assert summary["config"]["effective"]["storage"]["storage_options"]["secret_access_key"] == "<redacted>"
    outputs = [run.stdout, run.stderr] + [p.read_text() for p in run.out.rglob("*.json")]
    assert not any(SECRET_KEY in text for text in outputs)
    assert set(run.metrics()) == {("save", "duration"), ("save", "I/O"), ("load", "duration"), ("load", "I/O")}


@pytest.mark.parametrize("case", ["wrong secret", "missing bucket", "unreachable endpoint"])
def test_unusable_object_store_fails_fast_with_a_clear_error(s3, workdir, case):
    env, root = s3.env(), f"s3://{BUCKET}/x"
    expected = {"wrong secret": "SignatureDoesNotMatch", "missing bucket": "NoSuchBucket",
                "unreachable endpoint": "Connection refused"}[case]
    if case == "wrong secret":
        env = s3.env(secret="not-the-secret")
    elif case == "missing bucket":
        root = "s3://no-such-bucket/x"
    else:
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *S3, f"++workload.storage.storage_root={root}",
                   env=env, checkpoint_folder="c", timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - t0 < 30 + 15  # 30 s for the storage, a margin for DLIO's start-up
    assert "checking the storage failed: cannot reach" in run.stderr and expected in run.stderr
    assert "[METRIC]" not in run.output


def test_server_killed_mid_run_gives_an_error_not_a_hang(tmp_path):
    server = start_s3_server(tmp_path / "seaweedfs")
    server.client().create_bucket(Bucket=BUCKET)
    cmd = dlio_command(tmp_path, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=s3://{BUCKET}/k",
                       "++workload.checkpoint.num_checkpoints_write=50", "++workload.checkpoint.num_checkpoints_read=0",
                       checkpoint_folder="c")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **server.env()})
    try:
        for line in proc.stdout:  # the first checkpoint is saved (our 2.0.0 loop's line, or upstream's)
            if "checkpoint save 1/" in line or "Finished saving checkpoint 1 " in line:
                break
        server.stop()
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        server.stop()
    assert proc.returncode != 0
    assert "[ERROR] rank" in out and "s3://ckpt/k/c/global_epoch1_step" in out
    assert f"the endpoint {server.endpoint} stopped answering (" in out, out[-3000:]
    assert "[METRIC]" not in out


def test_ctrl_c_during_uploads_leaves_no_open_multipart_upload(s3, tmp_path):
    cmd = dlio_command(tmp_path, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=s3://{BUCKET}/sigint",
                       "++workload.checkpoint.num_checkpoints_write=50", "++workload.checkpoint.num_checkpoints_read=0",
                       checkpoint_folder="c")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **s3.env()}, start_new_session=True)
    try:
        for line in proc.stdout:  # uploads of checkpoint 3 are under way
            if "checkpoint save 2/" in line or "Finished saving checkpoint 2 " in line:
                break
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends mpirun
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    # mpirun kills the ranks ~0.25 s after its SIGTERM, often mid-abort: each
    # rank's upload watch aborts what it left open once it is gone
    assert open_uploads_after(s3, "sigint/", seconds=30) == []


def open_uploads_after(s3, prefix: str, seconds: float) -> list[str]:
    """The keys of the uploads still open under prefix once none are, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        keys = [u["Key"] for u in s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])]
        if not keys or time.monotonic() > deadline:
            return keys
        time.sleep(0.2)


def test_uploads_tool_lists_and_aborts_what_a_killed_run_left(s3, tmp_path):
    client = s3.client()
    started = client.create_multipart_upload(Bucket=BUCKET, Key="left/c/step1/rank0.pt")
    client.upload_part(Bucket=BUCKET, Key="left/c/step1/rank0.pt", UploadId=started["UploadId"], PartNumber=1,
                       Body=b"x" * (5 << 20))
    env = {**os.environ, **s3.env()}
    listed = subprocess.run([tool("dlio-ckpt-report"), "uploads", f"s3://{BUCKET}/left"], env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert f"open upload: s3://{BUCKET}/left/c/step1/rank0.pt (id {started['UploadId']}" in listed.stdout
    aborted = subprocess.run([tool("dlio-ckpt-report"), "uploads", f"s3://{BUCKET}/left", "--abort"], env=env,
                             capture_output=True, text=True)
    assert "aborted 1 open upload(s)" in aborted.stdout
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="left/").get("Uploads", []) == []


def test_keep_files_false_on_s3_deletes_only_the_objects_the_run_wrote(s3, workdir):
    client = s3.client()
    foreign = ["mine/notes.txt", "mine/global_epoch1_step1/other.pt",
               "mine/global_epoch1_step1/zero_pp_rank_0_mp_rank_00_model_states.pt.keep"]
    for key in foreign:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"not the benchmark's")
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *S3, f"++workload.storage.storage_root=s3://{BUCKET}",
                   "++workload.checkpoint.keep_files=False", env=s3.env(), checkpoint_folder="mine")
    assert run.returncode == 0, run.output[-3000:]
    left = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="mine/").get("Contents", []))
    assert left == sorted(foreign)


def test_a_run_through_the_emulated_remote_link(tmp_path, workdir):
    from dlio_ckpt_ext.tools.local_s3 import create_bucket, start
    from dlio_ckpt_ext.tools.remote_link import LinkSpec
    server = start(tmp_path / "remote", link=LinkSpec(latency_ms=25, rate_mb_s=100))
    try:
        assert server.endpoint != server.direct_endpoint  # clients talk to the link
        create_bucket(server, "far")
        client = S3Server(server.endpoint, server.proc, server.data_dir).client()
        client.put_object(Bucket="far", Key="probe", Body=b"x")
        t0 = time.monotonic()
        client.get_object(Bucket="far", Key="probe")["Body"].read()
        assert time.monotonic() - t0 >= 0.05  # a request and its answer each cross 25 ms
        run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       "++workload.storage.storage_root=s3://far", "++workload.checkpoint.num_checkpoints_write=1",
                       "++workload.checkpoint.num_checkpoints_read=1", "++workload.streaming.verify=True",
                       env=server.env(), checkpoint_folder="c")
        assert run.returncode == 0, run.output[-3000:]
        assert run.record()["inventory"]["ok"]
        assert "requests in flight           32 x 8 MiB per rank" in run.stdout
    finally:
        server.stop()


def test_uploads_overlap_by_default_and_store_every_object_whole_and_verify(s3, workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *S3, "++workload.streaming.verify=True",
                   "++workload.streaming.record_chunks=True", f"++workload.storage.storage_root=s3://{BUCKET}/overlap",
                   env=s3.env(), checkpoint_folder="o")
    assert run.returncode == 0, run.stderr[-3000:]
    assert_tiny_objects(s3, "overlap/o")
    save = run.record()["concurrency"]["save"]
    assert save["files_at_once"] == 2 and save["requests_in_flight"] == 14
    assert "requests in flight           14 x 16 MiB per rank (2 files at once)" in run.stdout
    # the first file of each checkpoint was closed only after the second's bytes were sent
    for stats in run.rank_stats():
        for rec in stats["phases"]["save"]:
            first, second = rec["files"]
            assert first["end"] >= second["chunks"][-1][6]


def run_on_a_terminal_until(cmd: list[str], env: dict, marker, then) -> tuple[int, str]:
    """Run cmd with its output on a pseudo-terminal, as a person at mpirun runs
    it; call then(proc) once a line matches `marker`; return (code, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    os.close(slave)
    out, done = b"", False
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            out += data
            if not done and marker.search(out.decode(errors="replace")):
                then(proc)
                done = True
        proc.wait(timeout=60)
    finally:
        proc.kill()
        os.close(master)
    return proc.returncode, out.decode(errors="replace")


def test_ctrl_c_during_an_async_persist_says_what_became_of_it(s3, tmp_path):
    cmd = dlio_command(tmp_path, 2, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=s3://{BUCKET}/asigint", "++workload.checkpoint.async_mode=async",
                       "++workload.checkpoint.num_checkpoints_write=50", "++workload.checkpoint.num_checkpoints_read=0",
                       checkpoint_folder="c")
    # checkpoint 2 persists in the background while 3 is staged: Ctrl-C then
    code, out = run_on_a_terminal_until(cmd, {**os.environ, **s3.env(), "TF_CPP_MIN_LOG_LEVEL": "3"},
                                        re.compile(r"checkpoint save 2/|Starting saving checkpoint 3 "),
                                        lambda proc: (time.sleep(0.2), os.kill(proc.pid, signal.SIGINT)))
    assert code != 0
    said = re.findall(r"\[ERROR\] rank (\d): checkpoint (persist|save) (\d+) interrupted by SIGTERM; its partial "
                      r"file or open upload was removed", out)
    # each rank names what it was doing: the persist in the background, or
    # the next save's staging when the previous persist had just finished (rank 0
    # always; on a loaded machine mpirun may kill rank 1 before it gets to say it)
    assert 0 in {int(rank) for rank, _, _ in said} and {int(rank) for rank, _, _ in said} <= {0, 1}, out[-3000:]
    assert not re.search(r"^\[METRIC\]", out, re.M)  # (our warnings name DLIO's [METRIC] lines)
    assert open_uploads_after(s3, "asigint/", seconds=30) == []


@pytest.mark.parametrize("signing", ["unsigned", "sha256"])
def test_parts_are_signed_as_payload_signing_says_and_client_cpu_is_measured(s3, workdir, signing):
    """Every UploadPart's x-amz-content-sha256, seen on the wire; the record's
    client CPU per GiB recomputed from the rank stats' own windows."""
    from header_proxy import HeaderProxy
    proxy = HeaderProxy(int(s3.endpoint.rsplit(":", 1)[1]))
    try:
        run = run_dlio(workdir, 1, "llama3_tiny_checkpoint", *S3, f"++workload.storage.storage_root=s3://{BUCKET}/sig",
                       f"++workload.storage.storage_options.payload_signing={signing}",
                       env={**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint}, checkpoint_folder=signing)
    finally:
        proxy.stop()
    assert run.returncode == 0, run.output[-3000:]
    parts = [sha for method, path, sha in proxy.requests if method == "PUT" and "partNumber=" in path]
    assert len(parts) >= 2 * 2  # two checkpoints of two files, a part at least each
    assert all(sha == "UNSIGNED-PAYLOAD" if signing == "unsigned" else re.fullmatch(r"[0-9a-f]{64}", sha)
               for sha in parts), set(parts)
    record = run.record()
    assert record["storage"]["payload_signing"] == signing and record["storage"]["freed_memory_reused"]
    [stats] = run.rank_stats()
    for phase in ("save", "load"):
        windows = stats["phases"][phase]
        gib = sum(w["bytes"] for w in windows) / 2**30
        cpu = record[phase]["results"]["client_cpu"]
        assert cpu["cpu_s_per_gib"] == pytest.approx(sum(w["cpu_user_s"] + w["cpu_sys_s"] for w in windows) / gib)
        assert cpu["minor_faults_per_gib"] == pytest.approx(sum(w["minor_faults"] for w in windows) / gib)
        assert cpu["cpu_s_per_gib"] > 0 and cpu["cores_at_10_gib_s"] == pytest.approx(10 * cpu["cpu_s_per_gib"])
        assert (f"client CPU                   {cpu['cpu_s_per_gib']:.3f} core-seconds per GiB (user "
                f"{cpu['user_s_per_gib']:.3f}, sys {cpu['sys_s_per_gib']:.3f}; ") in run.stdout


def test_a_frozen_server_is_said_while_frozen_and_the_stall_kept(tmp_path):
    """SeaweedFS stopped (SIGSTOP) for 14 s mid-run, then resumed: the rank says so
    every 3 s while it lasts (lines read as they come, before the resume), the run
    finishes, and the stall is in the record and on its checkpoint's RESULTS line."""
    import threading
    server = start_s3_server(tmp_path / "seaweedfs")
    server.client().create_bucket(Bucket=BUCKET)
    cmd = dlio_command(tmp_path, 1, "llama3_tiny_checkpoint", "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=s3://{BUCKET}/frozen", "++workload.streaming.stall_warning_s=3",
                       "++workload.checkpoint.num_checkpoints_write=3", "++workload.checkpoint.num_checkpoints_read=1",
                       checkpoint_folder="c")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **server.env()})
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stdout))
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("checkpoint save 1/" in line or "Finished saving checkpoint 1 " in line for _, line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(line for _, line in lines)[-3000:]
            time.sleep(0.05)
        os.kill(server.proc.pid, signal.SIGSTOP)
        time.sleep(14)
        resumed = time.monotonic()
        os.kill(server.proc.pid, signal.SIGCONT)
        proc.wait(timeout=240)
        reader.join(timeout=10)
    finally:
        proc.kill()
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
    out = "".join(line for _, line in lines)
    assert proc.returncode == 0, out[-3000:]
    pattern = re.compile(r"^\[WARNING\] rank 0: no save request has completed for (\d+) s \(checkpoint (\d+), file "
                         rf"s3://{BUCKET}/frozen/c/global_epoch1_step\d/\S+, endpoint {re.escape(server.endpoint)}\); "
                         r"still waiting$")
    said = [(at, pattern.match(line.rstrip("\n"))) for at, line in lines if pattern.match(line.rstrip("\n"))]
    assert len([at for at, _ in said if at < resumed]) >= 3, out[-3000:]
    record = json.loads((tmp_path / "out" / "ckpt_ext_summary.json").read_text())
    # a loaded machine's slow uploads may add short stalls of their own; the freeze is the long one
    stall = max(record["stalls"], key=lambda s: s["duration_s"])
    frozen_step = next(m[2] for at, m in said if at < resumed and int(m[1]) >= 9)
    assert stall["phase"] == "save" and str(stall["step"]) == frozen_step and 11 < stall["duration_s"] < 30
    assert any(w.startswith(f"[WARNING] rank 0's save of checkpoint {stall['step']} stalled for ")
               for w in record["warnings"])
    # the longest stall of that checkpoint is named (a loaded machine may add short ones: "N stalls")
    assert re.search(rf"^  save {stall['step']}: first / last done .*; STALLED \d+\.\d s \(rank 0(, \d+ stalls)?\)$",
                     out, re.M)
    slow = record["save"]["results"]["slow_requests"]  # the request the freeze held, at least
    assert slow["slow"] >= 1 and slow["worst_s"] > 11 and slow["worst_rank"] == 0
    assert f"  slow requests                {slow['slow']} of {slow['requests']} over 10x their rank's median" in out
