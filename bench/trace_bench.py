"""What our dftracer spans cost, measured in real DLIO runs.

    python bench/trace_bench.py [--ranks 2] [--pairs 4] [--writes 5] [--dir DIR]

Runs the tiny preset (scaled to --hidden) under mpirun and the DLIO of the
environment this Python belongs to, in interleaved pairs (A B / B A, a
discarded warm-up pair first): DFTRACER_ENABLE=1 against no tracing. Prints

* our cost: seconds each rank spent logging our spans inside the timed
  windows (the checkpoint spans), as a share of its save time; and the time
  spent logging file and chunk spans in finalize, outside every window;
* the median traced/untraced save-throughput ratio, which also carries
  dftracer's own interception of every POSIX call (DLIO's tracer, not ours).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def run(workdir: Path, name: str, args, traced: bool) -> dict:
    out = workdir / name
    cmd = [str(BIN / "mpirun"), "--oversubscribe", "-np", str(args.ranks)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [str(BIN / "dlio_benchmark"), "workload=llama3_tiny_checkpoint", f"++workload.output.folder={out}",
            f"++workload.checkpoint.checkpoint_folder={workdir / 'ckpt'}",
            f"++workload.checkpoint.num_checkpoints_write={args.writes}",
            "++workload.checkpoint.num_checkpoints_read=0",
            f"++workload.model.transformer.hidden_size={args.hidden}",
            f"++workload.model.transformer.ffn_hidden_size={args.hidden * 7 // 2}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("DFTRACER_ENABLE", None)
    if traced:
        env["DFTRACER_ENABLE"] = "1"
    res = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    record = json.loads((out / "ckpt_ext_summary.json").read_text())
    ranks = [json.loads(p.read_text()) for p in sorted((out / "rank_stats").glob("*.json"))]
    return {"save_gib_s": record["save"]["throughput_gib_s_mean"], "ranks": ranks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--writes", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size of the scaled model (tiny: 512)")
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: a temporary one)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trace-bench-", dir=args.dir))
    ratios, in_window, after, events = [], [], [], []
    for i in range(args.pairs + 1):
        order = (True, False) if i % 2 else (False, True)
        got = {traced: run(workdir, f"r{i}-{'t' if traced else 'u'}", args, traced) for traced in order}
        if i == 0:
            continue  # warm-up pair
        ratios.append(got[True]["save_gib_s"] / got[False]["save_gib_s"])
        for rank in got[True]["ranks"]:
            save_s = sum(rec["elapsed_s"] for rec in rank["phases"]["save"])
            in_window.append(rank["trace"]["in_window_s"] / save_s)
            after.append(rank["trace"]["after_s"])
            events.append(rank["trace"]["events"])
    print(f"trace bench: {args.ranks} ranks, {args.writes} checkpoints per run, {args.pairs} interleaved pairs, "
          f"environment {BIN.parent}")
    print(f"our spans inside the timed windows: median {100 * statistics.median(in_window):.4f} % of save time "
          f"(max {100 * max(in_window):.4f} %)")
    print(f"our file and chunk spans, logged in finalize (outside the windows): median "
          f"{1000 * statistics.median(after):.2f} ms per rank for {int(statistics.median(events))} events")
    print(f"save throughput, traced / untraced (dftracer's interception included): median "
          f"{statistics.median(ratios):.3f} over {len(ratios)} pairs {[round(r, 3) for r in ratios]}")


if __name__ == "__main__":
    main()
