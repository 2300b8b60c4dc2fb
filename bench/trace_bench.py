"""What our dftracer spans cost, measured in real DLIO runs.

    python bench/trace_bench.py [--ranks 2] [--pairs 4] [--writes 5] [--dir DIR]
    python bench/trace_bench.py --per-event [--events 20000]

Runs the tiny preset (scaled to --hidden) under mpirun and the DLIO of the
environment this Python belongs to, in interleaved pairs (A B / B A, a
discarded warm-up pair first): DFTRACER_ENABLE=1 against no tracing. Prints

* our cost: seconds each rank spent logging our spans (all logged live, from
  the thread that did the work, inside the timed windows: checkpoint, file,
  request and fill spans with their arguments), as a share of its save time;
* the median traced/untraced save-throughput ratio, which also carries
  dftracer's own interception of every POSIX call (DLIO's tracer, not ours).

--per-event times one request span with our arguments three ways in one
process, side by side: our emitter (the native logger), pydftracer's Python
wrapper (pydftracer 2 only), and the native call with no arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_table import BenchTable

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
    env.pop("DFTRACER_INC_METADATA", None)
    if traced:
        env.update(DFTRACER_ENABLE="1", DFTRACER_INC_METADATA="1")
    res = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    record = json.loads((out / "ckpt_ext_summary.json").read_text())
    ranks = [json.loads(p.read_text()) for p in sorted((out / "rank_stats").glob("*.json"))]
    return {"save_gib_s": record["save"]["throughput_gib_s_mean"], "ranks": ranks}


def per_event(n: int) -> None:
    """Runs in a process of its own: the tracer reads its switches at import."""
    os.environ.update(DFTRACER_ENABLE="1", DFTRACER_INC_METADATA="1", DFTRACER_DATA_DIR="all")
    try:
        from dftracer.python import dftracer
    except ImportError:  # pydftracer 1.x, DLIO 2.0.0's
        from dftracer.logger import dftracer
    from dlio_ckpt_ext.dlio import trace
    folder = tempfile.mkdtemp(prefix="trace-events-")
    tracer = dftracer.initialize_log(os.path.join(folder, "events.pfw"), None, 0)
    emitter = trace._Emitter(tracer)
    ints = {"rank": 0, "step": 1, "ret": 8 << 20, "offset": 0, "index": 0}
    strings = {"fname": "global_epoch1_step1/zero_pp_rank_0_mp_rank_00_model_states.pt"}
    now, ts = time.time(), tracer.get_time()

    def bare(ts: int) -> None:
        # inside enter/exit, as every event must be (pydftracer 1.0.2 crashes on a bare log_event)
        tracer.logger.enter_event()
        tracer.logger.log_event(name="write", cat="checkpoint_io", start_time=ts, duration=1000, int_args={},
                                float_args={}, string_args={})
        tracer.logger.exit_event()

    def timed(call) -> float:
        began = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - began) / n * 1e6
    ways = {"ours (native logger, with arguments)":
            lambda: emitter.emit("write", "checkpoint_io", now, now + 0.001, ints, strings),
            "native logger, no arguments": lambda: bare(ts)}
    if emitter.v2:
        tagged = {k: (0, v) for k, v in ints.items()}
        ways["pydftracer 2's Python wrapper, same arguments"] = lambda: tracer.log_event(
            "write", "checkpoint_io", ts, 1000, int_args=tagged, string_args={k: (0, v) for k, v in strings.items()})
    for label, call in ways.items():
        print(f"{label}: {timed(call):.2f} us per event")
    tracer.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--writes", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size of the scaled model (tiny: 512)")
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--per-event", action="store_true", help="time one event's logging instead")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--json", help="also save the table here (bench/results/trace_bench-ENV.json for the docs)")
    args = ap.parse_args()
    if args.per_event:
        print(f"per-event cost, {args.events} events each, environment {BIN.parent}")
        per_event(args.events)
        return
    workdir = Path(tempfile.mkdtemp(prefix="trace-bench-", dir=args.dir))
    ratios, in_window, events = [], [], []
    for i in range(args.pairs + 1):
        order = (True, False) if i % 2 else (False, True)
        got = {traced: run(workdir, f"r{i}-{'t' if traced else 'u'}", args, traced) for traced in order}
        if i == 0:
            continue  # warm-up pair
        ratios.append(got[True]["save_gib_s"] / got[False]["save_gib_s"])
        for rank in got[True]["ranks"]:
            save_s = sum(rec["elapsed_s"] for rec in rank["phases"]["save"])
            in_window.append(rank["trace"]["in_window_s"] / save_s)
            events.append(rank["trace"]["events"])
    dlio = dlio_label()
    table = BenchTable("trace_bench", f"Tracing cost on {dlio}: {args.ranks} ranks, {args.writes} checkpoints per "
                       f"run, hidden {args.hidden}, traced (DFTRACER_ENABLE=1 DFTRACER_INC_METADATA=1) against "
                       "untraced", ["measure", "value", "target"])
    table.add(f"time logging our spans ({int(statistics.median(events))} events per rank), share of save time "
              "(median; max)", f"{100 * statistics.median(in_window):.2f} % ({100 * max(in_window):.2f} %)", "< 1 %")
    table.add(f"save throughput traced / untraced, dftracer's POSIX interception included (median of "
              f"{len(ratios)} interleaved pairs)", f"{statistics.median(ratios):.3f}", "")
    table.note(f"Pairs: {[round(r, 3) for r in ratios]}.")
    table.finish(args.json, {"in_window_share": in_window, "events": events, "ratios": ratios, "dlio": dlio})


def dlio_label() -> str:
    """Which DLIO the environment running the bench holds."""
    from dlio_ckpt_ext.dlio.provenance import dlio_flavor
    return f"DLIO {dlio_flavor().split(' (')[0]}"

if __name__ == "__main__":
    main()
