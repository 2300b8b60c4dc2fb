import os
import shutil
import sys
from pathlib import Path

import pytest


def _allow_boto3_in_the_test_process() -> None:
    """With mlpstorage installed (MLCommons' DLIO environment), importing
    dlio_benchmark bans boto3 from the importing process. The tests check
    buckets with boto3, an S3 client independent of s3dlio, in this process
    only; DLIO runs in subprocesses with the ban in force, and so do our upload
    watch and `dlio-ckpt-report uploads`, which must (and do) work there."""
    try:
        from mlpstorage_py import ban_boto3  # its package installs the ban on import
    except ImportError:
        return
    ban_boto3.install = lambda: None
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ban_boto3._Boto3Banned)]


_allow_boto3_in_the_test_process()

# Every rank of a test's job is on this one machine: Open MPI's shared-memory transport alone. With
# its TCP transport too, each mpirun waited about 1.2 s more to start (measured on DLIO's tiny preset
# at 2 ranks: 6.5 s -> 5.3 s a run; CI starts about 170). The emulated cluster (tests/cluster.py)
# names its own transports on mpirun's command line, which wins over this.
os.environ.setdefault("OMPI_MCA_btl", "self,sm")

#: every process a test starts imports TensorFlow on first use (tests/deferred_imports/sitecustomize.py):
#: DLIO 2.0.0 imports it at start for a profiler no test uses, and that import was most of a rank's
#: start (DLIO's tiny preset at 2 ranks: 10.5 s of CPU a run -> 3.7 s). DLIO_TEST_EAGER_IMPORTS=1 runs
#: DLIO as a user does (.ci/run's install check).
DEFERRED_IMPORTS = Path(__file__).resolve().parent / "deferred_imports"
if os.environ.get("DLIO_TEST_EAGER_IMPORTS") != "1":
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(DEFERRED_IMPORTS), os.environ.get("PYTHONPATH"))
                                               if p)

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "configs" / "dlio" / "workload"
VENV_BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A command from this environment's bin (mpirun, dlio_benchmark, weed)."""
    path = VENV_BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def tool_env(name: str) -> Path:
    """The bin folder of one of our users' tools' own environments (built by
    run_scripts/tool_env.sh on first use: mlcommons, dftracer)."""
    import subprocess
    res = subprocess.run([str(REPO / "run_scripts" / "tool_env.sh"), name], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return Path(res.stdout.strip().splitlines()[-1]).parent


BUCKET = "ckpt"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 server (SeaweedFS on loopback) with bucket BUCKET, per test module."""
    from s3_server import retire, start_s3_server
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"))
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    retire(server)


@pytest.fixture
def workdir(tmp_path: Path):
    """A scratch directory on a disk file system (O_DIRECT capable), removed
    after the test: pytest keeps its last three sessions' files, and a suite's
    checkpoints in three DLIO environments came to tens of GB (a full disk
    then failed S3 uploads with timeouts)."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory):
    """Two finished runs of the tiny preset (2 ranks, 2 saves, 2 loads, one
    checkpoint folder) that differ in one setting, the chunk size: shared by the
    tests that only read a finished run's outputs (each DLIO start is ~8 s of a core a rank)."""
    from dlio_run import run_dlio
    runs, ckpt = [], tmp_path_factory.mktemp("ckpt")
    for chunk in ("4MiB", "8MiB"):
        d = tmp_path_factory.mktemp(f"run{chunk}")
        run = run_dlio(d, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=2",
                       "++workload.checkpoint.num_checkpoints_read=2", f"++workload.streaming.chunk_size={chunk}",
                       checkpoint_folder=str(ckpt))
        assert run.returncode == 0, run.stderr[-2000:]
        runs.append(run)
    return runs


def other_file_system(base: Path) -> Path:
    """A folder path (not made) on another file system than `base`: /dev/shm,
    for checkpoints that rule 4.4.2 wants apart from the results."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == base.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) for the checkpoints (rule 4.4.2)")
    return shm / f"dlio-ckpt-test-{base.name}-{os.getpid()}"


@pytest.fixture
def apart(tmp_path: Path):
    """A checkpoint folder on another file system than tmp_path, removed after the test."""
    folder = other_file_system(tmp_path)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_runtest_setup(item):
    """Before any fixture of the test (a module's shared run included): whether it
    may start DLIO. CI's install check deselects e2e tests but those marked
    install_check, so a test that starts DLIO unmarked would slip into it."""
    import dlio_run
    dlio_run.STARTS_DLIO_ALLOWED = item.get_closest_marker("e2e") is not None
