"""storage_options.storage_library: object storage through each framework's own
client library (s3torchconnector, multi-storage-client, TensorStore, minio),
beside s3dlio. What the server stored and counted is checked against what the
backend says it sent, and the part sizes against each library's defaults."""
import importlib.util

import numpy as np
import pytest

from conftest import BUCKET
from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.storage import libraries, open_backend
from dlio_ckpt_ext.storage.libraries import requests

LIBRARIES = ("s3torchconnector", "minio", "msc", "tensorstore")
MiB = 1 << 20
#: each library's own parts of an object of 70 MiB: its default part size (none: one PUT)
PARTS_OF_70_MIB = {"s3torchconnector": [8 * MiB] * 8 + [6 * MiB], "minio": [32 * MiB] * 2 + [6 * MiB],
                   "msc": [32 * MiB] * 2 + [6 * MiB], "tensorstore": None}
#: the server's counter each of our kinds lands in (SeaweedFS counts by method and status, a listing and a copy
#: apart; a HEAD is a GET there)
METHOD = {"PUT": "PUT", "UploadPart": "PUT", "COPY": "COPY", "CreateMultipartUpload": "POST",
          "CompleteMultipartUpload": "POST", "GET": "GET", "HEAD": "GET", "LIST": "LIST", "DELETE": "DELETE",
          "AbortMultipartUpload": "DELETE"}


def by_method(counts: dict, keyed=lambda kind: METHOD[kind]) -> dict:
    out: dict = {}
    for kind, n in counts.items():
        if n:
            out[keyed(kind)] = out.get(keyed(kind), 0) + n
    return out


def server_delta(before: dict, after: dict) -> dict:
    """The server's requests between two readings of its counters ("METHOD STATUS"), by method."""
    return by_method({k: after[k] - before.get(k, 0) for k in after}, lambda key: key.split()[0])


#: libraries whose requests are counted from their documented splitting of a call, not as each leaves:
#: a retry the CRT or minio makes on its own (a part resent after a reset connection) is the server's only
DERIVED = ("s3torchconnector", "minio")
#: the most such retries a test tolerates, all of them data requests (a part, a ranged GET)
RETRIES_UNSEEN = 3


def agree(library: str, ours: dict, server: dict) -> None:
    """Our count by method equals the server's; for a library counted by its splitting, the server may
    hold a few more data requests: the client's own retries, which it does not tell."""
    mine = by_method(ours)
    if library not in DERIVED:
        assert mine == server, (ours, server)
        return
    extra = {k: server.get(k, 0) - mine.get(k, 0) for k in set(mine) | set(server)}
    assert all(n >= 0 for n in extra.values()), (ours, server)
    retried = {k: n for k, n in extra.items() if n}
    assert set(retried) <= {"PUT", "GET"} and sum(retried.values()) <= RETRIES_UNSEEN, (ours, server)


def test_a_misspelled_library_is_refused_in_one_line_naming_the_key_and_the_values():
    with pytest.raises(ConfigError) as err:
        open_backend("s3", f"s3://{BUCKET}/x", {"storage_library": "s3torch"})
    text = str(err.value)
    assert "\n" not in text and "workload.storage.storage_options.storage_library='s3torch'" in text
    for name in (*LIBRARIES, "s3dlio", "framework"):
        assert name in text


def test_a_library_not_installed_is_refused_naming_its_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorstore" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        libraries.resolve("framework", "orbax")
    text = str(err.value)
    assert "\n" not in text and "storage_library='framework'" in text
    assert "tensorstore (storage_library=framework with checkpoint.layout=orbax) is not installed here: " \
           "pip install tensorstore" in text


def test_framework_names_each_layouts_own_client():
    assert {layout: libraries.resolve("framework", layout) for layout in libraries.FRAMEWORK_LIBRARY} == {
        "dcp": "s3torchconnector", "megatron": "msc", "orbax": "tensorstore", "deepspeed": "s3dlio",
        "safetensors": "s3dlio"}
    assert libraries.resolve(None) == "s3dlio"


def test_a_client_library_on_a_file_root_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="s3dlio for file:// roots"):
        open_backend("s3", f"file://{tmp_path}", {"storage_library": "minio"})


