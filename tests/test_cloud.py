"""Azure Blob (az://) and Google Cloud Storage (gs://) backends against real
emulators (Azurite, fake-gcs-server) on loopback, checked with each cloud's SDK."""
import os
import signal
import subprocess
import sys

import pytest

from cloud_servers import CONTAINER, KINDS, Objects, needs, serving
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, derive_seed, load_file, save_file
from dlio_ckpt_ext.errors import ConfigError, StorageError, VerificationError
from dlio_ckpt_ext.storage import open_backend
from test_engine import expected_bytes, fail_generation_at

MiB = 1 << 20


@pytest.fixture(scope="module", params=[pytest.param(k, marks=needs(k)) for k in KINDS])
def cloud(request, tmp_path_factory):
    yield from serving(request.param, tmp_path_factory.mktemp(f"{request.param}-data"))


@pytest.fixture(scope="module")
def objects(cloud):
    return Objects(cloud)


@pytest.fixture
def pool():
    p = BufferPool(3, 5 * MiB)
    yield p
    p.close()


def backend(cloud, prefix, **options):
    return open_backend("s3", f"{cloud.kind}://{CONTAINER}/{prefix}", {"max_in_flight": 3, **options})


def test_streamed_upload_stores_exact_bytes_and_reads_back_verified(cloud, objects, pool):
    b = backend(cloud, "roundtrip")
    b.probe()
    spec = ContentSpec(derive_seed(0, cloud.kind))
    size = 13 * MiB + 5
    stats = save_file(b, "step1/f.pt", size, spec, pool)
    assert len(stats.chunks) == 3
    assert objects.sizes("roundtrip/") == {"roundtrip/step1/f.pt": size}
    assert objects.read("roundtrip/step1/f.pt") == expected_bytes(spec, size)
    assert load_file(b, "step1/f.pt", size, pool, content=spec, parallelism=2).nbytes == size
    assert b.list_sizes("step1") == {"step1/f.pt": size} and b.children("") == ["step1"]
    save_file(b, "step1/empty.pt", 0, spec, pool)
    assert objects.sizes("roundtrip/step1/empty") == {"roundtrip/step1/empty.pt": 0}
    assert b.delete_files(["step1/f.pt", "step1/empty.pt", "step1/never.pt"]) == 2
    assert objects.sizes("roundtrip/") == {}


def test_a_failed_upload_leaves_nothing_committed_nor_pending(cloud, objects, pool, monkeypatch):
    fail_generation_at(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="part-way"):
        save_file(backend(cloud, "failed"), "f.pt", 20 * MiB, ContentSpec(1), pool)
    assert objects.sizes("failed/") == {}
    if cloud.kind == "az":
        assert objects.uncommitted("failed/") == []


def test_missing_short_long_and_corrupt_objects_fail_naming_them(cloud, objects, pool):
    b = backend(cloud, "bad")
    spec = ContentSpec(derive_seed(1, cloud.kind))
    good = expected_bytes(spec, 6 * MiB)
    root = f"{cloud.kind}://{CONTAINER}/bad"
    with pytest.raises(StorageError, match=f"missing checkpoint file {root}/none.pt"):
        load_file(b, "none.pt", 6 * MiB, pool, content=spec)
    # a framework's probe of a marker not there yet (DCP's .metadata before its first save) is an answer
    assert b.exists("none.pt") is False
    objects.put("bad/short.pt", good[:-1])
    with pytest.raises(VerificationError, match=f"{root}/short.pt ended at byte {6 * MiB - 1}, expected"):
        load_file(b, "short.pt", 6 * MiB, pool, content=spec)
    objects.put("bad/long.pt", good + b"extra")
    with pytest.raises(VerificationError, match=f"{root}/long.pt has {6 * MiB + 5} bytes, expected {6 * MiB}"):
        load_file(b, "long.pt", 6 * MiB, pool, content=spec, parallelism=3, request_size=MiB)
    flipped = bytearray(good)
    flipped[5 * MiB + 3] ^= 0xFF
    objects.put("bad/flip.pt", bytes(flipped))
    with pytest.raises(VerificationError, match=f"bad/flip.pt differs .* at byte offset {5 * MiB + 3}"):
        load_file(b, "flip.pt", 6 * MiB, pool, content=spec)


