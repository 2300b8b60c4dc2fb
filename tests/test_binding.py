"""Generator threads under mpirun's CPU binding, in real runs: each rank's share
of its node's CPUs as its binding allows, and a binding that starves generation said."""
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import tool
from dlio_run import Run

pytestmark = pytest.mark.e2e  # each test starts DLIO (conftest.py)

CPUS = len(os.sched_getaffinity(0))
TWO_ONE = ["++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=1"]


def run_bound(workdir: Path, np: int, binding: list[str], *overrides: str, ckpt: Path | None = None,
              program: list[str] | None = None) -> Run:
    """mpirun as a user types it, without --oversubscribe (which turns binding off)."""
    out = workdir / "out"
    cmd = [tool("mpirun"), "--allow-run-as-root", "-np", str(np), *binding, *(program or [tool("dlio_benchmark")]),
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


#: DLIO with a generator slowed to ~0.1 GiB/s (a sleep after each fill): on this
#: machine one dgen-py thread outruns tmpfs about 4x, so a node whose CPU is slower
#: than its storage is made, not found
SLOW_GENERATOR = [sys.executable, "-c", "import sys, time\n"
                  "import dlio_ckpt_ext.engine.stream as stream\n"
                  "fill = stream.fill_exact\n"
                  "def slow(gen, view, offset, where):\n"
                  "    fill(gen, view, offset, where)\n"
                  "    time.sleep(len(view) / 2**30 * 10)\n"
                  "stream.fill_exact = slow\n"
                  "from dlio_benchmark.main import main\n"
                  "sys.argv[0] = 'dlio_benchmark'\n"
                  "sys.exit(main())\n"]


def test_a_binding_that_starves_generation_is_said(workdir):
    """One rank bound to one CPU, writing to memory (tmpfs), its generator slower
    than that storage: no second thread may be added, generation sets the figure
    of every checkpoint, and the run says so, exactly where its own per-file fill
    and I/O times say so."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm for a storage faster than one generator thread")
    ckpt = shm / f"dlio-ckpt-binding-{workdir.name}"
    try:
        run = run_bound(workdir, 1, ["--bind-to", "core"], ckpt=ckpt, program=SLOW_GENERATOR)
    finally:
        subprocess.run(["rm", "-rf", str(ckpt)])
    assert run.returncode == 0, run.output[-3000:]
    [stats] = run.rank_stats()
    budget = stats["gen_thread_budget"]
    assert budget["limit"] == 1 and budget["used_per_file"] == [f["gen_threads"] for save in stats["phases"]["save"]
                                                                for f in save["files"]]
    assert limited_steps(stats) == budget["generation_limited_steps"] == [1, 2]
    warning = (f"[WARNING] generation limited the save of checkpoint step(s) "
               f"{', '.join(map(str, budget['generation_limited_steps']))} on rank(s) 0: at the generator thread "
               "limit, files carrying most of the checkpoint's bytes took longer to generate than to write (rank 0 "
               f"may run on 1 CPU(s), its share 1; binding: core); ")
    advice = (f"give each rank more CPUs: mpirun --bind-to none, or --map-by ppr:1:node:PE={CPUS}" if CPUS > 1 else
              "this node's 1 CPU(s) are all its 1 rank(s) can have")
    assert warning + advice in run.stdout and any(w.startswith(warning + advice) for w in run.record()["warnings"])


def limited_steps(stats: dict) -> list[int]:
    """The rule, recomputed from the rank's own per-file times: checkpoints where
    files slower to generate than to write (close included) carried most bytes."""
    out = []
    for save in stats["phases"]["save"]:
        files = save["files"]
        slow = sum(f["nbytes"] for f in files if f["fill_s"] > f["io_s"] + f["close_s"])  # io_s holds the open
        if 2 * slow > sum(f["nbytes"] for f in files):
            out.append(save["step"])
    return out


def others_cpu_share(work) -> tuple[object, float]:
    """work()'s result, and the CPUs that processes other than work's own kept busy
    while it ran, as a share of the machine: the system's busy time less what
    work's processes (all waited for) used."""
    def busy() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)

    def children() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    busy0, own0, wall0 = busy(), children(), time.monotonic()
    result = work()
    others = (busy() - busy0) - (children() - own0)
    return result, others / ((time.monotonic() - wall0) * psutil.cpu_count())


def test_the_quickstarts_run_prints_no_warning(workdir):
    """The README's first run (2 ranks, Open MPI's default binding of a core each,
    to the local disk): a clean machine's first figures come without a warning, and
    the rule agrees with the rank stats that it had nothing to say. On a machine
    that other work keeps busy the generator may rightly be slower than the disk:
    then the only warning allowed is that one, where the rank stats say so."""
    run, others = others_cpu_share(lambda: run_bound(workdir, 2, []))
    assert run.returncode == 0, run.output[-3000:]
    limited = []
    for stats in run.rank_stats():
        assert limited_steps(stats) == stats["gen_thread_budget"]["generation_limited_steps"]
        limited += limited_steps(stats)
    warnings = [line for line in run.output.splitlines() if "[WARNING]" in line]
    if others < 0.1:  # a quiet machine
        assert warnings == [] and limited == [], (others, run.output[-3000:])
    else:
        assert all("[WARNING] generation limited the save of checkpoint" in w for w in warnings), warnings
        assert bool(warnings) == bool(limited), (warnings, limited)
