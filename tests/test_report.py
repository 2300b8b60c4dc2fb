"""Report, compare, sweep and submission tools fed with real benchmark runs."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import tool
from dlio_ckpt_ext.result_files import RECORD_FILE, RUNNING_FILE
from dlio_ckpt_ext.report.cli import main as report_main
from dlio_ckpt_ext.submission.submit import Submission, check_closed_rules, effective_config

SMALL = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=2"]


@pytest.fixture
def two_runs(finished_runs):
    """Two real runs that differ in one setting (the chunk size: 4MiB, 8MiB)."""
    return finished_runs


def assert_real_picture(path, min_colours=20):
    img = np.asarray(Image.open(path).convert("RGB"))
    assert img.shape[0] > 300 and img.shape[1] > 500
    assert len(np.unique(img.reshape(-1, 3), axis=0)) >= min_colours  # not a blank canvas


@pytest.mark.e2e
def test_results_directory_has_summary_manifest_config_and_rank_stats(two_runs):
    out = two_runs[0].out
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("versions", "git_commit", "hosts", "ranks_per_node", "threads", "storage", "cache_method",
                "start_time_utc", "end_time_utc"):
        assert key in manifest
    assert "chunk_size: 4MiB" in (out / "effective_config.yaml").read_text()
    assert len(list((out / "rank_stats").glob("rank_*.json"))) == 2



@pytest.mark.e2e
def test_status_of_a_finished_run(two_runs, capsys):
    out = two_runs[0].out
    assert not (out / RUNNING_FILE).exists()  # removed once the record was written
    assert report_main(["status", str(out)]) == 0
    assert "the run finished" in capsys.readouterr().out


@pytest.mark.e2e
def test_run_report_png_and_printed_numbers(two_runs, capsys):
    out = two_runs[0].out
    assert report_main(["run", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = two_runs[0].record()
    assert f"checkpoint save: {summary['save']['throughput_gib_s_mean']:.4f}" in printed
    assert_real_picture(out / "report.png")


@pytest.mark.e2e
def test_the_run_picture_draws_the_records_figures_and_goodput_where_the_run_has_an_interval(two_runs):
    """Read back from matplotlib's objects: a bar a checkpoint at the record's throughput, a legend
    naming what is drawn; with the record's GOODPUT (an interval), its curves and bars below."""
    import matplotlib.pyplot as plt
    from dlio_ckpt_ext.goodput import scales
    from dlio_ckpt_ext.report.plots import run_figure
    from dlio_ckpt_ext.report.results import load_result
    result = load_result(two_runs[0].out)
    fig = run_figure(result)
    bars = fig.axes[1]
    want = [w["throughput_gib_s"] for phase in ("save", "load") for w in result.summary[phase]["per_checkpoint"]]
    assert [p.get_height() for p in bars.patches] == pytest.approx(want) and len(want) == 4
    assert [t.get_text() for t in bars.get_legend().get_texts()] == ["save", "load"]
    assert len(fig.axes) == 3  # no interval: no goodput
    plt.close(fig)
    result.summary["goodput"] = scales(result.summary, [1024], 3.8e-3, 0.0, 600.0)
    fig = run_figure(result)
    curves, badput = fig.axes[3:]
    assert len(curves.get_lines()) == 3 * len(result.summary["goodput"]["rows"]) == 6
    assert [p.get_height() for p in badput.patches[:2]] == pytest.approx(
        [100 * r["at_interval"]["save_stall"] for r in result.summary["goodput"]["rows"]])
    plt.close(fig)


