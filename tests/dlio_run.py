"""Run dlio_benchmark under mpirun the way a user does, and read its outputs."""
import glob
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from conftest import tool

from dlio_ckpt_ext.dlio.provenance import dlio_has_checkpoint_workflow, dlio_is_mlcommons_fork
from dlio_ckpt_ext.result_files import RECORD_FILE

#: which DLIO this environment runs: upstream main prints its own [METRIC]
#: lines (GB label, no ±) and ours become "[INFO] global window:" lines
UPSTREAM = dlio_has_checkpoint_workflow()
#: MLCommons' fork (what mlpstorage pins) runs its own loop like upstream main
MLCOMMONS = dlio_is_mlcommons_fork()
#: the start of our record's "dlio" field and dlio-benchmark's version in this environment
FLAVOUR, DLIO_VERSION = ("mlcommons", "3.0.2") if MLCOMMONS else ("upstream", "2.0.0") if UPSTREAM \
    else ("2.0.0", "2.0.0")
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
        return [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(self.out / "rank_stats" / "*.json")))]


def dlio_command(workdir: Path, np: int, workload: str, *overrides: str, checkpoint_folder=None,
                 out: str = "out") -> list[str]:
    """A run's results go to workdir/out (a run refuses a folder with results in it)."""
    return [tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(np),
            tool("dlio_benchmark"), f"workload={workload}", f"++workload.output.folder={workdir / out}",
            f"++workload.checkpoint.checkpoint_folder={checkpoint_folder or workdir / 'ckpt'}", *overrides]


def run_dlio(workdir: Path, np: int, workload: str, *overrides: str, timeout: int = 300,
             env: dict | None = None, checkpoint_folder: str | None = None, out: str = "out") -> Run:
    cmd = dlio_command(workdir, np, workload, *overrides, checkpoint_folder=checkpoint_folder, out=out)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    return Run(res.returncode, res.stdout, res.stderr, workdir / out)