BOUNDED = """
import resource, sys
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, load_file, save_file
from dlio_ckpt_ext.storage import open_backend
kind, size, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = open_backend("s3", f"{kind}://ckpt/bounded", {"max_in_flight": 4})
pool = BufferPool(2, chunk)
spec = ContentSpec(7)
save_file(b, "small.pt", 2 * chunk, spec, pool)  # the clients' own first-use memory, before the baseline
load_file(b, "small.pt", 2 * chunk, pool, content=spec, parallelism=4)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
save_file(b, "big.pt", size, spec, pool)
saved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
load_file(b, "big.pt", size, pool, content=spec, parallelism=4)
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
print(base, saved, loaded)
"""


def test_memory_stays_near_the_blocks_in_flight_for_an_object_many_times_larger(cloud, objects):
    """An object of 256 MiB (Azure) or 128 MiB (GCS) in 8 MiB chunks: the writer
    holds at most max_in_flight + 1 blocks (40 MiB on Azure, 16 MiB on GCS), the
    reads 4 requests in flight."""
    size, chunk = (256 if cloud.kind == "az" else 128) * MiB, 8 * MiB  # the GCS emulator is quadratic
    res = subprocess.run([sys.executable, "-c", BOUNDED, cloud.kind, str(size), str(chunk)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **cloud.env()})
    assert res.returncode == 0, res.stderr[-3000:]
    base, saved, loaded = map(int, res.stdout.split())
    held = (5 if cloud.kind == "az" else 2) * chunk
    assert saved - base < held + 48 * MiB, (base, saved)  # the SDK's own per-request buffers besides
    assert loaded - base < size // 4, (base, saved, loaded)
    assert objects.sizes("bounded/big") == {"bounded/big.pt": size}


KILLED_MID_UPLOAD = """
import sys, time
from dlio_ckpt_ext.storage import open_backend
b = open_backend("s3", sys.argv[1], {"max_in_flight": 2})
done = b.open_writer("done.pt", 4 << 20)
done.write(memoryview(bytes(4 << 20)))
done.close()
w = b.open_writer("a.pt", 40 << 20)
for _ in range(2):
    w.commit(len(w.reserve(4 << 20)))
w._drain()
print("uploading", flush=True)
time.sleep(600)
"""


def test_a_rank_killed_mid_upload_leaves_nothing_committed_and_the_leftovers_listed_and_removed(cloud, objects):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_UPLOAD, f"{cloud.kind}://{CONTAINER}/killed"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "uploading\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    assert objects.sizes("killed/") == {"killed/done.pt": 4 << 20}
    b = backend(cloud, "killed")
    left = b.open_uploads()
    if cloud.kind == "gs":
        assert left == []  # GCS lists no resumable sessions: the unfinished one is invisible (and expires)
        return
    assert [u["key"] for u in left] == ["killed/a.pt"] == objects.uncommitted("killed/")
    assert b.abort_uploads(left) == 1
    assert objects.uncommitted("killed/") == [] and objects.sizes("killed/") == {"killed/done.pt": 4 << 20}


def test_the_uploads_tool_lists_and_removes_uncommitted_blocks(cloud, objects):
    if cloud.kind == "gs":
        pytest.skip("GCS lists no unfinished resumable sessions")
    from conftest import tool
    blob = objects.container.get_blob_client("tool/c/step1/rank0.pt")
    blob.stage_block("MDAwMA==", b"x" * 1000)
    uri = f"az://{CONTAINER}/tool"
    listed = subprocess.run([tool("dlio-ckpt-report"), "uploads", uri], capture_output=True, text=True,
                            env={**os.environ, **cloud.env()})
    assert listed.returncode == 0, listed.stderr
    assert f"open upload: az://{CONTAINER}/tool/c/step1/rank0.pt (uncommitted blocks" in listed.stdout
    removed = subprocess.run([tool("dlio-ckpt-report"), "uploads", uri, "--abort"], capture_output=True, text=True,
                             env={**os.environ, **cloud.env()})
    assert "aborted 1 open upload(s)" in removed.stdout, removed.stdout + removed.stderr
    assert objects.uncommitted("tool/") == []


