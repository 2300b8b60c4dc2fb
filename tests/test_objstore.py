"""Object backend (s3dlio) against a real SeaweedFS server, checked with boto3."""
import os

import pytest

from dlio_ckpt_ext.engine import BufferPool, ContentSpec, derive_seed, load_file, save_file
from dlio_ckpt_ext.engine import stream
from dlio_ckpt_ext.errors import StorageError, VerificationError
from dlio_ckpt_ext.storage.objstore import ObjectBackend, ObjectOptions
from s3_server import retire, start_s3_server
from test_engine import expected_bytes, fail_generation_at

MiB = 1 << 20
BUCKET = "ckpt"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"))
    # s3dlio's client is process-wide and built on first use: set its environment first
    os.environ.update(server.env())
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    retire(server)


@pytest.fixture
def pool():
    p = BufferPool(3, 5 * MiB)
    yield p
    p.close()


def backend(prefix):
    return ObjectBackend(f"s3://{BUCKET}/{prefix}", ObjectOptions(part_size="5MiB", max_in_flight=4))


def test_streamed_upload_stores_exact_bytes_and_reads_back_verified(s3, pool):
    b = backend("roundtrip")
    spec = ContentSpec(derive_seed(0, "s3"))
    size = 13 * MiB + 5
    stats = save_file(b, "step1/f.pt", size, spec, pool)
    assert len(stats.chunks) == 3 and stats.fill_s > 0
    body = s3.client().get_object(Bucket=BUCKET, Key="roundtrip/step1/f.pt")["Body"].read()
    assert len(body) == size and body == expected_bytes(spec, size)
    loaded = load_file(b, "step1/f.pt", size, pool, content=spec, parallelism=2)
    assert loaded.nbytes == size
    assert b.list_sizes("step1") == {"step1/f.pt": size}


def test_failed_upload_is_aborted_with_no_orphan_multipart_upload(s3, pool, monkeypatch):
    fail_generation_at(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="part-way"):
        save_file(backend("aborted"), "f.pt", 20 * MiB, ContentSpec(1), pool)
    client = s3.client()
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="aborted/").get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=BUCKET, Prefix="aborted/").get("KeyCount") == 0


def test_missing_short_and_corrupt_objects_fail_naming_them(s3, pool):
    b = backend("bad")
    spec = ContentSpec(derive_seed(1, "s3"))
    good = expected_bytes(spec, 6 * MiB)
    client = s3.client()
    with pytest.raises(StorageError, match="missing checkpoint file s3://ckpt/bad/none.pt"):
        load_file(b, "none.pt", 6 * MiB, pool, content=spec)
    client.put_object(Bucket=BUCKET, Key="bad/short.pt", Body=good[:-1])
    # the size is asked for while the GETs run: the short read names the file first
    with pytest.raises(VerificationError, match=f"s3://ckpt/bad/short.pt (has {6 * MiB - 1} bytes|ended at byte "
                                                f"{6 * MiB - 1}, expected {6 * MiB} bytes)"):
        load_file(b, "short.pt", 6 * MiB, pool, content=spec)
    flipped = bytearray(good)
    flipped[5 * MiB + 3] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key="bad/flip.pt", Body=bytes(flipped))
    with pytest.raises(VerificationError, match=f"bad/flip.pt differs .* at byte offset {5 * MiB + 3}"):
        load_file(b, "flip.pt", 6 * MiB, pool, content=spec)


def test_file_scheme_goes_through_the_same_backend(workdir, pool):
    b = ObjectBackend(f"file://{workdir}/obj", ObjectOptions(part_size="5MiB"))
    b.prepare("step1")
    spec = ContentSpec(3)
    save_file(b, "step1/f.pt", 7 * MiB + 1, spec, pool)
    assert (workdir / "obj" / "step1" / "f.pt").read_bytes() == expected_bytes(spec, 7 * MiB + 1)
    load_file(b, "step1/f.pt", 7 * MiB + 1, pool, content=spec)
    assert b.list_sizes("step1") == {"step1/f.pt": 7 * MiB + 1}
    assert b.reads_may_be_cached


def test_a_longer_object_than_planned_fails_after_its_reads(s3, pool):
    b = backend("long")
    spec = ContentSpec(derive_seed(2, "s3"))
    s3.client().put_object(Bucket=BUCKET, Key="long/x.pt", Body=expected_bytes(spec, 3 * MiB) + b"extra")
    with pytest.raises(VerificationError, match=f"s3://ckpt/long/x.pt has {3 * MiB + 5} bytes, expected {3 * MiB}"):
        load_file(b, "x.pt", 3 * MiB, pool, content=spec, parallelism=4, request_size=MiB)


