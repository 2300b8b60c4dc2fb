"""Generator threads under mpirun's CPU binding, in real runs: each rank's share
of its node's CPUs as its binding allows, and a binding that starves generation said."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import tool
from dlio_run import Run

CPUS = len(os.sched_getaffinity(0))
TWO_ONE = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=1"]


def run_bound(workdir: Path, np: int, binding: list[str], *overrides: str, ckpt: Path | None = None) -> Run:
    """mpirun as a user types it, without --oversubscribe (which turns binding off)."""
    out = workdir / "out"
    cmd = [tool("mpirun"), "--allow-run-as-root", "-np", str(np), *binding, tool("dlio_benchmark"),
           "workload=llama3_tiny_checkpoint", f"++workload.output.folder={out}",
           f"++workload.checkpoint.checkpoint_folder={ckpt or workdir / 'ckpt'}", *TWO_ONE, *overrides]
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return Run(res.returncode, res.stdout, res.stderr, out)


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to bind 2 ranks apart")
@pytest.mark.parametrize("np, binding, mask, share, name", [
    (2, ["--bind-to", "core"], 1, 1.0, "core"),
    (2, ["--bind-to", "none"], CPUS, CPUS / 2, "none"),
    (1, [], 1, 1.0, "core"),               # Open MPI's default for up to 2 processes: a core each
    (1, ["--bind-to", "none"], CPUS, float(CPUS), "none"),
])
def test_each_rank_records_the_share_its_binding_allows(workdir, np, binding, mask, share, name):
    run = run_bound(workdir, np, binding)
    assert run.returncode == 0, run.output[-3000:]
    for stats in run.rank_stats():
        assert (stats["cpu_mask_size"], stats["cpu_share"]) == (mask, pytest.approx(share))
        assert stats["gen_thread_budget"]["limit"] == max(1, int(share))
    record = run.record()
    assert record["binding"] == name and record["threads"]["binding"] == name


def test_a_binding_that_starves_generation_is_said(workdir):
    """One rank bound to one CPU, writing to memory (tmpfs): one generator thread
    rarely outruns that storage twice over, and no second thread may be added.
    Whether it did is the machine's business: the run must say so exactly when
    its own per-file fill and I/O times say so."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm for a storage faster than one generator thread")
    ckpt = shm / f"dlio-ckpt-binding-{workdir.name}"
    try:
        run = run_bound(workdir, 1, ["--bind-to", "core"], "++workload.checkpoint.num_checkpoints_write=3",
                        ckpt=ckpt)
    finally:
        subprocess.run(["rm", "-rf", str(ckpt)])
    assert run.returncode == 0, run.output[-3000:]
    [stats] = run.rank_stats()
    budget = stats["gen_thread_budget"]
    files = [f for save in stats["phases"]["save"] for f in save["files"]]
    # the budget counts closing (the fsync) as I/O
    under_target = [f["name"] for f in files
                    if (f["io_s"] + f["close_s"]) / f["fill_s"] < budget["target_margin"]]
    assert budget["limit"] == 1 and budget["used_per_file"] == [1] * len(files) == [f["gen_threads"] for f in files]
    assert budget["files_at_limit_under_target"] == len(under_target)
    assert budget["starved"] == bool(under_target)
    warning = ("[WARNING] generation was limited by the CPU binding: rank(s) 0 ran at their generator thread "
               "limit with generation under 2x I/O (rank 0 may run on 1 CPU(s), its share 1; binding: core); "
               "give each rank more CPUs: mpirun --bind-to none, or --map-by ppr:1:node:PE=N with N CPUs per rank")
    assert (warning in run.stdout) == bool(under_target) == (warning in run.record()["warnings"])
