"""MLCommons' DLIO fork (what mlpstorage pins): its own workload configs, mlpstorage's,
its storage type direct_fs, and mlpstorage's own CLI driving our mechanism."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import tool
from dlio_run import NEEDS_MLCOMMONS, NEEDS_MLPSTORAGE, SHRINK, run_dlio
from test_dlio_integration import SMALL_8B, TWO_ONE, expected_files, on_disk

pytestmark = [NEEDS_MLCOMMONS, pytest.mark.e2e]

OURS = "++workload.checkpoint.checkpoint_mechanism_classname=dlio_ckpt_ext.dlio.mechanism.StreamingCheckpointing"
GiB = float(1 << 30)


def mlpstorage_configs() -> Path:
    """mlpstorage's DLIO workload configs, beside its package (how it finds them itself)."""
    import mlpstorage_py
    return Path(mlpstorage_py.__file__).resolve().parents[1] / "configs" / "dlio"


def assert_dlio_summary_matches_its_per_epoch_stats(out: Path, checkpoint_bytes: int, writes: int, reads: int):
    """The fork's own summary.json, recomputed from its rank 0 per-checkpoint durations."""
    summary = json.loads((out / "summary.json").read_text())["metric"]
    assert summary["checkpoint_size_GB"] == pytest.approx(checkpoint_bytes / GiB, rel=1e-12)
    epoch = json.loads((out / "0_per_epoch_stats.json").read_text())["1"]
    for phase, n in (("save", writes), ("load", reads)):
        durations = [epoch[f"{phase}_ckpt{i}"]["duration"] for i in range(1, n + 1)]
        rates = [checkpoint_bytes / GiB / d for d in durations]
        assert summary[f"{phase}_checkpoint_duration_mean_seconds"] == pytest.approx(sum(durations) / n, rel=1e-6)
        assert summary[f"{phase}_checkpoint_io_mean_GB_per_second"] == pytest.approx(sum(rates) / n, rel=1e-6)


@pytest.mark.parametrize("workload, config_dir", [("llama_8b_zero3", None),
                                                  pytest.param("llama3_8b", "mlpstorage", marks=NEEDS_MLPSTORAGE)])
def test_the_forks_and_mlpstorages_8b_configs_drive_our_mechanism(workdir, workload, config_dir):
    extra = [f"--config-dir={mlpstorage_configs()}"] if config_dir else []
    run = run_dlio(workdir, 2, workload, *SHRINK, *TWO_ONE, OURS, "++workload.checkpoint.time_between_checkpoints=0",
                   *extra)
    assert run.returncode == 0, run.output[-3000:]
    files = expected_files((1, 2), 2, SMALL_8B)
    assert on_disk(workdir / "ckpt") == files
    assert "[INFO] inventory: 8 files present, 8 expected, sizes match" in run.stdout
    record = run.record()
    assert record["status"] == "success" and record["dlio"].startswith("mlcommons fork")
    assert record["checkpoint_bytes"] == sum(files.values()) // 2
    assert_dlio_summary_matches_its_per_epoch_stats(run.out, record["checkpoint_bytes"], 2, 1)


def test_direct_fs_is_honoured_as_o_direct_through_our_posix_backend(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.storage.storage_type=direct_fs",
                   "++workload.storage.storage_options.storage_library=s3dlio",
                   f"++workload.storage.storage_root={workdir}")
    assert run.returncode == 0, run.output[-3000:]
    record = run.record()
    assert record["storage"]["storage_type"] == "direct_fs"
    assert (record["storage"]["write_mode"], record["storage"]["read_mode"]) == ("direct", "direct")
    assert "  page cache                   O_DIRECT writes, fsync before close" in run.stdout
    assert "  page cache                   O_DIRECT reads" in run.stdout
    assert record["inventory"]["ok"] and record["inventory"]["present"] == 8


