"""Run dlio_benchmark under mpirun the way a user does, and read its outputs."""
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import tool

from dlio_ckpt_ext.dlio.provenance import dlio_has_checkpoint_workflow, dlio_is_mlcommons_fork
from dlio_ckpt_ext.report.results import read_rank_stats
from dlio_ckpt_ext.result_files import RECORD_FILE

#: which DLIO this environment runs: upstream main prints its own [METRIC]
#: lines (GB label, no ±) and ours become "[INFO] global window:" lines
UPSTREAM = dlio_has_checkpoint_workflow()
#: MLCommons' fork (what mlpstorage pins) runs its own loop like upstream main
MLCOMMONS = dlio_is_mlcommons_fork()
#: the start of our record's "dlio" field and dlio-benchmark's version in this environment
FLAVOUR, DLIO_VERSION = ("mlcommons", "3.0.2") if MLCOMMONS else ("upstream", "2.0.0") if UPSTREAM \
    else ("2.0.0", "2.0.0")
#: DLIO's own checkpoint loop (upstream main, the fork) counts the checkpoints on every rank before
#: the loads: one names-only listing a rank; ours has rank 0 count for all
WALKS_PER_RANK = 1 if UPSTREAM else 0

#: tests that need a DLIO this environment does not have run where the user's own
#: checkout is installed (run_scripts/setup.sh), and skip here naming the variable
NEEDS_UPSTREAM = pytest.mark.skipif(
    not UPSTREAM, reason="needs a DLIO with a checkpoint loop of its own (upstream main, or MLCommons' fork): "
    "DLIO_UPSTREAM_SRC=<your checkout of argonne-lcf/dlio_benchmark> run_scripts/test.sh --dlio upstream")
NEEDS_MLCOMMONS = pytest.mark.skipif(
    not MLCOMMONS, reason="needs MLCommons' DLIO fork: DLIO_MLCOMMONS_SRC=<your checkout of "
    "mlcommons/DLIO_local_changes> run_scripts/test.sh --dlio mlcommons --python 3.12")


def has_mlpstorage() -> bool:
    try:
        import mlpstorage_py  # noqa: F401
    except ImportError:
        return False
    return True


NEEDS_MLPSTORAGE = pytest.mark.skipif(
    not has_mlpstorage(), reason="needs mlpstorage beside MLCommons' fork: MLPSTORAGE_SRC=<your checkout of "
    "mlcommons/storage, mlpstorage >= 3.0.26> with DLIO_MLCOMMONS_SRC, run_scripts/test.sh --dlio mlcommons "
    "--python 3.12")
_FIGURE = (r"Checkpoint (save|load) (duration \(seconds\)|I/O Throughput \((?:GiB|GB)/second\)): "
           r"([0-9.]+) \(\u00b1?([0-9.]+)\)$")
DLIO_METRIC = re.compile(r"^\[METRIC\] " + _FIGURE, re.M)


def _figures(regex: re.Pattern, text: str) -> dict:
    return {(m[0], m[1].split()[0]): (float(m[2]), float(m[3])) for m in regex.findall(text)}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def metrics(self) -> dict:
        """The [METRIC] lines DLIO's reporter printed (ours on 2.0.0, on stdout;
        upstream's on main, through its logger on stderr)."""
        return _figures(DLIO_METRIC, self.output)

    @property
    def output(self) -> str:
        """Both streams, for what must (not) appear on either."""
        return self.stdout + "\n" + self.stderr

    def window_metrics(self) -> dict:
        """Our global-window figures (the [METRIC] lines on 2.0.0, [INFO] lines on upstream)."""
        if not UPSTREAM:
            return self.metrics()
        return _figures(re.compile(r"^\[INFO\] global window: " + _FIGURE, re.M), self.stdout)

    def record(self) -> dict:
        """Our record of the run (RECORD_FILE)."""
        return json.loads((self.out / RECORD_FILE).read_text())

    def dlio_summary(self) -> dict:
        """DLIO's summary.json (upstream's schema on both DLIOs)."""
        return json.loads((self.out / "summary.json").read_text())

    def rank_stats(self) -> list[dict]:
        return read_rank_stats(self.out)


#: the presets' 8B shape scaled down to 2 layers of width 256 (SMALL_8B of test_dlio_integration.py)
SHRINK = ["++workload.model.num_layers=2", "++workload.model.transformer.hidden_size=256",
          "++workload.model.transformer.ffn_hidden_size=512", "++workload.model.transformer.vocab_size=1024",
          "++workload.model.transformer.num_attention_heads=4", "++workload.model.transformer.num_kv_heads=2"]


#: set by conftest.py for each test: only a test marked e2e starts DLIO
STARTS_DLIO_ALLOWED = True


def dlio_command(workdir: Path, np: int, workload: str, *overrides: str, checkpoint_folder=None,
                 out: str = "out") -> list[str]:
    """A run's results go to workdir/out (a run refuses a folder with results in it)."""
    assert STARTS_DLIO_ALLOWED, "a test that starts DLIO is marked pytest.mark.e2e (pytest.ini)"
    return [tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(np),
            tool("dlio_benchmark"), f"workload={workload}", f"++workload.output.folder={workdir / out}",
            f"++workload.checkpoint.checkpoint_folder={checkpoint_folder or workdir / 'ckpt'}", *overrides]


#: what Open MPI says when mpirun itself could not start, before any rank ran
#: (seen once in CI on a loaded machine): nothing of the test's subject ran
MPIRUN_DID_NOT_START = ("The PMIx server's listener thread failed to start",)


def run_dlio(workdir: Path, np: int, workload: str, *overrides: str, timeout: int = 300,
             env: dict | None = None, checkpoint_folder: str | None = None, out: str = "out") -> Run:
    cmd = dlio_command(workdir, np, workload, *overrides, checkpoint_folder=checkpoint_folder, out=out)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0 and any(m in res.stdout + res.stderr for m in MPIRUN_DID_NOT_START):
        res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    log_run(np, time.monotonic() - start)
    return Run(res.returncode, res.stdout, res.stderr, workdir / out)


def log_run(np: int, seconds: float) -> None:
    """Where CI's time goes: each DLIO run's test, ranks and seconds, appended to DLIO_RUN_LOG
    (.ci/run sums them by file)."""
    if os.environ.get("DLIO_RUN_LOG"):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(os.environ["DLIO_RUN_LOG"], "a") as f:
            f.write(f"{test}\t{np}\t{seconds:.1f}\n")


def submitted_or_only_timing_broken(returncode: int, stderr: str) -> bool:
    """True when dlio-ckpt-submit finished, or failed only on the gap rules.

    A tiny model's invocations are shorter than DLIO's start-up after the cache drop on
    these 2 cores, so rules 2.1.24/2.1.25 may rightly fail a submission whose subject is
    something else (the gap rules are test_submission.py's subject).
    """
    verdict = [line for line in stderr.splitlines() if line.startswith("[submit]")]
    return returncode == 0 or (returncode == 1 and bool(verdict) and all(
        v.startswith("[submit] timing rule broken: ") for v in verdict))