def test_a_missing_container_and_refused_credentials_are_said_in_one_line(cloud, monkeypatch):
    what = "container" if cloud.kind == "az" else "bucket"
    with pytest.raises(StorageError) as err:
        open_backend("s3", f"{cloud.kind}://no-such-{what}/x", {}).probe()
    assert str(err.value) == (f"cannot reach {cloud.kind}://no-such-{what}/x: the {what} no-such-{what} does not "
                              f"exist at {cloud.endpoint}" + ("/devstoreaccount1" if cloud.kind == "az" else ""))
    if cloud.kind == "az":
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", cloud.env(key="bm90LXRoZS1rZXk=")
                           ["AZURE_STORAGE_CONNECTION_STRING"])
        with pytest.raises(StorageError, match=r"cannot reach az://ckpt/x: the storage refused the credentials"):
            open_backend("s3", "az://ckpt/x", {}).probe()
        monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
        with pytest.raises(StorageError, match="no Azure credentials: set AZURE_STORAGE_CONNECTION_STRING, or "
                                               "AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY"):
            open_backend("s3", "az://ckpt/x", {})


def test_options_are_checked_and_recorded_without_credentials(cloud):
    with pytest.raises(ConfigError) as err:
        backend(cloud, "x", max_in_flight=0)
    assert err.value.key == "workload.storage.storage_options.max_in_flight"
    with pytest.raises(ConfigError) as err:
        backend(cloud, "x", part_size="8MiB")
    assert err.value.key == "workload.storage.storage_options.part_size"
    described = backend(cloud, "x").describe()
    assert described["scheme"] == cloud.kind and described["blocks_in_flight"] == (3 if cloud.kind == "az" else 1)
    assert "AccountKey" not in repr(described) and cloud.key not in repr(described)


def test_an_azure_connection_strings_secrets_are_redacted_wherever_they_appear(monkeypatch):
    from dlio_ckpt_ext.redact import redact_text
    given = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0+/a==;EndpointSuffix=core.windows.net"
    assert redact_text(f"error: {given}") == ("error: DefaultEndpointsProtocol=https;AccountName=acct;"
                                              "AccountKey=<redacted>;EndpointSuffix=core.windows.net")
    assert redact_text("BlobEndpoint=https://a;SharedAccessSignature=sv=2022&sig=abc") == \
        "BlobEndpoint=https://a;SharedAccessSignature=<redacted>"
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2024-01-01&sig=topsecret")
    assert redact_text("url?sv=2024-01-01&sig=topsecret") == "url?<redacted>"


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs(k)) for k in KINDS] + ["s3"])
def test_a_port_taken_before_the_server_binds_it_starts_it_again_on_others(kind, tmp_path, monkeypatch):
    import socket

    from dlio_ckpt_ext.tools import local_cloud, local_s3
    module, ports_a_start = (local_s3, 9) if kind == "s3" else (local_cloud, 1)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    chosen, free = [], local_s3.free_port

    def taken_first() -> int:
        chosen.append(free() if chosen else taken.getsockname()[1])
        return chosen[-1]
    monkeypatch.setattr(module, "free_port", taken_first)
    server = local_s3.start(tmp_path / "data") if kind == "s3" else local_cloud.start(kind, tmp_path / "data")
    try:
        assert len(chosen) == 2 * ports_a_start  # the first start died on the taken port
        assert local_s3.answers(server.endpoint)
    finally:
        server.stop()
        taken.close()
