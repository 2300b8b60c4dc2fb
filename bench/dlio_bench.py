"""The same workload under each DLIO: does the number depend on which DLIO drives it?

    python bench/dlio_bench.py --dir /work/bench_data [--dlios mlcommons,upstream,2.0.0] [--ranks 2]
                               [--pairs 4] [--gib-per-rank 1] [--settle 5]

Runs `dlio_benchmark workload=llama3_tiny_checkpoint` (scaled so that each rank
writes about --gib-per-rank, local_fs with O_DIRECT, our defaults) from each
DLIO's environment (run_scripts/setup.sh --dlio NAME builds them). Every other
DLIO is paired with the first one (the reference) in interleaved pairs, A B /
B A, a warm-up pair first, and the ratios are order-balanced (bench/pairs.py).
Prints per pair both runs' figures, then per DLIO against the reference (in
the ratios' wording, "ours" is the DLIO named first):
- save and load throughput over our global windows (ckpt_ext_summary.json),
- the same from the summary.json DLIO's own reporter wrote (ours on 2.0.0),
- the requests' own I/O rate per rank (RESULTS), which no DLIO loop can touch:
  when it moves with the windows, the storage moved, not the DLIO,
- the time outside our checkpoint windows: DLIO's start-up (launch to our
  mechanism's start), its loop around our windows (barriers, the
  framework's compute call, its stats), and its end (our finalize to exit).
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from local_bench import disk_options, dlio_command, settle, shape  # noqa: E402
from bench_table import BenchTable  # noqa: E402
from pairs import OrderedRatios, check_pairs  # noqa: E402

#: each DLIO's environment (run_scripts/setup.sh); "this": the one running this bench (CI pairs it
#: with itself, the smallest run of every path here)
VENVS = {"2.0.0": ".venv", "upstream": ".venv-upstream", "mlcommons": ".venv-mlcommons", "this": ""}
PHASES = ("save", "load")


def venv_bin(dlio: str) -> Path:
    path = REPO / VENVS[dlio] / "bin" if VENVS[dlio] else Path(sys.executable).parent
    if not (path / "dlio_benchmark").exists():
        sys.exit(f"no environment for DLIO {dlio}: run run_scripts/setup.sh --dlio {dlio}")
    return path


def run(args, dlio: str, ranks: int, hidden: int, tag: str, workdir: Path) -> dict:
    """One run; its throughputs and where its wall time went."""
    bin_dir, out = venv_bin(dlio), workdir / tag
    cmd = [str(bin_dir / "mpirun"), "--oversubscribe", "-np", str(ranks)]
    cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd += dlio_command(args, hidden, out, bin_dir)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    launched = time.time()
    res = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    exited = time.time()
    if res.returncode:
        sys.exit(f"DLIO {dlio} run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    record = json.loads((out / "ckpt_ext_summary.json").read_text())
    dlio_metric = json.loads((out / "summary.json").read_text())["metric"]
    windows = sum(c["duration_s"] for p in PHASES for c in record[p]["per_checkpoint"])
    return {**{p: record[p]["throughput_gib_s_mean"] for p in PHASES},
            # the requests' own rate (RESULTS' I/O line): storage time alone, whatever loop drives it
            **{f"io_{p}": record[p]["results"]["io_gib_s_per_rank"] for p in PHASES},
            **{f"dlio_{p}": dlio_metric[f"{p}_checkpoint_io_mean_GB_per_second"] for p in PHASES},
            "startup_s": record["start_time"] - launched,
            "loop_s": record["end_time"] - record["start_time"] - windows,
            "end_s": exited - record["end_time"], "windows_s": windows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dlios", default="mlcommons,upstream,2.0.0",
                    help="the first is the reference the others are paired with")
    ap.add_argument("--ranks", type=int, default=2)
    disk_options(ap, settle=5.0, checkpoints=3)
    args = ap.parse_args()
    check_pairs(ap, args.pairs)
    dlios = args.dlios.split(",")
    unknown = [d for d in dlios if d not in VENVS]
    if unknown or len(dlios) < 2:
        ap.error(f"--dlios takes two or more of {', '.join(VENVS)}, not {args.dlios!r}")
    reference, others = dlios[0], dlios[1:]
    model = shape(args.gib_per_rank, args.ranks, args.vocab, args.hidden)
    workdir = Path(tempfile.mkdtemp(prefix="dlio-bench-"))
    kept: dict[str, list[dict]] = {d: [] for d in dlios}
    table = BenchTable("dlio_bench", f"The same workload under each DLIO, paired with {reference}: {args.ranks} ranks, "
                       f"~{args.gib_per_rank:g} GiB per rank per checkpoint, {args.writes} saves + {args.reads} loads, "
                       f"local_fs with O_DIRECT, our defaults; order-balanced ratios of {args.pairs} interleaved pairs",
                       [f"DLIO / {reference}", "save, our windows", "load, our windows",
                        "DLIO's own summary.json (save; load)", "requests' own I/O rate (save; load)"])
    for other in others:
        ratios = {k: OrderedRatios() for k in ("save", "load", "dlio_save", "dlio_load", "io_save", "io_load")}
        for i in range(args.pairs + 1):
            # by side, not by name: a DLIO may be paired with itself
            order = (("other", other), ("reference", reference)) if i % 2 == 0 else \
                (("reference", reference), ("other", other))
            got = {}
            for side, dlio in order:
                settle(args.settle)
                got[side] = run(args, dlio, args.ranks, model["hidden"], f"{other}-pair{i}-{side}-{dlio}", workdir)
            print(f"  {other} / {reference} pair {i}{' (warm-up)' if i == 0 else ''}, {order[0][1]} first: "
                  + "; ".join(f"{dlio} save {got[side]['save']:.2f} load {got[side]['load']:.2f} GiB/s, outside "
                              f"windows {got[side]['startup_s']:.1f} + {got[side]['loop_s']:.2f} + "
                              f"{got[side]['end_s']:.1f} s" for side, dlio in order), flush=True)
            if i == 0:
                continue
            for key, r in ratios.items():
                r.add(order[0][0] == "other", got["other"][key] / got["reference"][key])
            for side, dlio in order:
                kept[dlio].append(got[side])
        print(f"{other} / {reference}, {args.ranks} ranks, per-rank files {[s >> 20 for s in model['sizes']]} MiB:\n"
              f"  our windows: save {ratios['save'].describe()}\n"
              f"               load {ratios['load'].describe()}\n"
              f"  DLIO's summary.json: save {ratios['dlio_save'].describe()}\n"
              f"                       load {ratios['dlio_load'].describe()}\n"
              f"  I/O rate per rank (RESULTS): save {ratios['io_save'].describe()}\n"
              f"                               load {ratios['io_load'].describe()}", flush=True)
        table.add(other, ratios["save"].cell(), ratios["load"].cell(),
                  f"{ratios['dlio_save'].balanced():.3f}; {ratios['dlio_load'].balanced():.3f}",
                  f"{ratios['io_save'].balanced():.3f}; {ratios['io_load'].balanced():.3f}")
    print("time outside our checkpoint windows (median s): start-up / loop around the windows / end; windows")
    for dlio, runs in kept.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("startup_s", "loop_s", "end_s", "windows_s")}
        print(f"  {dlio:10s} {med['startup_s']:6.2f} / {med['loop_s']:6.3f} / {med['end_s']:5.2f}; "
              f"{med['windows_s']:.2f} in {args.writes} saves + {args.reads} loads", flush=True)
        table.note(f"{dlio}: outside our windows (median s) {med['startup_s']:.2f} of start-up, {med['loop_s']:.3f} "
                   f"of DLIO's loop around the windows, {med['end_s']:.2f} of end; {med['windows_s']:.2f} s in the "
                   "windows.")
    table.finish(args.json)


if __name__ == "__main__":
    main()
