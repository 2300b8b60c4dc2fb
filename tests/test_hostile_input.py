"""Hostile or careless input, through dlio_benchmark and the CLIs as a user hits it."""
import os
import subprocess

import pytest

from conftest import tool
from dlio_ckpt_ext.report.cli import main as report_main
from dlio_run import MLCOMMONS, run_dlio

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

TWO_ONE = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=1"]


@pytest.mark.parametrize("override, message", [
    ("++workload.stroage.storage_root=/tmp/elsewhere", "invalid config: workload.stroage={'storage_root': "
                                                       "'/tmp/elsewhere'}; allowed: a section DLIO or "
                                                       "dlio-ckpt-ext defines: checkpoint, "),
    ("++workload.checkpoints.num_checkpoints_write=1", "invalid config: workload.checkpoints="),
])
def test_a_misspelt_section_stops_the_run(workdir, override, message):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", override)
    assert run.returncode == 2
    assert message in run.stderr and "streaming" in run.stderr
    assert not list((workdir / "ckpt").rglob("*.pt")) if (workdir / "ckpt").exists() else True


def test_buffers_that_do_not_fit_the_node_are_refused_before_allocating(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.streaming.pool_depth=100000", timeout=120)
    assert run.returncode == 2
    # the write pool (100000 x 32 MiB) and the read pool (16 + 2 requests of 8 MiB)
    assert "invalid config: workload.streaming.pool_depth=100000; allowed: settings whose buffers fit this " \
           "node: pool_depth 3125.00 GiB + read_parallelism 0.14 GiB = 3125.14 GiB per rank x 2 rank(s) on this " \
           "node = 6250.28 GiB, more than 90% of the " in run.stderr
    assert "GiB available" in run.stderr


def test_buffered_writes_without_fsync_and_a_shift_that_shifts_nothing_are_said(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.checkpoint.fsync=False",
                   "++workload.storage.storage_options.write_mode=buffered",
                   "++workload.checkpoint.recovery_rank_shift=True")
    assert run.returncode == 0, run.output[-3000:]
    assert "[WARNING] save figures may measure the page cache, not the storage (write method: none: " \
           "buffered writes without fsync)" in run.stdout
    assert "  page cache                   none: buffered writes without fsync" in run.stdout  # in RESULTS (save)
    assert "[WARNING] checkpoint.recovery_rank_shift=True shifts nothing here: all 2 ranks are on one node" \
        in run.stdout
    # page-cache writes may well keep the client's CPU busy: that warning is the CPU's to give
    assert len([w for w in run.record()["warnings"] if "the client's own CPU" not in w]) == 2


def test_a_sweep_goes_on_past_a_refused_job_and_the_table_lists_it(workdir):
    sweep = workdir / "sweep"
    res = subprocess.run([tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2",
                          tool("dlio_benchmark"), "-m", "workload=llama3_tiny_checkpoint", *TWO_ONE,
                          f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}",
                          "++workload.streaming.pool_depth=1,3", f"hydra.sweep.dir={sweep}"],
                         cwd=workdir, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert res.returncode != 0  # hydra reports the failed job at the end
    assert "[ERROR] sweep job 0 (" in res.stderr and "pool_depth=1" in res.stderr
    assert "going on with the next job" in res.stderr
    assert (sweep / "1" / "ckpt_ext_summary.json").exists()  # the job after the refused one ran
    table = subprocess.run([tool("dlio-ckpt-report"), "sweep", str(sweep)], capture_output=True, text=True)
    assert table.returncode == 1
    assert "| 1 | 3 |" in table.stdout
    assert "failed: job 0 (workload.streaming.pool_depth=1): invalid config: workload.streaming.pool_depth=1; " \
           "allowed: at least 2" in table.stdout


@pytest.fixture
def one_run(finished_runs):
    return finished_runs[0]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "rank_stats" / "rank_00001.json").write_text('{"rank": 1, "pha'),
     "rank_stats/rank_00001.json is incomplete or damaged (not valid JSON"),
    (lambda d: (d / "ckpt_ext_summary.json").write_text("null"),
     "ckpt_ext_summary.json is damaged: it holds NoneType 'None', not the expected JSON object"),
    (lambda d: (d / "ckpt_ext_summary.json").write_text('{"status": "success", "ranks": 2, "save": null}'),
     "ckpt_ext_summary.json is damaged: 'save' is None, not an object"),
    (lambda d: (d / "rank_stats" / "rank_00000.json").write_text("[]"),
     "rank_stats/rank_00000.json is damaged: it holds list"),
])
def test_report_tools_name_the_damaged_file(one_run, tmp_path, capsys, damage, message):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(one_run.out), str(copy)], check=True)
    damage(copy)
    for argv in (["run", str(copy)], ["compare", str(copy), str(one_run.out)]):
        assert report_main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


