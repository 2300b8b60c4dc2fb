"""Our traces as dftracer's own analysers read them (dftracer-analyzer's
dfanalyzer with its dlio preset, dftracer-utils' validate and stats), run from
an environment of their own (run_scripts/tool_env.sh dftracer) on a 2-rank,
3-checkpoint run's traces, on DLIO 2.0.0 and upstream main; and what our spans
carry, read from the trace files themselves."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import tool, tool_env
from dlio_run import MLCOMMONS, UPSTREAM, run_dlio
from test_dlio_integration import trace_events

# the fork writes upstream's traces (pydftracer 2, upstream's loop): covered there; CI's time is counted
pytestmark = [pytest.mark.skipif(MLCOMMONS, reason="the analysers are run on DLIO 2.0.0 and upstream main"),
              pytest.mark.e2e]
RANKS, CHECKPOINTS = 2, 3
STEPS = tuple(range(1, CHECKPOINTS + 1))
#: the trace's and our windows' time for the same checkpoints (docs/tracing.md "Reading a trace")
TOLERANCE = 0.05
#: dfanalyzer's time bin, longer than the run: with its 1 s bins a checkpoint whose ranks start in
#: two bins is counted in both (docs/tracing.md)
ONE_BIN_S = 86400


@pytest.fixture(scope="module")
def dftracer_bin() -> Path:
    return tool_env("dftracer")


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("traced")
    run = run_dlio(workdir, RANKS, "llama3_tiny_checkpoint",
                   f"++workload.checkpoint.num_checkpoints_write={CHECKPOINTS}",
                   f"++workload.checkpoint.num_checkpoints_read={CHECKPOINTS}", "++workload.streaming.chunk_size=8MiB",
                   "++workload.streaming.record_chunks=True", env={"DFTRACER_ENABLE": "1", "DFTRACER_INC_METADATA": "1"})
    assert run.returncode == 0, run.output[-3000:]
    assert "DFTRACER_INC_METADATA" not in run.output  # no warning: arguments are kept
    res = subprocess.run([tool("dlio-ckpt-report"), "traces", str(run.out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return run, run.out / "traces"


def _tool(dftracer_bin: Path, name: str, *args: str, cwd: Path) -> str:
    # dfanalyzer names its run after $USER, and stops without it
    env = {**os.environ, "USER": os.environ.get("USER", "ci")}
    res = subprocess.run([str(dftracer_bin / name), *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    return res.stdout


def test_our_spans_carry_their_arguments_on_the_thread_that_did_the_work(traced_run):
    run, _ = traced_run
    events = trace_events(run.out)
    assert sorted(events) == [0, 1]
    ours = ("checkpoint", "checkpoint_file", "checkpoint_io", "checkpoint_gen")
    for stats in run.rank_stats():
        rank = stats["rank"]
        mine = [e for e in events[rank] if e["cat"] in ours]
        assert {int(e["args"]["rank"]) for e in mine} == {rank}
        main_tid = next(int(e["tid"]) for e in mine if e["name"] == "checkpoint.save")
        for phase, steps in (("save", STEPS), ("load", STEPS)):
            for step, rec in zip(steps, stats["phases"][phase]):
                span = [e for e in mine if e["name"] == f"checkpoint.{phase}" and int(e["args"]["step"]) == step]
                assert len(span) == 1 and span[0]["cat"] == "checkpoint"
                # the span encloses the rank's own timing of that checkpoint
                assert int(span[0]["dur"]) / 1e6 == pytest.approx(rec["elapsed_s"], abs=0.02)
                assert int(span[0]["args"]["size"]) == sum(f["nbytes"] for f in rec["files"])
            files = [f for rec in stats["phases"][phase] for f in rec["files"]]
            io = "write" if phase == "save" else "read"
            file_spans = [e for e in mine if e["name"] == f"checkpoint.file.{io}"]
            assert sorted((e["args"]["fname"], int(e["args"]["size"])) for e in file_spans) == \
                sorted((f["name"], f["nbytes"]) for f in files)
            requests = [e for e in mine if e["cat"] == "checkpoint_io" and e["name"] == io]
            assert len(requests) == sum(len(f["chunks"]) for f in files)
            assert sum(int(e["args"]["ret"]) for e in requests) == sum(f["nbytes"] for f in files)
            by_offset = sorted((e["args"]["fname"], int(e["args"]["offset"])) for e in requests)
            assert by_offset == sorted((f["name"], int(c[0])) for f in files for c in f["chunks"])
            if phase == "save":  # written from the pipeline's consumer, the checkpoint's own thread
                assert {int(e["tid"]) for e in requests} == {main_tid}
                traced_s = sum(int(e["dur"]) for e in requests) / 1e6
                # each request timed twice (its span, our chunk record) around the same call: a
                # loaded machine may switch threads between the two stamps, a ms or two each
                assert traced_s == pytest.approx(sum(c[3] for f in files for c in f["chunks"]),
                                                 abs=2e-3 * len(requests))
            else:  # read on the reader threads, never on the checkpoint's own
                assert main_tid not in {int(e["tid"]) for e in requests}
        fills = [e for e in mine if e["name"] == "fill"]
        assert len(fills) == sum(len(f["chunks"]) for rec in stats["phases"]["save"] for f in rec["files"])
        assert fills[0]["cat"] == "checkpoint_gen" and main_tid not in {int(e["tid"]) for e in fills}
        assert not [e for e in mine if "step" in e["name"]]


def test_every_trace_validates_as_written_or_as_converted(traced_run, dftracer_bin, tmp_path):
    run, traces = traced_run
    written = sorted(p.name for p in traces.iterdir() if p.name.endswith(".pfw.gz"))
    assert len(written) == RANKS
    out = _tool(dftracer_bin, "dftracer_validate", "-d", str(traces), cwd=tmp_path)
    assert f"Validated {RANKS} file(s): {RANKS} passed, 0 failed" in out
    if UPSTREAM:  # pydftracer 2.x: the files DLIO wrote are the ones the tools read, unchanged
        assert all((run.out / name).read_bytes() == (traces / name).read_bytes() for name in written)


def test_dftracer_stats_counts_the_checkpoint_bytes_of_every_rank(traced_run, dftracer_bin, tmp_path):
    run, traces = traced_run
    stats = json.loads(_tool(dftracer_bin, "dftracer_stats", "-d", str(traces), "--report", "detailed",
                             "--group-by", "cat", "name", "--json", cwd=tmp_path))
    assert len(stats) == RANKS
    expected = run.record()["checkpoint_bytes"] * CHECKPOINTS
    for key in ("checkpoint_io|write", "checkpoint_io|read"):
        assert sum(f["detailed"]["grouped_io"][key]["size"]["sum"] for f in stats) == expected, key
    for f in stats:  # one row per operation, not per step
        grouped = f["detailed"]["grouped_duration"]
        assert grouped["checkpoint|checkpoint.save"]["count"] == CHECKPOINTS
        assert grouped["checkpoint|checkpoint.load"]["count"] == CHECKPOINTS
        assert not [k for k in grouped if "step" in k]


def test_dfanalyzer_dlio_preset_shows_a_checkpoint_layer_agreeing_with_our_windows(traced_run, dftracer_bin,
                                                                                    tmp_path):
    run, traces = traced_run
    # its dask workers as threads: a worker process starved by a loaded machine is declared lost and the
    # analysis fails ("lost dependencies"), which says nothing of the trace
    _tool(dftracer_bin, "dfanalyzer", "analyzer/preset=dlio", f"trace_path={traces}", "cluster.n_workers=1",
          "cluster.processes=False",
          "output=json", f"output.file_path={tmp_path / 'analysis.json'}", f"hydra.run.dir={tmp_path / 'run'}",
          f"analyzer.time_granularity={ONE_BIN_S}", cwd=tmp_path)
    summary = json.loads((tmp_path / "analysis.json").read_text())["views"]["time_range"]["summary"]
    assert summary["unique_process_count"] == RANKS
    layer = summary["layers"]["checkpoint"]
    assert layer["count"] == RANKS * CHECKPOINTS * 2  # a save and a load span per rank per checkpoint
    # the layer's time: the slowest rank's checkpoint spans added up; ours: each
    # checkpoint's window across ranks (the [METRIC] durations), added up
    windows = {p: m[0] * CHECKPOINTS for (p, kind), m in run.window_metrics().items() if kind == "duration"}
    ours = windows["save"] + windows["load"]
    assert layer["time_s"] == pytest.approx(ours, rel=TOLERANCE)
    moved = 2 * run.record()["checkpoint_bytes"] * CHECKPOINTS
    assert moved / layer["time_s"] == pytest.approx(moved / ours, rel=TOLERANCE)
    assert layer["time_s"] <= ours * 1.001  # no rank's spans outlast the windows that hold them
