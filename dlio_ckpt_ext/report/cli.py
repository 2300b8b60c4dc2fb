"""dlio-ckpt-report: look at results after a run.

  dlio-ckpt-report run RESULTS_DIR [--out report.png]
  dlio-ckpt-report compare RESULTS_A RESULTS_B
  dlio-ckpt-report sweep SWEEP_DIR [--out-dir DIR]
  dlio-ckpt-report uploads s3://BUCKET/PREFIX|az://CONTAINER/PREFIX [--abort]
  dlio-ckpt-report traces RESULTS_DIR [--out-dir DIR]
  dlio-ckpt-report status RESULTS_DIR [--remove-incomplete]
  dlio-ckpt-report plan --workload W --ranks N [--ranks-per-node R] [--json FILE] [hydra overrides]
  dlio-ckpt-report goodput RESULTS_DIR [--nodes N ...] [--failures-per-node-day F] [--restart-s S]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.report.results import ResultsError, load_result
from dlio_ckpt_ext.result_files import RECORD_FILE


def _run(args) -> int:
    from dlio_ckpt_ext.report.plots import run_report
    result = load_result(args.results)
    out = Path(args.out or Path(args.results) / "report.png")
    run_report(result, out)
    s = result.summary
    for phase in ("save", "load"):
        t = result.throughput(phase)
        if t:
            print(f"checkpoint {phase}: {t[0]:.4f} (\u00b1{t[1]:.4f}) GiB/s over {s[phase]['checkpoints']} checkpoints")
    print(f"report: {out}")
    return 0


def _compare(args) -> int:
    from dlio_ckpt_ext.report.compare import compare
    lines, _ = compare(load_result(args.a), load_result(args.b))
    print("\n".join(lines))
    return 0


def _sweep(args) -> int:
    from dlio_ckpt_ext.report.plots import sweep_chart
    from dlio_ckpt_ext.report.sweep import sweep_table, write_tables
    swept, rows, failed = sweep_table(args.sweep)
    out_dir = Path(args.out_dir or args.sweep)
    csv_path, md_path = write_tables(swept, rows, out_dir)
    png = sweep_chart(swept, rows, out_dir / "sweep.png")
    print(md_path.read_text(), end="")
    for f in failed:
        settings = ", ".join(f"{k}={f['overrides'].get(k)}" for k in swept)
        print(f"failed: job {f['job']} ({settings}): {f['reason']}")
    print(f"tables: {csv_path}, {md_path}\nchart: {png}")
    return 1 if failed else 0


def _uploads(args) -> int:
    from dlio_ckpt_ext.storage import open_backend
    backend = open_backend("s3", args.uri, {})
    found = backend.open_uploads()
    container = args.uri.split("://", 1)[1].partition("/")[0]
    for u in found:
        what = u["upload_id"] if u["upload_id"] == "uncommitted blocks" else f"id {u['upload_id']}"
        print(f"open upload: {args.uri.split('://')[0]}://{container}/{u['key']} ({what}, started {u['initiated']})")
    if args.abort and found:
        print(f"aborted {backend.abort_uploads(found)} open upload(s) under {args.uri}")
    elif not found:
        print(f"no open upload under {args.uri}")
    else:
        print(f"{len(found)} open upload(s) under {args.uri}; --abort removes them")
    return 0


def _traces(args) -> int:
    from dlio_ckpt_ext.report.traces import collect_traces
    written = collect_traces(args.results, args.out_dir)
    folder = written[0].parent
    print(f"{len(written)} trace file(s) in {folder}, as dftracer-analyzer and dftracer-utils read them")
    print(f"  dfanalyzer analyzer/preset=dlio trace_path={folder} cluster.n_workers=1")
    return 0


def _status(args) -> int:
    from dlio_ckpt_ext.report.unfinished import describe, remove_incomplete, run_state
    state = run_state(args.results)
    if state is None:
        print(f"{args.results}: the run finished (see {RECORD_FILE})")
        return 0
    print("\n".join(describe(state)))
    if args.remove_incomplete:
        files, uploads = remove_incomplete(state)
        print(f"removed {files} file(s) of the incomplete checkpoints and aborted {uploads} open upload(s)")
    return 1


def _plan(args) -> int:
    from dlio_ckpt_ext.report.load_plans import plan_command
    print("\n".join(plan_command(args.workload, args.ranks, args.overrides, args.json, args.ranks_per_node)))
    return 0


def _goodput(args) -> int:
    from dlio_ckpt_ext.report.goodput_report import goodput_report
    print("\n".join(goodput_report(load_result(args.results).summary, args.nodes, args.failures_per_node_day,
                                    args.restart_s, args.interval_s, args.local_share, args.out)))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dlio-ckpt-report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="PNG of one run: per-chunk timeline and per-checkpoint throughput")
    p.add_argument("results", help="a run's results directory (holds summary.json and rank_stats/)")
    p.add_argument("--out", help="PNG path (default RESULTS/report.png)")
    p.set_defaults(func=_run)
    p = sub.add_parser("compare", help="two results side by side, flagging what differs")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(func=_compare)
    p = sub.add_parser("sweep", help="table (CSV, markdown) and PNG chart of a hydra multirun sweep")
    p.add_argument("sweep", help="the sweep directory (hydra.sweep.dir: numbered job directories)")
    p.add_argument("--out-dir", help="where to write sweep.csv, sweep.md, sweep.png (default SWEEP)")
    p.set_defaults(func=_sweep)
    p = sub.add_parser("uploads", help="list (and --abort) the uploads left open under an S3 prefix (multipart uploads) or an Azure one (uncommitted blocks)")
    p.add_argument("uri", help="s3://bucket/prefix (endpoint and credentials from the AWS_* environment)")
    p.add_argument("--abort", action="store_true", help="abort every one found")
    p.set_defaults(func=_uploads)
    p = sub.add_parser("traces", help="a run's dftracer traces as dftracer's current tools read them "
                                      "(DLIO 2.0.0's converted: numbers, gzip, real process ids)")
    p.add_argument("results", help="a run's results directory (holds its trace-*.pfw* files)")
    p.add_argument("--out-dir", help="where to write them (default RESULTS/traces)")
    p.set_defaults(func=_traces)
    p = sub.add_parser("status", help="whether a run finished; if not, which checkpoints it left complete, "
                                      "half-written or not started (exit code 1)")
    p.add_argument("results", help="a run's output folder")
    p.add_argument("--remove-incomplete", action="store_true",
                   help="delete the half-written checkpoints' files and abort the run's open uploads")
    p.set_defaults(func=_status)
    p = sub.add_parser("plan", help="what each rank of a load would read (bytes, requests, fan-in, amplification), "
                                    "for any preset, pattern and rank count, without running it")
    p.add_argument("--workload", required=True, help="a checkpoint preset, e.g. llama3_8b_checkpoint")
    p.add_argument("--ranks", type=int, required=True, help="ranks of the loading job")
    p.add_argument("--json", help="also write the plan's counts (every rank's) to this file")
    p.add_argument("--ranks-per-node", type=int, default=8,
                   help="a tiered run's ranks a node (its local tier and its nodes' shares; default 8)")
    p.add_argument("overrides", nargs="*", help="hydra overrides, e.g. ++workload.checkpoint.restore=framework "
                                                "++workload.checkpoint.saved_ranks=1024; "
                                                "++workload.tiers.local_root=/nvme plans a tiered run's saves")
    p.set_defaults(func=_plan)
    from dlio_ckpt_ext.goodput import LLAMA3_FAILURES_PER_NODE_DAY
    p = sub.add_parser("goodput", help="the share of a training job's time that is useful work, with this run's "
                                       "checkpoint figures, at its scale and the scales named; the best interval")
    p.add_argument("results", help="a run's results directory")
    p.add_argument("--nodes", type=int, nargs="*", default=[1024, 2048, 16384], help="scales (default 1024 2048 16384)")
    p.add_argument("--failures-per-node-day", type=float, default=LLAMA3_FAILURES_PER_NODE_DAY,
                   help="default 3.8e-3: Llama 3's pretraining (419 interruptions, 54 days, 2,048 nodes)")
    p.add_argument("--restart-s", type=float, default=0.0,
                   help="a restart's time outside storage: scheduler, start-up, compilation (default 0: unknown)")
    p.add_argument("--interval-s", type=float, help="the interval between checkpoints (default: the run's)")
    p.add_argument("--local-share", type=float,
                   help="tiered runs: the share of failures the local tier recovers (default: 0 and 1, as bounds)")
    p.add_argument("--out", help="also draw goodput against the interval, a curve a scale, and the badput split "
                                 "at each scale, into this PNG")
    p.set_defaults(func=_goodput)
    args, extra = ap.parse_known_args(argv)
    if extra and getattr(args, "overrides", None) is not None and all("=" in e and not e.startswith("-")
                                                                      for e in extra):
        args.overrides = [*args.overrides, *extra]  # overrides given before an option and after it, in order
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except (ResultsError, StorageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