@pytest.mark.e2e
def test_compare_flags_the_changed_setting_next_to_the_throughput_change(two_runs, capsys):
    a, b = (r.out for r in two_runs)
    assert report_main(["compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    sa, sb = two_runs[0].record(), two_runs[1].record()
    change = 100 * (sb["save"]["throughput_gib_s_mean"] - sa["save"]["throughput_gib_s_mean"]) / \
        sa["save"]["throughput_gib_s_mean"]
    assert f"{sa['save']['throughput_gib_s_mean']:.4f}" in printed and f"{change:+.1f}%" in printed
    assert "settings: 1 difference(s)" in printed
    assert "! streaming.chunk_size: '4MiB' -> '8MiB'" in printed
    assert "versions: same" in printed and "environment: same" in printed


@pytest.mark.e2e
def test_sweep_with_hydra_multirun_gives_tables_and_chart(tmp_path):
    """A sweep over the checkpoint interval (the goodput model's: workload.goodput.interval_s):
    throughput a job, and each job's goodput at its interval in the table and drawn against it."""
    from dlio_ckpt_ext.report.plots import sweep_figure
    from dlio_ckpt_ext.report.sweep import sweep_table
    sweep = tmp_path / "sweep"
    cmd = [tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2", tool("dlio_benchmark"), "-m",
           "workload=llama3_tiny_checkpoint", *SMALL, "++workload.goodput.interval_s=300,600",
           f"++workload.checkpoint.checkpoint_folder={tmp_path / 'ckpt'}", f"hydra.sweep.dir={sweep}"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert report_main(["sweep", str(sweep)]) == 0
    rows = list(csv.DictReader(open(sweep / "sweep.csv")))
    assert [r["workload.goodput.interval_s"] for r in rows] == ["300", "600"]
    for row in rows:
        summary = json.loads((sweep / row["job"] / RECORD_FILE).read_text())
        assert float(row["save_gib_s"]) == pytest.approx(summary["save"]["throughput_gib_s_mean"])
        assert float(row["load_gib_s"]) == pytest.approx(summary["load"]["throughput_gib_s_mean"])
        assert summary["goodput"]["interval_s"] == float(row["workload.goodput.interval_s"])
        assert float(row["goodput_pct"]) == pytest.approx(100 * summary["goodput"]["rows"][0]["at_interval"]["goodput"])
    assert len((sweep / "sweep.md").read_text().splitlines()) == 4
    assert_real_picture(sweep / "sweep.png", min_colours=10)
    swept, table, _ = sweep_table(sweep)
    fig = sweep_figure(swept, table)
    line = fig.axes[1].get_lines()[0]
    assert list(line.get_xdata()) == [300.0, 600.0]
    assert list(line.get_ydata()) == pytest.approx([float(r["goodput_pct"]) for r in rows])


@pytest.mark.e2e
def test_compare_puts_two_tiered_runs_persist_slack_and_goodput_side_by_side(two_runs):
    """Two runs with TIERS and GOODPUT (their records' blocks from real windows): compare prints
    each block's headline figures for A and B with the change."""
    from dlio_ckpt_ext.results.tiers import tiers_summary
    from dlio_ckpt_ext.goodput import scales
    from dlio_ckpt_ext.report.compare import compare
    from dlio_ckpt_ext.report.results import load_result
    runs = [load_result(r.out) for r in two_runs]
    for run, interval in zip(runs, (1.0, 0.5)):
        windows = run.summary["save"]["per_checkpoint"]
        run.summary["tiers"] = {**tiers_summary(windows, windows[1:], interval, 2),
                                "settings": {"persistent_every": 1, "interval_s": interval}}
        run.summary["goodput"] = scales(run.summary, [1024], 3.8e-3, 0.0, 600.0)
    lines, _ = compare(*runs)
    slack = [sum(r["slack_s"] for r in run.summary["tiers"]["persistent"]) / len(run.summary["tiers"]["persistent"])
             for run in runs]
    row = next(line for line in lines if line.startswith("tiers: persist slack mean (s)"))
    assert row.split()[-3:-1] == [f"{slack[0]:.4f}", f"{slack[1]:.4f}"]
    goodput = [100 * run.summary["goodput"]["rows"][0]["at_interval"]["goodput"] for run in runs]
    row = next(line for line in lines if line.startswith("goodput: goodput at the run's interval (%)"))
    assert row.split()[-3:] == [f"{goodput[0]:.4f}", f"{goodput[1]:.4f}",
                                f"{100 * (goodput[1] - goodput[0]) / goodput[0]:+.1f}%"]


@pytest.mark.e2e
def test_report_commands_reject_what_is_not_a_complete_results_directory(two_runs, tmp_path, capsys):
    assert report_main(["run", str(tmp_path)]) == 2
    assert f"is not a results directory: it has no {RECORD_FILE}" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / RECORD_FILE).write_text((two_runs[0].out / RECORD_FILE).read_text())
    (broken / "rank_stats").mkdir()
    assert report_main(["compare", str(broken), str(two_runs[1].out)]) == 2
    assert "is incomplete: 0 of 2 per-rank stats files" in capsys.readouterr().err
    assert report_main(["sweep", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["dlio_ckpt_ext.report", "dlio_ckpt_ext.submission.submit"])
def test_entry_points_have_help(module):
    res = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "usage:" in res.stdout


def test_closed_rules():
    ok = Submission("llama3_8b_checkpoint", ["n1"], 8)
    assert check_closed_rules(ok, effective_config(ok), True, 64 << 30) == []
    bad = Submission("llama3_8b_checkpoint", ["n1", "n2", "n3", "n4"], 2,
                     ["++workload.checkpoint.num_checkpoints_read=5", "++workload.checkpoint.fsync=False"])
    problems = check_closed_rules(bad, effective_config(bad), False, 128 << 30)
    assert "4.6.2 2 processes on a host; CLOSED requires more than 4 per host" in problems
    assert any("num_checkpoints_read is 5" in p for p in problems)
    assert any("fsync is off" in p for p in problems)
    # 2 of 8 ranks (14.05 GB each) write 262 GiB per host over 10 checkpoints: under 3x 128 GiB of RAM
    assert any("less than 3x its RAM" in p for p in problems)
    subset = Submission("llama3_8b_checkpoint", ["n1"], 8, subset_data=8)
    assert check_closed_rules(subset, effective_config(subset), True, 64 << 30) == []


@pytest.mark.parametrize("override, violation", [
    ("++workload.model.num_layers=2", "model.num_layers is 2; CLOSED requires the preset's 32"),
    ("++workload.model.transformer.hidden_size=1024", "model.transformer.hidden_size is 1024"),
    ("++workload.model.optimizer_datatype=fp16", "model.optimizer_datatype is 'fp16'; CLOSED requires the preset's 'fp32'"),
    ("++workload.model.parallelism.zero_stage=1", "model.parallelism.zero_stage is 1"),
    ("++workload.streaming.dedup_ratio=4", "streaming.dedup_ratio is 4; CLOSED requires the preset's 1"),
])
def test_closed_means_exactly_the_presets_bytes(override, violation):
    sub = Submission("llama3_8b_checkpoint", ["n1"], 8, [override])
    problems = check_closed_rules(sub, effective_config(sub), True, 64 << 30)
    assert any(p.startswith(f"4.6.3 {violation}") for p in problems), problems
    if "dedup" not in override:
        assert any(p.startswith("4.6.3 rank 0 writes ") for p in problems), problems


def test_closed_allows_settings_that_do_not_change_what_is_written():
    sub = Submission("llama3_8b_checkpoint", ["n1"], 8, ["++workload.streaming.chunk_size=64MiB",
                                                              "++workload.storage.storage_options.write_mode=buffered"])
    assert check_closed_rules(sub, effective_config(sub), True, 64 << 30) == []


def test_submit_with_an_unknown_workload_lists_the_presets(tmp_path):
    res = subprocess.run([tool("dlio-ckpt-submit"), "--workload", "llama3_9b_checkpoint", "--ranks-per-host", "4",
                          "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--workload='llama3_9b_checkpoint'; allowed: one of the checkpoint presets: llama3_1t_checkpoint, " \
           "llama3_405b_checkpoint, llama3_70b_checkpoint, llama3_8b_checkpoint, llama3_tiny_checkpoint" in res.stderr


def test_submit_dry_run_refuses_a_shrunk_model_as_closed(tmp_path, apart):
    res = subprocess.run([tool("dlio-ckpt-submit"), "--workload", "llama3_8b_checkpoint", "--hosts", "n1",
                          "--ranks-per-host", "8", "--accelerator-type", "b200", "--checkpoint-folder", str(apart),
                          "--dry-run", "--", "++workload.model.num_layers=2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "[submit] CLOSED rule: 4.6.3 model.num_layers is 2; CLOSED requires the preset's 32" in res.stdout
    assert "not a valid CLOSED run" in res.stderr


PYDFTRACER_1X = """[
 {"id":"1","name":"write","cat":"POSIX","pid":"0","tid":"25069","ts":"1796130287821282","dur":"28018","ph":"X","args":{"hostname":"vm","ret":"22024192","fname":"/c/123"}}
{"id":"2","name":"checkpoint.save","cat":"checkpoint","pid":"0","tid":"25069","ts":"1796130287821000","dur":"30000","ph":"X","args":{"rank":0,"step":1,"size":22024192}}
"""


def test_traces_converts_pydftracer_1x_files_and_copies_2x_ones(tmp_path, capsys):
    import gzip
    run = tmp_path / "run"
    (run / "rank_stats").mkdir(parents=True)
    (run / "rank_stats" / "rank_00000.json").write_text(json.dumps({"rank": 0, "pid": 4242}))
    (run / "trace-0-of-1.pfw").write_text(PYDFTRACER_1X)
    (run / "trace-0-of-1-abc-app.pfw.gz").write_bytes(b"\x1f\x8b kept as it is")
    (run / "manifest.json").write_text("{}")
    assert report_main(["traces", str(run)]) == 0
    out = run / "traces"
    assert sorted(p.name for p in out.iterdir()) == ["trace-0-of-1-abc-app.pfw.gz", "trace-0-of-1.pfw.gz"]
    assert (out / "trace-0-of-1-abc-app.pfw.gz").read_bytes() == b"\x1f\x8b kept as it is"
    events = [json.loads(line) for line in gzip.decompress((out / "trace-0-of-1.pfw.gz").read_bytes()).splitlines()]
    assert events[0] == {"id": 1, "name": "write", "cat": "POSIX", "pid": 4242, "tid": 25069,
                         "ts": 1796130287821282, "dur": 28018, "ph": "X",
                         "args": {"hostname": "vm", "ret": 22024192, "fname": "/c/123"}}
    assert events[1]["args"] == {"rank": 0, "step": 1, "size": 22024192} and events[1]["dur"] == 30000
    assert f"2 trace file(s) in {out}" in capsys.readouterr().out


def test_traces_refuses_a_run_without_traces_or_without_process_ids(tmp_path, capsys):
    (tmp_path / "rank_stats").mkdir()
    assert report_main(["traces", str(tmp_path)]) == 2
    assert "holds no dftracer trace (trace-*.pfw*): was the run made with DFTRACER_ENABLE=1?" in \
        capsys.readouterr().err
    (tmp_path / "trace-1-of-2.pfw").write_text(PYDFTRACER_1X)
    assert report_main(["traces", str(tmp_path)]) == 2
    assert "has no process id for rank 1" in capsys.readouterr().err


def test_results_block_gives_generation_only_where_something_was_generated():
    """A load without verify regenerates nothing: no 'n/a' generation line, no ratio."""
    from dlio_ckpt_ext.results.phases import results_block
    from dlio_ckpt_ext.engine.profile import phase_report
    rank = {"bytes": 2**30, "fill_s": 0.0, "io_s": 0.5, "close_s": 0.0, "wall_s": 0.5, "chunks_io_bound": 4,
            "chunks_fill_bound": 0}
    plain = results_block("load", phase_report([rank]))
    assert plain[:3] == ["RESULTS (load):",
                         f"  {'I/O':28s} 2.000 GiB/s per rank (0.500 s, of which close/fsync/upload completion "
                         "0.000 s)", f"  {'pipeline overhead':28s} 0.00 %"]
    assert not any("verification" in line or "I/O ratio" in line or "n/a" in line for line in plain)
    verified = results_block("load", phase_report([{**rank, "fill_s": 0.25}]))
    assert verified[1] == f"  {'verification (regenerate)':28s} 4.000 GiB/s per rank (0.250 s)"
    assert f"  {'generation / I/O ratio':28s} 2.00x" in verified


def test_report_points_give_io_per_file_even_where_chunks_were_kept():
    """16 reads of 1 GiB in flight for 1 s: each chunk alone ran at 1 GiB/s, the
    file (and the rank) at 16: the point must be the file's, the rate of the bars."""
    from dlio_ckpt_ext.results.phases import _points
    chunks = [[i * 2**30, 2**30, 0.0, 1.0, 0.0, 0.0, 101.0, 100.0] for i in range(16)]
    file = {"nbytes": 16 * 2**30, "io_s": 1.0, "close_s": 0.0, "fill_s": 0.0, "end": 101.0, "chunks": chunks}
    io, fills, unit = _points([{"files": [file]}], 100.0)
    assert io == [(1.0, 16.0)] and fills == []
    saved = {**file, "fill_s": 2.0, "chunks": [[0, 2**30, 0.5, 0.25, 0, 0, 100.5, 100.25]]}
    io, fills, unit = _points([{"files": [saved]}], 100.0)
    assert io == [(1.0, 16.0)] and fills == [(0.5, 2.0)] and unit == "chunk"


def test_status_calls_a_checkpoint_with_open_uploads_incomplete_not_unstarted():
    from pathlib import Path
    from dlio_ckpt_ext.report.unfinished import CheckpointState, RunState, describe
    marker = {"start_time_utc": "2026-12-02T07:00:00", "ranks": 2, "hosts": ["h"], "checkpoints": {"root": "s3://b/p"}}
    uploads = [{"key": "p/d1/a", "upload_id": "1"}, {"key": "p/d1/b", "upload_id": "2"}]
    state = RunState(Path("f"), marker, [CheckpointState(1, "d1", {"d1/a": 10, "d1/b": 10}, {}, uploads=2),
                                         CheckpointState(2, "d2", {"d2/a": 10}, {})], uploads)
    lines = describe(state)
    assert "  checkpoint 1 incomplete (2 open uploads): 0 of 2 files complete" in lines
    assert "  not started: 2" in lines and state.incomplete == [state.checkpoints[0]]
