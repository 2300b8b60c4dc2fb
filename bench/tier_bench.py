"""Two tiers: what the persistent save in the background costs the foreground's
local saves, with the persist thread at normal and at idle priority, side by
side in one run.

    python bench/tier_bench.py --dir /work/bench_data [--ranks 2] [--pairs 4] [--gib-per-rank 0.25]
                               [--writes 8] [--settle 5] [--json bench/results/tier_bench.json]

Each run is `dlio_benchmark workload=llama3_tiny_checkpoint` scaled so each
rank's part is about --gib-per-rank, with workload.tiers: every checkpoint to
DIR/local (replication 2, the copies on this node), every second one also to
DIR/ckpt in the background; both O_DIRECT with fsync. The persist thread
runs at nice 0 and I/O class best-effort ("normal") or at Megatron's nice 10
and I/O class idle ("idle"); the two alternate in pairs (A B / B A, a warm-up
pair first). From each run's record (TIERS): the foreground's local-save time
beside a persist against without one (the slowdown), and the persistent
save's time. Prints every run, then per priority the medians, and the
idle/normal ratios with the order effect cancelled (bench/pairs.py).

Both tiers share one disk here (the run says so): the slowdown is the disk
shared by two writers plus the CPU they share. The I/O class acts only
where the disk's scheduler honours priorities (bfq; mq-deadline for
the idle class); with `none` only the nice value can make a difference.
The table's note names the scheduler of the disk measured.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402
from local_bench import SHARED_DIR, scaled_model_options, model_overrides, settle, shape  # noqa: E402
from pairs import OrderedRatios, check_pairs  # noqa: E402
from remote_bench import BIN, mpirun  # noqa: E402

PRIORITIES = {"normal": (0, "normal"), "idle": (10, "idle")}


def scheduler(folder: str) -> str:
    """The I/O scheduler of the disk holding `folder` (the kernel brackets the chosen one)."""
    st = os.stat(folder)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    for path in (dev / "queue" / "scheduler", dev.parent / "queue" / "scheduler"):  # a disk, or its partition
        if path.exists():
            text = path.read_text()
            return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()
    return "unknown (no block device: an overlay, tmpfs or network file system)"


def run(args, hidden: int, priority: str, tag: str) -> dict:
    nice, io_class = PRIORITIES[priority]
    base, out = Path(args.dir), Path(args.dir) / "tier_bench_out" / tag
    for folder in (base / "local", base / SHARED_DIR):
        shutil.rmtree(folder, ignore_errors=True)
    settle(args.settle)
    cmd = mpirun(args.ranks) + [
        str(BIN / "dlio_benchmark"), "workload=llama3_tiny_checkpoint", f"++workload.output.folder={out}",
        f"++workload.checkpoint.checkpoint_folder={base / SHARED_DIR}", "++workload.checkpoint.keep_files=False",
        f"++workload.checkpoint.num_checkpoints_write={args.writes}", "++workload.checkpoint.num_checkpoints_read=0",
        *model_overrides(hidden, args.vocab),
        f"++workload.tiers.local_root={base / 'local'}", "++workload.tiers.persistent_every=2",
        "++workload.tiers.replication_jump=1", "++workload.tiers.interval_s=600",
        f"++workload.tiers.persistent_nice={nice}", f"++workload.tiers.persistent_io={io_class}"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=base)
    if res.returncode:
        sys.exit(f"run {tag} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    t = json.loads((out / "ckpt_ext_summary.json").read_text())["tiers"]
    shutil.rmtree(out, ignore_errors=True)
    if t["foreground_slowdown"] is None:
        sys.exit(f"run {tag}: no local save ran both beside a persist and without one; raise --writes")
    got = {"slowdown": t["foreground_slowdown"], "alone_s": t["local_s_alone"],
           "beside_s": t["local_s_during_persist"],
           "persist_s": statistics.median(r["duration_s"] for r in t["persistent"]),
           "nice": t["settings"]["nice"], "io_class": t["settings"]["io_class"]}
    print(f"  {tag}: local save {got['alone_s']:.3f} s alone, {got['beside_s']:.3f} s beside a persist "
          f"({got['slowdown']:.3f}x); persist {got['persist_s']:.3f} s (nice {got['nice']}, I/O {got['io_class']})",
          flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure (both tiers go below it)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4, help="an even number: as many pairs with each order")
    ap.add_argument("--gib-per-rank", type=float, default=0.25, help="each rank's part of a checkpoint")
    ap.add_argument("--writes", type=int, default=8, help="checkpoints per run (every second one persistent)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of idle disk before every run")
    scaled_model_options(ap)
    ap.add_argument("--json", help="also save the table here (bench/results/NAME.json for the docs)")
    args = ap.parse_args()
    check_pairs(ap, args.pairs)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    hidden = shape(args.gib_per_rank, args.ranks, args.vocab, args.hidden)["hidden"]
    run(args, hidden, "normal", "warm-normal")
    run(args, hidden, "idle", "warm-idle")
    results: dict[str, list[dict]] = {p: [] for p in PRIORITIES}
    slowdown, persist = OrderedRatios(), OrderedRatios()
    for i in range(args.pairs):
        idle_first = i % 2 == 0
        order = ("idle", "normal") if idle_first else ("normal", "idle")
        got = {p: run(args, hidden, p, f"pair{i + 1}-{p}") for p in order}
        for p in PRIORITIES:
            results[p].append(got[p])
        slowdown.add(idle_first, got["idle"]["slowdown"] / got["normal"]["slowdown"])
        persist.add(idle_first, got["idle"]["persist_s"] / got["normal"]["persist_s"])
    table = BenchTable("tier_bench", f"Two tiers on one disk, {args.ranks} ranks, {args.gib_per_rank:g} GiB a rank's "
                       f"part (local saves keep 2 parts), {args.pairs} pairs: the persist thread's priority",
                       ["persist thread", "local save alone (s)", "beside a persist (s)", "foreground slowdown",
                        "persistent save (s)"])
    for p, (nice, io_class) in PRIORITIES.items():
        med = lambda key: statistics.median(r[key] for r in results[p])  # noqa: E731
        table.add(f"nice {nice}, I/O {io_class}", f"{med('alone_s'):.3f}", f"{med('beside_s'):.3f}",
                  f"{med('slowdown'):.3f}x", f"{med('persist_s'):.3f}")
    table.note(f"idle / normal, order-balanced: foreground slowdown {slowdown.cell()}; persistent save time "
               f"{persist.cell()}")
    table.note(f"I/O scheduler of the disk measured: {scheduler(args.dir)} (the I/O class acts under bfq, and "
               "mq-deadline for idle; with none only the nice value can)")
    table.finish(args.json, {p: results[p] for p in PRIORITIES})


if __name__ == "__main__":
    main()
