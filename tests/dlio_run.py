"""Run dlio_benchmark under mpirun the way a user does, and read its outputs."""
import glob
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from conftest import tool

METRIC = re.compile(r"^\[METRIC\] Checkpoint (save|load) (duration \(seconds\)|I/O Throughput \(GiB/second\)): "
                    r"([0-9.]+) \(\u00b1([0-9.]+)\)$", re.M)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def metrics(self) -> dict:
        return {(m[0], m[1].split()[0]): (float(m[2]), float(m[3])) for m in METRIC.findall(self.stdout)}

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def rank_stats(self) -> list[dict]:
        return [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(self.out / "rank_stats" / "*.json")))]


def dlio_command(workdir: Path, np: int, workload: str, *overrides: str, checkpoint_folder=None) -> list[str]:
    return [tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(np),
            tool("dlio_benchmark"), f"workload={workload}", f"++workload.output.folder={workdir / 'out'}",
            f"++workload.checkpoint.checkpoint_folder={checkpoint_folder or workdir / 'ckpt'}", *overrides]


def run_dlio(workdir: Path, np: int, workload: str, *overrides: str, timeout: int = 300,
             env: dict | None = None, checkpoint_folder: str | None = None) -> Run:
    out = workdir / "out"
    cmd = dlio_command(workdir, np, workload, *overrides, checkpoint_folder=checkpoint_folder)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    return Run(res.returncode, res.stdout, res.stderr, out)
