"""DLIO's own profiler switches drive a checkpoint run, on either DLIO."""
import json
import shutil

import pytest

from dlio_run import run_dlio

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)


@pytest.mark.skipif(shutil.which("iostat") is None, reason="iostat (Debian package sysstat) is not installed; "
                                                           ".ci/run installs it")
def test_workflow_profiling_with_iostat_writes_dlios_iostat_json(workdir):
    run = run_dlio(workdir, 2, "llama3_tiny_checkpoint", "++workload.checkpoint.num_checkpoints_write=3",
                   "++workload.checkpoint.num_checkpoints_read=1", "++workload.workflow.profiling=True",
                   "++workload.profiling.profiler=iostat")
    assert run.returncode == 0, run.output[-3000:]
    text = (run.out / "iostat.json").read_text()
    # iostat is stopped with SIGINT, as DLIO does; its JSON names the host and has one report a second
    assert '"sysstat"' in text and '"statistics"' in text
    assert "RESULTS (save):" in run.stdout
    assert json.loads((run.out / "ckpt_ext_summary.json").read_text())["status"] == "success"
