"""Inside DLIO, on whichever DLIO this environment has: DLIO's own configs,
DLIO's tracer, DLIO's result files, one results directory per run."""
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlio_ckpt_ext.result_files import RECORD_FILE
from dlio_run import NEEDS_UPSTREAM, SHRINK, dlio_command, run_dlio
from test_dlio_run import zero3_file_sizes

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

SMALL_8B = dict(L=2, h=256, f=512, V=1024, heads=4, kv=2)
TWO_ONE = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=1"]


def on_disk(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*.pt")}


def expected_files(steps, ranks, shape) -> dict[str, int]:
    model, optim = zero3_file_sizes(**shape, ranks=ranks)
    return {f"global_epoch1_step{s}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt": size
            for s in steps for r in range(ranks) for kind, size in (("model", model), ("optim", optim))}


@pytest.mark.skipif(os.environ.get("DLIO_TEST_EAGER_IMPORTS") == "1", reason="DLIO_TEST_EAGER_IMPORTS=1: DLIO's "
                    "processes import TensorFlow at start, as a user's do")
def test_a_tests_dlio_process_imports_tensorflow_on_first_use_and_gets_the_real_one():
    """tests/deferred_imports (tests/conftest.py): DLIO's start leaves TensorFlow unimported, and
    DLIO's profiler module, once it uses it, has the real TensorFlow."""
    probe = ("import sys, dlio_benchmark.main; from dlio_benchmark.profiler import tf_profiler; "
             "before = type(sys.modules['tensorflow']).__name__; "
             "options = tf_profiler.tf.profiler.experimental.ProfilerOptions; "
             "print(before, type(sys.modules['tensorflow']).__name__, options.__module__)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["_Deferred", "module", "tensorflow.python.profiler.profiler_v2"]


@NEEDS_UPSTREAM  # DLIO 2.0.0 has no checkpoint-only workflow to drive a bare mechanism
def test_upstream_own_llama_config_drives_our_mechanism_without_our_presets(workdir):
    run = run_dlio(workdir, 2, "llama_8b_zero3", *SHRINK, *TWO_ONE,
                   "++workload.checkpoint.checkpoint_mechanism_classname="
                   "dlio_ckpt_ext.dlio.mechanism.StreamingCheckpointing",
                   "++workload.checkpoint.time_between_checkpoints=0")
    assert run.returncode == 0, run.output[-3000:]
    assert on_disk(workdir / "ckpt") == expected_files((1, 2), 2, SMALL_8B)
    assert "[INFO] inventory: 8 files present, 8 expected, sizes match" in run.stdout
    assert "RESULTS (save):" in run.stdout and "RESULTS (load):" in run.stdout
    assert set(run.metrics()) == {("save", "duration"), ("save", "I/O"), ("load", "duration"), ("load", "I/O")}
    # upstream's own config leaves rank_sync at DLIO's default (False): said, not hidden
    assert "[WARNING] checkpoint.rank_sync is False" in run.stdout
    assert run.record()["status"] == "success"


def trace_events(folder: Path) -> dict[int, list[dict]]:
    """Every event of every rank's dftracer file (pydftracer 1.x: trace-R-of-N.pfw,
    a JSON array one event a line; 2.x: trace-R-of-N-<hash>-app.pfw.gz, JSON lines)."""
    out: dict[int, list[dict]] = {}
    for path in sorted(folder.glob("trace-*-of-*.pfw*")):
        rank = int(path.name.split("-")[1])
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for line in text.splitlines():
            line = line.strip().lstrip("[").rstrip(",]").strip()
            if line.startswith("{"):
                out.setdefault(rank, []).append(json.loads(line))
    return out


def test_a_trace_without_dftracers_arguments_switch_is_said(workdir):
    run = run_dlio(workdir, 1, "llama3_tiny_checkpoint", *TWO_ONE, env={"DFTRACER_ENABLE": "1"})
    assert run.returncode == 0, run.output[-3000:]
    assert "[WARNING] DFTRACER_ENABLE=1 without DFTRACER_INC_METADATA=1: dftracer drops every event's " \
           "arguments" in run.stdout
    assert "DFTRACER_INC_METADATA" in " ".join(run.record()["warnings"])


def test_a_results_folder_that_holds_results_is_refused(finished_runs, workdir):
    shutil.copytree(finished_runs[0].out, workdir / "out")  # a finished run's results where this run's go
    kept = (workdir / "out" / RECORD_FILE).read_text()
    again = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE)
    assert again.returncode == 2
    assert f"workload.output.folder='{workdir / 'out'}'; allowed: a directory that holds no other run's results" \
        in again.stderr
    assert (workdir / "out" / RECORD_FILE).read_text() == kept


def test_two_runs_started_together_get_their_own_default_run_directories(workdir):
    procs = []
    for name in ("a", "b"):
        cmd = [c for c in dlio_command(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE,
                                       checkpoint_folder=str(workdir / f"ckpt_{name}"))
               if not c.startswith("++workload.output.folder=")]
        procs.append(subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    folders = [next(line.split("results in ", 1)[1].strip() for line in out.splitlines() if "results in " in line)
               for out, _ in outs]
    assert folders[0] != folders[1]
    run_dirs = sorted(p for p in (workdir / "hydra_log" / "llama3_tiny").iterdir())
    assert sorted(map(str, run_dirs)) == sorted(folders)  # no rank left a stray directory behind
    for folder in folders:
        record = json.loads((Path(folder) / RECORD_FILE).read_text())
        assert record["status"] == "success" and len(list((Path(folder) / "rank_stats").iterdir())) == 2
        assert (Path(folder) / "summary.json").exists()


def test_keep_files_false_deletes_only_what_the_run_wrote(workdir):
    folder = workdir / "shared"
    (folder / "global_epoch1_step1").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "global_epoch1_step1" / "other.pt").write_text("not the benchmark's")
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.checkpoint.keep_files=False",
                   checkpoint_folder=str(folder))
    assert run.returncode == 0, run.output[-3000:]
    assert "[INFO] keep_files=False: removed the 8 checkpoint files this run wrote" in run.stdout
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert left == ["global_epoch1_step1", "global_epoch1_step1/other.pt", "notes.txt"]