@pytest.fixture(scope="module")
def env(s3):
    import os
    saved = dict(os.environ)
    os.environ.update(s3.env())
    yield s3
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("library", LIBRARIES)
def test_each_library_stores_and_reads_back_through_its_own_requests(env, library):
    """A tiny file, one under a part and one of 70 MiB, written as the engine writes
    (16 MiB chunks) and read back in 8 MiB ranges: the bytes are the same, the server
    counted exactly the requests the backend says, and the parts are the library's."""
    s3 = env
    backend = open_backend("s3", f"s3://{BUCKET}/lib/{library}", {"storage_library": library})
    rng = np.random.default_rng(7)
    files = {"tiny": rng.bytes(1000), "small": rng.bytes(5 * MiB), "big": rng.bytes(70 * MiB)}
    before, counted = s3.request_counts(), backend.request_counts()
    for name, data in files.items():
        w = backend.open_writer(f"ck/{name}", len(data))
        view = memoryview(data)
        for at in range(0, len(data), 16 * MiB):
            piece = view[at:at + 16 * MiB]
            if w.zero_copy:
                w.reserve(len(piece))[:] = piece
                w.commit(len(piece))
            else:
                w.write(piece)
        w.close()
    for name, data in files.items():
        r = backend.open_reader(f"ck/{name}", len(data))
        got = b"".join(bytes(r.read(at, min(8 * MiB, len(data) - at))) for at in range(0, len(data), 8 * MiB))
        r.close()
        assert got == data, name
    assert backend.exists("ck/tiny") and not backend.exists("ck/none")
    # a resume's discovery through the library: a listing of a folder, a marker read, a missing one
    assert backend.children("ck") == ["big", "small", "tiny"] and backend.children("") == ["ck"]
    assert backend.read_marker("ck/tiny") == files["tiny"] and backend.read_marker("ck/none") is None
    after = s3.request_counts()
    ours = requests.since(counted, backend.request_counts())  # the process's tally, since `counted`
    agree(library, ours, server_delta(before, after))
    parts = s3.client().get_object_attributes(Bucket=BUCKET, Key=f"lib/{library}/ck/big",
                                              ObjectAttributes=["ObjectParts"]).get("ObjectParts")
    assert (parts and [p["Size"] for p in parts["Parts"]]) == PARTS_OF_70_MIB[library] or (
        parts is None and PARTS_OF_70_MIB[library] is None)
    described = backend.describe()
    assert described["storage_library"] == library and described["library_version"]
    with pytest.raises(StorageError, match=f"missing checkpoint file s3://{BUCKET}/lib/{library}/ck/none"):
        backend.open_reader("ck/none", 10).read(0, 10)


def write_whole(backend, path: str, data: bytes) -> None:
    w = backend.open_writer(path, len(data))
    w.write(memoryview(data))
    w.close()


def test_an_ocdbt_manifest_is_committed_conditionally_and_a_foreign_write_refused(env):
    """TensorStore writes an OCDBT manifest as OCDBT commits it: read first (missing), then
    If-None-Match: *; then If-Match on the ETag this rank wrote, each after TensorStore's HEAD
    (SeaweedFS is not AWS). Another writer's change in between is refused, naming the manifest."""
    s3 = env
    backend = open_backend("s3", f"s3://{BUCKET}/lib/ocdbt", {"storage_library": "tensorstore"})
    key = "lib/ocdbt/items/ocdbt.process_0/manifest.ocdbt"
    before, counted = s3.request_counts(), backend.request_counts()
    write_whole(backend, "items/ocdbt.process_0/manifest.ocdbt", b"v1" * 50)
    write_whole(backend, "items/ocdbt.process_0/manifest.ocdbt", b"v2" * 60)
    ours = requests.since(counted, backend.request_counts())
    assert {k: v for k, v in ours.items() if v} == {"GET": 1, "HEAD": 2, "PUT": 2}
    agree("tensorstore", ours, server_delta(before, s3.request_counts()))
    assert s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"v2" * 60
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"another writer")
    with pytest.raises(StorageError, match=f"s3://{BUCKET}/{key}: the OCDBT manifest changed under this save"):
        write_whole(backend, "items/ocdbt.process_0/manifest.ocdbt", b"v3" * 60)
    assert s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"another writer"


