"""Global checkpoint windows, DLIO-style [METRIC] lines and summary.json.

A checkpoint's duration is the window from the first rank's start to the
last rank's close (MLPerf's definition, not rank 0's own time); its
throughput is the bytes of all ranks over that window, and the reported
figure is the mean (± population std) over checkpoints, as upstream DLIO.
"""
from __future__ import annotations

import json
import os
import statistics

from dlio_ckpt_ext.engine.profile import GiB, FileStats

def local_record(step: int, files: list[FileStats], start: float, end: float) -> dict:
    """This rank's part of one checkpoint: wall-clock start/end around its files."""
    return {"step": step, "start": start, "end": end, "elapsed_s": end - start,
            "bytes": sum(f.nbytes for f in files), "files": [f.to_dict() for f in files]}


def global_window(records_by_rank: list[dict]) -> dict:
    """Combine every rank's record of one checkpoint into its global window."""
    start = min(r["start"] for r in records_by_rank)
    end = max(r["end"] for r in records_by_rank)
    nbytes = sum(r["bytes"] for r in records_by_rank)
    duration = end - start
    return {"step": records_by_rank[0]["step"], "duration_s": duration, "bytes": nbytes,
            "throughput_gib_s": nbytes / GiB / duration if duration > 0 else 0.0,
            "rank_elapsed_min_s": min(r["elapsed_s"] for r in records_by_rank),
            "rank_elapsed_max_s": max(r["elapsed_s"] for r in records_by_rank)}


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.pstdev(values)


def metric_lines(phase: str, windows: list[dict], label: str = "[METRIC]") -> list[str]:
    """label: "[METRIC]", or another prefix where DLIO prints the [METRIC] lines itself."""
    d_mean, d_std = mean_std([w["duration_s"] for w in windows])
    t_mean, t_std = mean_std([w["throughput_gib_s"] for w in windows])
    return [f"{label} Checkpoint {phase} duration (seconds): {d_mean:.4f} (\u00b1{d_std:.4f})",
            f"{label} Checkpoint {phase} I/O Throughput (GiB/second): {t_mean:.4f} (\u00b1{t_std:.4f})"]


def results_block(phase: str, report: dict, cache_method: str = "", concurrency: dict | None = None) -> list[str]:
    if not report:
        return []
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    gen_name = "generation (fill)" if phase == "save" else "verification (regenerate)"
    return [f"RESULTS ({phase}):",
            f"  {gen_name:28s} {fmt(report['generation_gib_s_per_rank'], '.3f')} GiB/s per rank "
            f"({report['fill_s']:.3f} s)",
            f"  {'I/O':28s} {fmt(report['io_gib_s_per_rank'], '.3f')} GiB/s per rank ({report['io_s']:.3f} s, "
            f"of which close/fsync/upload completion {report['close_s']:.3f} s)",
            f"  {'generation / I/O ratio':28s} {fmt(report['generation_to_io_ratio'], '.2f')}"
            + ("x" if report["generation_to_io_ratio"] else " (nothing generated: verify is off)"),
            f"  {'pipeline overhead':28s} {report['pipeline_overhead_pct']:.2f} %",
            f"  {'bottleneck':28s} {report['bottleneck']} (I/O-bound chunks: {report['chunks_io_bound']}, "
            f"generation-bound chunks: {report['chunks_fill_bound']})"] + (
            [f"  {'page cache':28s} {cache_method}"] if cache_method else []) + (
            [f"  {'requests in flight':28s} {concurrency['requests_in_flight']} x "
             f"{concurrency['request_bytes'] / 2**20:g} MiB per rank"
             + (f" ({concurrency['files_at_once']} files at once)" if "files_at_once" in concurrency else "")]
            if concurrency else [])


def write_json(path: str, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    os.replace(tmp, path)


def async_checkpoints(blocked_by_rank: list[list[dict]], persist: list[dict], drain_s: float) -> dict:
    """Async mode, rank 0: each checkpoint's blocked time (the slowest rank's:
    training resumes only when every rank has), its persist window, and whether
    persisting kept up (the next save found it finished on every rank). The
    last checkpoint has no next save: drain_s is what the end of the run
    waited for it."""
    rows = []
    for i, per_rank in enumerate(zip(*blocked_by_rank)):
        row = {"step": per_rank[0]["step"],
               **{k: max(r[k] for r in per_rank) for k in ("blocked_s", "staging_s", "wait_s", "call_s", "fill_s")},
               "waited": any(r["waited"] for r in per_rank),
               "staging_gib_s": sum(r["bytes"] for r in per_rank) / GiB / max(r["staging_s"] for r in per_rank)
               if any(r["staging_s"] for r in per_rank) else 0.0}
        if i < len(persist):
            row.update(persist_s=persist[i]["duration_s"], persist_gib_s=persist[i]["throughput_gib_s"])
        rows.append(row)
    for row, nxt in zip(rows, rows[1:] + [None]):
        row["kept_up"] = None if nxt is None else not nxt["waited"]
    judged = [r["kept_up"] for r in rows if r["kept_up"] is not None]

    def stat(key: str) -> dict:
        mean, std = mean_std([r[key] for r in rows])
        return {"mean": mean, "std": std}
    return {"per_checkpoint": rows, "blocked_s": stat("blocked_s"), "staging_s": stat("staging_s"),
            "wait_s": stat("wait_s"), "staging_gib_s": stat("staging_gib_s"),
            "kept_up": sum(judged), "judged": len(judged), "final_drain_s": drain_s}


def async_lines(summary: dict, interval: float) -> list[str]:
    def metric(name: str, key: str, unit: str = "seconds") -> str:
        return (f"[METRIC] Checkpoint {name} ({unit}): {summary[key]['mean']:.4f} "
                f"(\u00b1{summary[key]['std']:.4f})")
    lines = [metric("save blocked duration", "blocked_s"),
             metric("save blocked staging", "staging_s"),
             metric("save blocked waiting for the previous persist", "wait_s"),
             metric("staging throughput", "staging_gib_s", "GiB/second")]
    for r in summary["per_checkpoint"]:
        kept = {None: "last checkpoint", True: "yes", False: "no"}[r["kept_up"]]
        lines.append(f"[INFO] async checkpoint {r['step']}: blocked {r['blocked_s']:.4f} s (staging "
                     f"{r['staging_s']:.4f} s, waiting for the previous persist {r['wait_s']:.4f} s), persist "
                     f"{r.get('persist_s', 0.0):.4f} s at {r.get('persist_gib_s', 0.0):.4f} GiB/s, "
                     f"kept up: {kept}")
    lines.append(f"[INFO] persisting kept up with the {interval:g} s interval for {summary['kept_up']} of "
                 f"{summary['judged']} checkpoints (the next save found it finished); the last one was waited "
                 f"for {summary['final_drain_s']:.4f} s at the end")
    return lines
