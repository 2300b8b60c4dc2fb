"""End to end: mpirun + DLIO's own dlio_benchmark entry point + our presets."""
import json
import re
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from conftest import tool
from dlio_ckpt_ext.result_files import RECORD_FILE
from dlio_run import DLIO_VERSION, FLAVOUR, UPSTREAM, dlio_command, run_dlio

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

TINY = dict(L=4, h=512, f=1792, V=8192, heads=8, kv=2)


def zero3_file_sizes(L, h, f, V, heads, kv, ranks):
    """Per-rank model/optimizer bytes for ZeRO-3, TP1 PP1 (DESIGN.md section 4)."""
    dkv = h // heads * kv
    s = ranks
    layer = h // s + h * (h + 2 * dkv) // s + h * h // s + h // s + 2 * h * f // s + h * f // s
    model = (L * layer + 2 * (h * V // s) + h // s) * 2
    n = (2 * V * h + h + L * (2 * h + h * (h + 2 * dkv) + h * h + 3 * f * h)) // ranks
    return model, (3 * n + 15 * h) * 4


@pytest.mark.install_check
def test_tiny_preset_two_ranks_files_metrics_and_summary(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=3",
                   "++workload.checkpoint.num_checkpoints_read=2", "++workload.streaming.verify=True",
                   "++workload.streaming.chunk_size=4MiB", "++workload.streaming.record_chunks=True")
    assert run.returncode == 0, run.stderr[-3000:]

    model, optim = zero3_file_sizes(**TINY, ranks=2)
    on_disk = {str(p.relative_to(workdir / "ckpt")): p.stat().st_size for p in (workdir / "ckpt").rglob("*.pt")}
    assert on_disk == {f"global_epoch1_step{s}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt": size
                       for s in (1, 2, 3) for r in (0, 1) for kind, size in (("model", model), ("optim", optim))}

    summary = run.record()
    ranks = run.rank_stats()
    assert [r["rank"] for r in ranks] == [0, 1]
    assert summary["status"] == "success" and summary["ranks"] == 2 and summary["ranks_per_node"] == 2
    assert summary["checkpoint_bytes"] == 2 * (model + optim)
    assert summary["inventory"]["ok"] and summary["inventory"]["present"] == 12
    assert summary["versions"]["dlio-benchmark"] == DLIO_VERSION and summary["versions"]["dgen-py"]
    assert summary["dlio"].startswith(FLAVOUR)
    assert summary["config"]["effective"]["streaming"]["verify"] is True
    assert summary["threads"]["gen_threads_per_rank"] >= 1
    # adaptive generator threads: one per file saved, between 1 and the node share
    assert summary["threads"]["gen_thread_mode"] == "adaptive"
    for r in ranks:
        used = r["gen_thread_budget"]["used_per_file"]
        assert len(used) == 6 and all(1 <= t <= r["gen_thread_budget"]["limit"] for t in used)
        assert [f["gen_threads"] for rec in r["phases"]["save"] for f in rec["files"]] == used
    assert "generator threads (rank 0)" in run.stdout
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    assert summary["transparent_hugepage"] == thp[thp.index("[") + 1:thp.index("]")]
    assert all(r["buffer_huge_page_bytes"] <= r["buffer_bytes"] for r in ranks)
    if summary["transparent_hugepage"] != "never":  # the buffers asked for huge pages and got some
        assert all(r["buffer_huge_page_bytes"] > 0 for r in ranks)

    metrics = run.window_metrics()
    dlio_metrics = run.metrics()
    dlio_summary = run.dlio_summary()
    assert dlio_summary["num_hosts"] == 1 and dlio_summary["num_accelerators"] == 2
    assert dlio_summary["metric"]["checkpoint_size_GB"] == pytest.approx(2 * (model + optim) / 2**30)
    for phase, count in (("save", 3), ("load", 2)):
        # recompute each checkpoint's global window from the per-rank stats
        durations, rates = [], []
        for i in range(count):
            recs = [r["phases"][phase][i] for r in ranks]
            assert sum(len(r["files"]) for r in recs) == 4
            for rec in recs:
                assert sum(c[1] for f in rec["files"] for c in f["chunks"]) == rec["bytes"]
                assert all(f["chunk_count"] == len(f["chunks"]) for f in rec["files"])
            duration = max(r["end"] for r in recs) - min(r["start"] for r in recs)
            durations.append(duration)
            rates.append(sum(r["bytes"] for r in recs) / 2**30 / duration)
        assert metrics[(phase, "duration")] == pytest.approx(
            (statistics.fmean(durations), statistics.pstdev(durations)), abs=1e-4)
        assert metrics[(phase, "I/O")] == pytest.approx(
            (statistics.fmean(rates), statistics.pstdev(rates)), abs=1e-4)
        assert summary[phase]["throughput_gib_s_mean"] == pytest.approx(statistics.fmean(rates))
        assert len(summary[phase]["per_checkpoint"]) == count
        # DLIO's summary.json and [METRIC] lines: from our windows on 2.0.0; on
        # upstream from its own timing (rank 0, barrier to barrier with
        # rank_sync), which differs from the window by the barriers' latency
        tolerance = dict(rel=0.05) if UPSTREAM else dict(rel=1e-9)
        dm = dlio_summary["metric"]
        assert dm[f"{phase}_checkpoint_io_mean_GB_per_second"] == pytest.approx(statistics.fmean(rates), **tolerance)
        assert dm[f"{phase}_checkpoint_duration_mean_seconds"] == pytest.approx(statistics.fmean(durations),
                                                                              **tolerance)
        assert dm[f"{phase}_checkpoint_io_stdev_GB_per_second"] >= 0
        assert dlio_metrics[(phase, "I/O")][0] == pytest.approx(dm[f"{phase}_checkpoint_io_mean_GB_per_second"],
                                                                abs=1e-4)
        per_epoch = json.loads((run.out / "1_per_epoch_stats.json").read_text())["1"]
        assert len([k for k in per_epoch if k.startswith(f"{phase}_ckpt")]) == count
    assert "RESULTS (save):" in run.stdout and "bottleneck" in run.stdout
    # its output piped, as here: no progress bar (test_progress_bar_only_on_a_terminal has the terminal)
    assert "rank 0 save" not in run.output and "[METRIC] Checkpoint save duration" in run.output


def test_llama3_8b_scaled_down_four_ranks(workdir):
    shape = dict(L=2, h=256, f=512, V=1024, heads=4, kv=2)
    run = run_dlio(workdir, 4, "llama3_8b_checkpoint", "++workload.model.num_layers=2",
                   "++workload.model.transformer.hidden_size=256", "++workload.model.transformer.ffn_hidden_size=512",
                   "++workload.model.transformer.vocab_size=1024", "++workload.model.transformer.num_attention_heads=4",
                   "++workload.model.transformer.num_kv_heads=2", "++workload.checkpoint.num_checkpoints_write=2",
                   "++workload.checkpoint.num_checkpoints_read=1", "++workload.streaming.chunk_size=1MiB")
    assert run.returncode == 0, run.stderr[-3000:]
    model, optim = zero3_file_sizes(**shape, ranks=4)
    sizes = sorted(p.stat().st_size for p in (workdir / "ckpt").rglob("*.pt"))
    assert sizes == sorted([model] * 8 + [optim] * 8)
    assert set(run.metrics()) == {("save", "duration"), ("save", "I/O"), ("load", "duration"), ("load", "I/O")}
    assert run.record()["ranks"] == 4


# each a DLIO start-up (7 s here): one of each way a run is refused (an unknown key, an impossible
# shape, a mechanism that is not ours); every other message is tests/test_config.py's
@pytest.mark.parametrize("override, message", [
    ("++workload.checkpoint.bogus=1", "workload.checkpoint.bogus=1; allowed: one of the keys"),
    ("++workload.model.parallelism.tensor=3", "workload.model.parallelism.tensor=3; allowed: a divisor of both "
                                              "num_attention_heads 8 and num_kv_heads 2"),
    ("++workload.checkpoint.checkpoint_mechanism_classname=dlio_ckpt_ext.config.RunConfig",
     "checkpoint_mechanism_classname='dlio_ckpt_ext.config.RunConfig'; allowed: "
     "dlio_ckpt_ext.dlio.mechanism.StreamingCheckpointing"),
])
def test_bad_input_fails_with_a_clear_error_and_no_metrics(workdir, override, message):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", override)
    assert run.returncode != 0
    assert message in run.stderr
    assert "[METRIC]" not in run.output
    assert not (run.out / "summary.json").exists() and not (run.out / RECORD_FILE).exists()


def test_checkpoint_folder_that_cannot_be_created(workdir):
    (workdir / "afile").write_text("x")
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint",
                   f"++workload.checkpoint.checkpoint_folder={workdir / 'afile' / 'sub'}")
    assert run.returncode != 0
    assert f"cannot create directory {workdir / 'afile' / 'sub'}" in run.stderr
    assert "[METRIC]" not in run.output


def test_one_failing_rank_aborts_the_whole_job(workdir):
    # a directory where rank 1's first file goes: rank 1 fails, rank 0 would wait for it
    blocker = workdir / "ckpt" / "global_epoch1_step1" / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    blocker.mkdir(parents=True)
    t0 = time.monotonic()
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - t0 < 60
    assert f"rank 1: checkpoint save 1 failed: cannot create {blocker}" in run.stderr
    assert "[METRIC]" not in run.output
    assert not (run.out / "summary.json").exists() and not (run.out / RECORD_FILE).exists()
    # the run's marker stayed behind and says what is on the storage: rank 0 removes its partial file when
    # mpirun's SIGTERM reaches it in Python, which mpirun's SIGKILL may forestall
    status = subprocess.run([tool("dlio-ckpt-report"), "status", str(run.out)], capture_output=True, text=True)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "the run did not finish" in status.stdout
    left = {f.name: f.stat().st_size for f in blocker.parent.iterdir() if f != blocker}
    if left:
        assert "checkpoint 1 incomplete" in status.stdout and "not started: 2-10 (9)" in status.stdout
        assert f"missing: global_epoch1_step1/{blocker.name}\n" in status.stdout
        for name, size in left.items():
            assert re.search(rf"partial: global_epoch1_step1/{name} \({size} of \d+ bytes\)", status.stdout) \
                or f"/{name}" not in status.stdout  # complete
    else:
        assert "complete (every file at its planned size): none\n  not started: 1-10 (10)" in status.stdout


def test_a_rank_killed_in_checkpoint_2_keeps_checkpoint_1s_figures_for_status(workdir):
    """kill -9 of rank 1 once checkpoint 1 finished on every rank: the run breaks, and
    `status` says checkpoint 1's window exactly as the run said it while running."""
    import os
    import psutil
    cmd = dlio_command(workdir, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=3",
                       "++workload.checkpoint.num_checkpoints_read=0")
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    said = None
    try:
        for line in proc.stdout:
            if line.startswith("[INFO] checkpoint save 1, every rank done: "):
                said = line.strip()[len("[INFO] "):]
                break
        assert said, "the run never said checkpoint 1's window"
        rank1 = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if p.environ().get("OMPI_COMM_WORLD_RANK") == "1"]
        assert rank1
        for p in rank1:
            p.send_signal(9)
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode != 0, rest
    status = subprocess.run([tool("dlio-ckpt-report"), "status", str(workdir / "out")], capture_output=True,
                            text=True)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "measured before it broke (checkpoints every rank finished; not a result of a finished run):" \
        in status.stdout
    assert f"    {said}\n" in status.stdout
    duration = re.search(r"every rank done: ([0-9.]+) s, ([0-9.]+) GiB/s", said)
    assert f"[METRIC, unfinished run] Checkpoint save duration (seconds): {duration[1]}" in status.stdout
    assert "checkpoint save 3, every rank done" not in status.stdout


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux 'script' (a pseudo-terminal) is missing")
def test_progress_bar_only_on_a_terminal(workdir):
    cmd = " ".join(shlex.quote(c) for c in dlio_command(workdir, 2, "llama3_tiny_checkpoint",
                                                         "++workload.checkpoint.num_checkpoints_write=2",
                                                         "++workload.checkpoint.num_checkpoints_read=1"))
    on_tty = subprocess.run(["script", "-qec", cmd, "/dev/null"], cwd=workdir, capture_output=True, text=True,
                            timeout=300)
    assert on_tty.returncode == 0, on_tty.stdout[-2000:]
    assert "rank 0 save 1/2" in on_tty.stdout and "rank 0 load 1/1" in on_tty.stdout
    # piped, no bar: test_tiny_preset_two_ranks_files_metrics_and_summary's run


def test_idle_time_between_checkpoints_is_outside_the_window_and_keep_files_false_cleans_up(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=2",
                   "++workload.checkpoint.num_checkpoints_read=1", "++workload.checkpoint.time_between_checkpoints=1.5",
                   "++workload.checkpoint.keep_files=False")
    assert run.returncode == 0, run.stderr[-2000:]
    saves = [r["phases"]["save"] for r in run.rank_stats()]
    gap = min(s[1]["start"] for s in saves) - max(s[0]["end"] for s in saves)
    assert gap >= 1.5
    for window in run.record()["save"]["per_checkpoint"]:
        assert window["duration_s"] < 1.5  # the sleep is not in the window
    assert list((workdir / "ckpt").rglob("*.pt")) == []
