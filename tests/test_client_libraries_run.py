"""Each framework's layout saved and loaded through its framework's own client
library (storage_library=framework) by DLIO at 2 ranks on a real S3 server:
every byte verified, and the server's request counters equal to what the
ranks' records say they sent."""
import importlib.metadata
import json

import pytest

from conftest import BUCKET
from dlio_ckpt_ext.storage import libraries
from dlio_run import SHRINK, run_dlio
from test_client_libraries import agree, server_delta

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

#: the preset of each framework's layout, and the client its framework writes through
CASES = [("torchtitan_llama3_8b_checkpoint", "s3torchconnector"), ("megatron_llama3_8b_checkpoint", "msc"),
         ("maxtext_llama3_8b_checkpoint", "tensorstore"), ("llama3_8b_checkpoint", "minio")]


#: each library's part size (TensorStore: one PUT a file, whatever its size; msc: one PUT up to 64 MiB)
PART_SIZE = {"s3torchconnector": 8 << 20, "minio": 32 << 20, "msc": 64 << 20, "tensorstore": 1 << 40}


def summed(dicts: list) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in (d or {}).items():
            out[k] = out.get(k, 0) + v
    return out


@pytest.mark.parametrize("preset, library", CASES)
def test_a_save_and_a_verified_load_through_the_frameworks_client(s3, tmp_path, preset, library):
    given = "framework" if library != "minio" else "minio"
    before = s3.request_counts()
    run = run_dlio(tmp_path, 2, preset, *SHRINK, "++workload.storage.storage_type=s3",
                   f"++workload.storage.storage_root=s3://{BUCKET}/{library}",
                   f"++workload.storage.storage_options.storage_library={given}",
                   "++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1",
                   "++workload.streaming.verify=True", env=s3.env())
    assert run.returncode == 0, run.stderr[-3000:]
    after = s3.request_counts()
    ours = summed([r.get("requests_total") for r in run.rank_stats()])
    # the run's last two requests come after the records were written: rank 0 releasing its claim on the
    # checkpoint folder (a GET of its marker, to see that it is still this run's, and a DELETE)
    release = {"GET": 1, "DELETE": 1}
    agree(library, summed([ours, release]), server_delta(before, after))
    record = run.record()
    version = importlib.metadata.version(libraries.LIBRARIES[library][1])
    for phase in ("save", "load"):
        counted = record[phase]["per_checkpoint"][0]["requests"]
        assert counted and all(n > 0 for n in counted.values())
        block = run.stdout[run.stdout.index(f"RESULTS ({phase}):"):]
        assert f"  {'client library':28s} {library} {version} (" in block
        assert f"  {'requests (all ranks)':28s} " + ", ".join(f"{k} {n}" for k, n in counted.items()) in block
    storage = json.loads((run.out / "manifest.json").read_text())["storage"]
    assert (storage["storage_library"], storage["library_version"]) == (library, version)
    # the largest object went up in the library's own parts
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{library}/")["Contents"]
    largest = max(listed, key=lambda o: o["Size"])
    parts = s3.client().get_object_attributes(Bucket=BUCKET, Key=largest["Key"],
                                              ObjectAttributes=["ObjectParts"]).get("ObjectParts")
    sizes = [p["Size"] for p in parts["Parts"]] if parts else [largest["Size"]]
    assert sizes[:-1] == [PART_SIZE[library]] * (len(sizes) - 1) and 0 < sizes[-1] <= PART_SIZE[library]


def test_orbax_on_gs_saves_and_loads_through_tensorstores_gcs_kvstore(tmp_path_factory, tmp_path):
    """Orbax's native object path: MaxText's layout on gs:// with storage_library=framework goes
    through TensorStore's gcs kvstore (fake-gcs-server), every byte verified on the load (which
    asks a byte past each file's end, as every reader does: TensorStore's gcs driver refuses such a
    range, S3 answers it); RESULTS names the library, and the bucket holds every planned file."""
    from cloud_servers import CONTAINER, Objects, needs, start_server
    from s3_server import retire
    if needs("gs").args[0]:
        pytest.skip(needs("gs").kwargs["reason"])
    server = start_server("gs", tmp_path_factory.mktemp("gs-data"))
    try:
        run = run_dlio(tmp_path, 2, "maxtext_llama3_8b_checkpoint", *SHRINK, "++workload.storage.storage_type=s3",
                       f"++workload.storage.storage_root=gs://{CONTAINER}/orbax",
                       "++workload.storage.storage_options.storage_library=framework",
                       "++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1",
                       "++workload.checkpoint.keep_files=True", "++workload.streaming.verify=True", env=server.env())
        assert run.returncode == 0, run.stderr[-3000:]
        version = importlib.metadata.version("tensorstore")
        for phase in ("save", "load"):
            block = run.stdout[run.stdout.index(f"RESULTS ({phase}):"):]
            assert f"  {'client library':28s} tensorstore {version} (gcs_request_concurrency 32, " in block
        storage = json.loads((run.out / "manifest.json").read_text())["storage"]
        assert (storage["scheme"], storage["storage_library"]) == ("gs", "tensorstore")
        stored = Objects(server).sizes("orbax/")
        manifests = [k for k in stored if k.endswith("/manifest.ocdbt")]
        assert len(manifests) == 3 and all(stored[k] > 0 for k in manifests)  # two processes, the merged one
        # every file of the plan at its size (the run's inventory: one listing through the SDK), each
        # process's data files there
        assert "[INFO] inventory: 19 files present, 19 expected, sizes match" in run.stdout
        assert all(any(f"/items/ocdbt.process_{p}/d/" in k for k in stored) for p in (0, 1))
    finally:
        retire(server)