def test_direct_fs_with_buffered_io_is_refused_naming_the_key(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", *TWO_ONE, "++workload.storage.storage_type=direct_fs",
                   "++workload.storage.storage_options.storage_library=s3dlio",
                   "++workload.storage.storage_options.write_mode=buffered")
    assert run.returncode != 0
    assert "invalid config: workload.storage.storage_options.write_mode='buffered'; allowed: direct with " \
           "storage_type direct_fs" in run.output
    assert not (workdir / "ckpt").exists() or not list((workdir / "ckpt").rglob("*.pt"))


# mlpstorage's capacity gate sizes the unscaled 8B model (225 GB for two writes) on the
# checkpoint folder's file system: a tmpfs of that size, in a mount namespace of the
# test's own, stands in for a big enough disk (the scaled run writes 0.4 GB).
MLPSTORAGE_RUN = """set -e
mount -t tmpfs -o size=400G tmpfs "$FS"
mlpstorage init testorg "$RESULTS"
mlpstorage open checkpointing run file --model llama3-8b --num-processes 1 --client-host-memory-in-gb 1 \\
    --checkpoint-folder "$FS/ckpt" --results-dir "$RESULTS" --systemname testsys --allow-run-as-root \\
    --num-checkpoints-write 2 --num-checkpoints-read 2 --skip-timeseries --params "$@"
cd "$FS/ckpt" && find . -type f -printf '%P %s\\n' > "$SIZES"
"""


@NEEDS_MLPSTORAGE
def test_mlpstorages_own_cli_runs_our_mechanism_and_keeps_our_results_beside_its_metadata(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a tmpfs in a mount namespace of its own "
                    "(mlpstorage's capacity gate sizes the full 8B model)")
    fs, results, sizes = tmp_path / "fs", tmp_path / "results", tmp_path / "sizes.txt"
    fs.mkdir()
    shrink = [o[len("++workload."):] for o in SHRINK]
    env = {**os.environ, "FS": str(fs), "RESULTS": str(results), "SIZES": str(sizes),
           "PATH": f"{Path(tool('mlpstorage')).parent}:{os.environ['PATH']}", "TF_CPP_MIN_LOG_LEVEL": "3"}
    res = subprocess.run(["unshare", "-m", "bash", "-c", MLPSTORAGE_RUN, "run",
                          "checkpoint.checkpoint_mechanism_classname=dlio_ckpt_ext.dlio.mechanism."
                          "StreamingCheckpointing", "checkpoint.time_between_checkpoints=0", *shrink], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=400)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-4000:]
    [run_dir] = (results / "open" / "testorg" / "results" / "testsys" / "checkpointing" / "llama3-8b").glob("2*")
    # mlpstorage's own files of the run ...
    [metadata] = run_dir.glob("*metadata*")
    meta = json.loads(metadata.read_text())
    assert meta["benchmark_type"] == "checkpointing" and meta["model"] == "llama3-8b"
    assert "dlio_ckpt_ext.dlio.mechanism.StreamingCheckpointing" in json.dumps(meta["override_parameters"])
    assert {p.name for p in (run_dir / "dlio_config").iterdir()} >= {"config.yaml", "hydra.yaml", "overrides.yaml"}
    # ... next to ours, from the same DLIO invocation (mlpstorage reports DLIO's failures as success:
    # our record is what says this run completed)
    record = json.loads((run_dir / "ckpt_ext_summary.json").read_text())
    assert record["status"] == "success" and record["ranks"] == 1
    assert (run_dir / "manifest.json").exists() and (run_dir / "rank_stats" / "rank_00000.json").exists()
    # mlpstorage runs 8B below 8 processes in subset mode with data parallelism 1
    expected = expected_files((1, 2), 1, SMALL_8B)
    written = dict(line.rsplit(" ", 1) for line in sizes.read_text().splitlines())
    assert {k: int(v) for k, v in written.items()} == {f"llama3-8b/{k}": v for k, v in expected.items()}
    assert record["checkpoint_bytes"] == sum(expected.values()) // 2
    assert_dlio_summary_matches_its_per_epoch_stats(run_dir, record["checkpoint_bytes"], 2, 2)
    # it left rank_sync at DLIO's default, and we said so
    assert "[WARNING] checkpoint.rank_sync is False" in output
