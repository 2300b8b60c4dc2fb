"""What checkpointing costs DLIO's training loop: the same training run
without checkpoints and with them saved synchronously, asynchronously and in
two tiers, side by side in one run.

    python bench/training_bench.py --dir /work/bench_data [--ranks 2] [--rounds 3] [--gib-per-rank 0.25]
                                   [--steps 24] [--every 4] [--compute 0.05] [--settle 3]
                                   [--json bench/results/training_bench.json]

Each run is `dlio_benchmark workload=llama3_tiny_checkpoint` with DLIO's
training workflow (TensorFlow loader, npz samples on DIR) scaled so each
rank's part of a checkpoint is about --gib-per-rank, --steps steps of
--compute seconds, a checkpoint every --every steps (O_DIRECT with fsync
below DIR; tiers: every checkpoint to DIR/local, every second one to the
checkpoint folder in the background). The four modes run once each per
round, in an order rotated every round (a warm-up round first). From each
run: DLIO's own AU (its blocks leave the checkpoints out), the loop's AU
with the checkpoints and its time a step (the TRAINING block), and the
mean checkpoint stall. Ratios against the run without checkpoints of the
same round, medians over the rounds.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import BenchTable  # noqa: E402
from local_bench import SHARED_DIR, scaled_model_options, model_overrides, settle, shape  # noqa: E402
from remote_bench import BIN, mpirun  # noqa: E402

MODES = {"none": ["++workload.workflow.checkpoint=False"],
         "sync": [],
         "async": ["++workload.checkpoint.async_mode=async"],
         "tiers": ["++workload.tiers.persistent_every=2", "++workload.tiers.replication_jump=1"]}


def run(args, hidden: int, mode: str, tag: str) -> dict:
    base, out = Path(args.dir), Path(args.dir) / "training_bench_out" / tag
    for folder in (base / "local", base / SHARED_DIR, out):
        shutil.rmtree(folder, ignore_errors=True)
    settle(args.settle)
    extra = [f"++workload.tiers.local_root={base / 'local'}"] if mode == "tiers" else []
    samples = args.steps * args.ranks * 2  # batches of 2, one epoch of --steps steps a rank
    cmd = mpirun(args.ranks) + [
        str(BIN / "dlio_benchmark"), "workload=llama3_tiny_checkpoint", f"++workload.output.folder={out}",
        f"++workload.checkpoint.checkpoint_folder={base / SHARED_DIR}", "++workload.checkpoint.keep_files=False",
        "++workload.checkpoint.num_checkpoints_read=0", "++workload.workflow.train=True",
        f"++workload.workflow.generate_data={not (base / 'data').exists()}",
        f"++workload.dataset.data_folder={base / 'data'}", "++workload.dataset.format=npz",
        f"++workload.dataset.num_files_train={samples // 4}", "++workload.dataset.num_samples_per_file=4",
        "++workload.dataset.record_length=65536", "++workload.framework=tensorflow",
        "++workload.reader.data_loader=tensorflow", "++workload.reader.batch_size=2", "++workload.train.epochs=1",
        f"++workload.train.computation_time={args.compute}",
        f"++workload.checkpoint.steps_between_checkpoints={args.every}",
        *model_overrides(hidden, args.vocab), *MODES[mode], *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=base)
    if res.returncode:
        sys.exit(f"run {tag} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    t = json.loads((out / "ckpt_ext_summary.json").read_text())["training"]
    got = {"dlio_au": t["dlio"]["au_mean_pct"], "au": t["au_with_checkpoints_pct"], "step_s": t["step_mean_s"],
           "stall_s": t["checkpoint_stall_mean_s"], "checkpoints": len(t["checkpoints"])}
    print(f"  {tag}: DLIO AU {got['dlio_au']:.1f} %, AU with checkpoints {got['au']:.1f} %, "
          f"{got['step_s']:.4f} s a step, {got['checkpoints']} checkpoints, stall {got['stall_s']:.4f} s", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gib-per-rank", type=float, default=0.25, help="each rank's part of a checkpoint")
    ap.add_argument("--steps", type=int, default=24, help="training steps a rank")
    ap.add_argument("--every", type=int, default=4, help="steps between checkpoints")
    ap.add_argument("--compute", type=float, default=0.05, help="DLIO's computation time a step (s)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of idle disk before every run")
    ap.add_argument("--modes", default=",".join(MODES), help="the ways of saving run beside none (none always runs)")
    scaled_model_options(ap)
    ap.add_argument("--json", help="also save the table here (bench/results/NAME.json for the docs)")
    args = ap.parse_args()
    modes = list(dict.fromkeys(["none", *args.modes.split(",")]))
    if set(modes) - set(MODES):
        ap.error(f"--modes takes some of {', '.join(MODES)}, not {args.modes!r}")
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(Path(args.dir) / "data", ignore_errors=True)
    hidden = shape(args.gib_per_rank, args.ranks, args.vocab, args.hidden)["hidden"]
    for mode in modes:
        run(args, hidden, mode, f"warm-{mode}")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(args.rounds):
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        for mode in order:
            results[mode].append(run(args, hidden, mode, f"round{i + 1}-{mode}"))
    table = BenchTable("training_bench", f"DLIO's training loop, {args.ranks} ranks, {args.steps} steps of "
                       f"{args.compute:g} s, a checkpoint every {args.every} steps of {args.gib_per_rank:g} GiB a "
                       f"rank, {args.rounds} rounds: without checkpoints and with each way of saving",
                       ["checkpoints", "DLIO AU (%)", "AU with checkpoints (%)", "time a step (s)",
                        "step time / none", "AU / none", "stall (s)"])
    med = lambda m, key: statistics.median(r[key] for r in results[m])  # noqa: E731
    ratio = lambda m, key: statistics.median(a[key] / b[key] for a, b in zip(results[m], results["none"]))  # noqa
    for mode in modes:
        table.add(mode, f"{med(mode, 'dlio_au'):.1f}", f"{med(mode, 'au'):.1f}", f"{med(mode, 'step_s'):.4f}",
                  f"{ratio(mode, 'step_s'):.3f}", f"{ratio(mode, 'au'):.3f}",
                  "-" if mode == "none" else f"{med(mode, 'stall_s'):.4f}")
    table.note("ratios: each run against the run without checkpoints of the same round, median over the rounds; "
               "DLIO's AU leaves the checkpoints out (its blocks end before a save), ours counts the loop's "
               "whole time")
    table.finish(args.json, results)


if __name__ == "__main__":
    main()