KILLED_MID_UPLOAD = """
import sys, time
from dlio_ckpt_ext.storage.objstore import ObjectBackend, ObjectOptions
b = ObjectBackend(sys.argv[1], ObjectOptions(part_size="5MiB", max_in_flight=4))
done = b.open_writer("done.pt", 5 << 20)
done.write(memoryview(bytes(5 << 20)))
done.close()
writers = [b.open_writer(name, 40 << 20) for name in ("a.pt", "b.pt")]
for w in writers:
    for _ in range(2):
        w.commit(len(w.reserve(5 << 20)))
print("uploading", flush=True)
time.sleep(600)
"""


def test_a_rank_killed_mid_upload_leaves_no_upload_of_its_own_open(s3, tmp_path):
    """SIGKILL (mpirun after its grace, the OOM killer): nothing in the process
    runs, the rank's upload watch aborts the uploads it had open."""
    import signal
    import subprocess
    import sys
    import time
    client = s3.client()
    foreign = client.create_multipart_upload(Bucket=BUCKET, Key="killed/other.pt")["UploadId"]
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_UPLOAD, f"s3://{BUCKET}/killed"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "uploading\n"
        assert len(client.list_multipart_uploads(Bucket=BUCKET, Prefix="killed/")["Uploads"]) == 3
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while True:
            left = client.list_multipart_uploads(Bucket=BUCKET, Prefix="killed/").get("Uploads", [])
            if len(left) <= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        proc.kill()
    assert [(u["Key"], u["UploadId"]) for u in left] == [("killed/other.pt", foreign)]  # not the rank's
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="killed/")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("killed/done.pt", 5 << 20)]


def test_lent_memory_uploads_report_each_chunks_fill_and_write_span(s3, pool):
    """Where the writer lends its memory, the fill is the calling thread's own
    work, then its hand-over to the upload (commit)."""
    import threading
    seen = []
    b, spec, size = backend("spans"), ContentSpec(derive_seed(0, "spans")), 11 * MiB + 3
    assert b.lends_write_memory
    stream.send_file(b, "f.pt", size, spec, pool,
                     spans=lambda *span: seen.append((*span[:5], threading.get_ident(), span[6] - span[5])))
    layout = [(i, i * 5 * MiB, min(5 * MiB, size - i * 5 * MiB)) for i in range(3)]
    for stage in ("fill", "write"):
        assert [(s[2], s[3], s[4]) for s in seen if s[0] == stage] == layout
    assert {s[5] for s in seen} == {threading.get_ident()} and all(s[6] >= 0 for s in seen)
    body = s3.client().get_object(Bucket=BUCKET, Key="spans/f.pt")["Body"].read()
    assert body == expected_bytes(spec, size)


def test_request_limits_go_to_s3dlio_and_into_the_record(workdir, monkeypatch):
    """Every rank opens its backend, so each sets s3dlio's variables before its first call."""
    for env in ("S3DLIO_OPERATION_TIMEOUT_SECS", "S3DLIO_CONNECT_TIMEOUT_SECS", "S3DLIO_MAX_RETRY_ATTEMPTS",
                "S3DLIO_UNSIGNED_PAYLOAD"):
        monkeypatch.setenv(env, "x")  # restored after the test, whatever the backend sets
        monkeypatch.delenv(env)
    b = ObjectBackend(f"file://{workdir}/obj", ObjectOptions(operation_timeout_s=7, max_attempts=5,
                                                             payload_signing="sha256"))
    assert (os.environ.get("S3DLIO_OPERATION_TIMEOUT_SECS"), os.environ.get("S3DLIO_MAX_RETRY_ATTEMPTS"),
            os.environ.get("S3DLIO_CONNECT_TIMEOUT_SECS"), os.environ.get("S3DLIO_UNSIGNED_PAYLOAD")) == \
        ("7", "5", None, None)
    described = b.describe()
    assert (described["operation_timeout_s"], described["connect_timeout_s"], described["max_attempts"],
            described["payload_signing"]) == (7, 20, 5, "sha256")


def test_a_timeout_says_how_long_the_rank_really_waited():
    from dlio_ckpt_ext.storage.objstore import _error
    err = _error("s3://b/k", "cannot read", RuntimeError("request timed out after 60s"), waited=150.2)
    assert str(err) == ("cannot read s3://b/k: request timed out after 60s (waited 150.2 s in all, up to "
                        f"{os.environ.get('S3DLIO_MAX_RETRY_ATTEMPTS', '3')} attempts; storage_options "
                        "operation_timeout_s / max_attempts)")