@pytest.mark.skipif(MLCOMMONS, reason="MLCommons' fork has direct_fs (tests/test_mlcommons.py)")
def test_the_forks_direct_fs_is_refused_on_a_dlio_without_it(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.storage.storage_type=direct_fs")
    assert run.returncode == 2
    assert "invalid config: workload.storage.storage_type='direct_fs'; allowed: local_fs (O_DIRECT reads and " \
           "writes by default), parallel_fs or s3: direct_fs is MLCommons' DLIO fork's storage type, and this " \
           "DLIO has none" in run.stderr


def test_an_output_folder_that_is_a_file_is_refused_naming_the_key(workdir):
    (workdir / "afile").write_text("not a directory\n")
    cmd_override = f"++workload.output.folder={workdir / 'afile'}"
    run = subprocess.run([tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2",
                          tool("dlio_benchmark"), "workload=llama3_tiny_checkpoint", *TWO_ONE, cmd_override,
                          f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}"],
                         cwd=workdir, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"[ERROR] invalid config: workload.output.folder='{workdir / 'afile'}'; allowed: a directory, or a " \
           "path where one can be created (this is an existing file)" in run.stderr
    assert (workdir / "afile").read_text() == "not a directory\n"


def test_two_runs_into_the_same_folders_a_second_apart_exactly_one_proceeds(workdir):
    from dlio_run import dlio_command
    cmd = dlio_command(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.checkpoint.time_between_checkpoints=5")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    first = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    import time
    time.sleep(1)
    second = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    outs = [p.communicate(timeout=300) for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    refused = next(err for p, (_, err) in zip((first, second), outs) if p.returncode == 2)
    import re
    assert re.search(r"^\[ERROR\] invalid config: workload\.(output\.folder|checkpoint\.checkpoint_folder)='[^']+'; "
                     r"allowed: a folder no live run uses \(the run started \S+ by pid \d+ on host \S+ \(heartbeat "
                     r"\d+ s ago\) (is using it; wait for it, or choose another folder|claimed it at the same "
                     r"moment)\)$", refused, re.M), refused[-2000:]
    from dlio_ckpt_ext.result_files import OWNER_FILE, RECORD_FILE
    assert (workdir / "out" / RECORD_FILE).exists() and not (workdir / "out" / OWNER_FILE).exists()
    assert not (workdir / "ckpt" / OWNER_FILE).exists()


def test_the_marker_of_a_run_that_died_is_taken_over_and_said(workdir):
    import json
    from dlio_ckpt_ext.result_files import OWNER_FILE
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that ran here and is gone
    (workdir / "ckpt").mkdir()
    (workdir / "ckpt" / OWNER_FILE).write_text(json.dumps({
        "run_id": "x", "host": os.uname().nodename, "pid": dead.pid, "start_time_utc": "2026-12-01T00:00:00Z",
        "heartbeat": 0}))
    run = run_dlio(workdir, 1, "llama3_tiny_checkpoint", *TWO_ONE)
    assert run.returncode == 0, run.output[-3000:]
    assert (f"[WARNING] workload.checkpoint.checkpoint_folder='{workdir / 'ckpt'}': taking over from the run "
            f"started 2026-12-01T00:00:00Z by pid {dead.pid} on host {os.uname().nodename} (heartbeat ") in run.stdout
    assert f"its marker is stale (pid {dead.pid} is not running on {os.uname().nodename}; " in run.stdout
    assert not (workdir / "ckpt" / OWNER_FILE).exists()


def test_sigterm_with_the_output_piped_still_says_what_was_interrupted_and_what_finished(workdir):
    """mpirun forwards no rank output after SIGTERM: the interrupt line goes to its
    piped stderr directly, naming the checkpoints finished before it. Every rank
    says it; mpirun's SIGKILL may end a rank before it does, so any one line counts."""
    import re
    import signal
    import time
    from dlio_run import dlio_command
    cmd = dlio_command(workdir, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=10",
                       "++workload.checkpoint.num_checkpoints_read=0", "++workload.checkpoint.time_between_checkpoints=1")
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "checkpoint save 2/10" in line or "Finished saving checkpoint 2 " in line:  # our loop's, DLIO's
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            break
    seen.append(proc.stdout.read())
    proc.wait(timeout=60)
    out = "".join(seen)
    assert proc.returncode != 0
    assert re.search(r"^\[ERROR\] rank \d: .*interrupted by SIGTERM.* \(finished before it: save 1, save 2(, save 3)?\)$",
                     out, re.M), out[-3000:]