def test_a_library_holding_whole_files_is_counted_and_a_plan_past_the_memory_is_refused():
    """multi-storage-client holds each file whole until its upload: Megatron 8B's largest file
    a rank writes counts in the rank's memory, and a node that cannot hold it is refused first."""
    from dlio_ckpt_ext.checkpoint.memory import check_memory, rank_buffers
    from dlio_ckpt_ext.tools.presets import compose_config
    over = ["++workload.storage.storage_type=s3", "++workload.storage.storage_root=s3://b/p",
            "++workload.storage.storage_options.storage_library=framework"]
    cfg = compose_config("megatron_llama3_8b_checkpoint", over, 8)
    largest = max(f.size for f in cfg.layout.rank_plan(cfg.shape, cfg.parallelism, 8, 0).files)
    held = {key: n for key, _, n in rank_buffers(cfg, 8)}
    # the file, and its 32 MiB parts uploading 8 at once
    assert held[libraries.KEY] == largest + 8 * (32 << 20) and largest > 1 << 30
    with pytest.raises(ConfigError) as err:
        check_memory(cfg, 8, 8, available=4 * largest)
    assert str(err.value).startswith(f"invalid config: {libraries.KEY}='msc'")
    assert f"the client library's own buffers {held[libraries.KEY] / (1 << 30):.2f} GiB" in str(err.value)
    s3dlio = compose_config("megatron_llama3_8b_checkpoint", over[:2], 8)
    assert libraries.KEY not in {key for key, _, _ in rank_buffers(s3dlio, 8)}


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """fake-gcs-server with bucket ckpt, its SDK environment set for the module."""
    from cloud_servers import needs, serving
    if needs("gs").args[0]:
        pytest.skip(needs("gs").kwargs["reason"])
    yield from serving("gs", tmp_path_factory.mktemp("gs-data"))


def test_on_gs_tensorstore_writes_through_its_gcs_kvstore_and_the_others_are_refused(gcs):
    """Orbax's native object path: on gs://, tensorstore (and framework with Orbax's layout) sends
    the bytes through TensorStore's gcs kvstore, and its manifests by generation; the bytes read
    back with the GCS SDK are ours. The S3 clients are refused on gs:// naming the key; framework
    with another layout is the SDK's."""
    from cloud_servers import Objects
    from dlio_ckpt_ext.storage.gcs import GcsBackend
    from dlio_ckpt_ext.storage.libraries.tensorstore_kv import TensorstoreGcsBackend
    root = f"gs://{BUCKET}/lib/ts"
    backend = open_backend("s3", root, {"storage_library": "tensorstore"})
    assert type(backend) is TensorstoreGcsBackend
    assert type(open_backend("s3", root, {"storage_library": "framework"}, layout="orbax")) is TensorstoreGcsBackend
    assert type(open_backend("s3", root, {"storage_library": "framework"}, layout="dcp")) is GcsBackend
    with pytest.raises(ConfigError, match="storage_library.*s3torchconnector is an S3 client"):
        open_backend("s3", root, {"storage_library": "s3torchconnector"})
    with pytest.raises(ConfigError, match="storage_library"):
        open_backend("s3", f"az://{BUCKET}/x", {"storage_library": "tensorstore"})
    data = np.random.default_rng(3).bytes(5 * MiB + 7)
    write_whole(backend, "ck/data", data)
    for _ in range(2):
        write_whole(backend, "ck/ocdbt.process_0/manifest.ocdbt", b"m" * 120)
    objects = Objects(gcs)
    assert objects.read("lib/ts/ck/data") == data
    r = backend.open_reader("ck/data", len(data))
    assert bytes(r.read(MiB, 2 * MiB)) == data[MiB:3 * MiB]
    described = backend.describe()
    assert (described["storage_library"], described["gcs_request_concurrency"]) == ("tensorstore", 32)
    assert backend.exists("ck/data") and not backend.exists("ck/none")
    assert backend.list_sizes("ck") == {"ck/data": len(data), "ck/ocdbt.process_0/manifest.ocdbt": 120}


def test_msc_says_the_retries_and_throttles_boto3_met_as_the_front_made_them(s3, monkeypatch):
    """multi-storage-client sends every request through boto3: its retries (attempts past each call)
    and the throttles answered (503 SlowDown from a front before the server, every 3rd data
    request) are counted, and equal what the front did; the bytes are right."""
    from dlio_ckpt_ext.storage import retries
    from throttle_front import ThrottleFront
    front = ThrottleFront(int(s3.endpoint.rsplit(":", 1)[1]), 3, "s3")
    for key, value in {**s3.env(), "AWS_ENDPOINT_URL": front.endpoint}.items():
        monkeypatch.setenv(key, value)
    try:
        backend = open_backend("s3", f"s3://{BUCKET}/lib/busy", {"storage_library": "msc"})
        data = np.random.default_rng(5).bytes(100 * MiB)
        before, front_before = backend.retry_counts(), front.counts.throttled
        write_whole(backend, "ck/big", data)
        r = backend.open_reader("ck/big", len(data))
        assert b"".join(bytes(r.read(at, 8 * MiB)) for at in range(0, len(data), 8 * MiB)) == data
        r.close()
        throttled = front.counts.throttled - front_before
    finally:
        front.stop()
    assert throttled >= 2 and front.counts.throttled_puts and front.counts.throttled_gets
    assert retries.since(before, backend.retry_counts()) == {"throttled": throttled, "retried": throttled, "gave_up": 0}
    assert backend.describe()["retries_counted"] is True
