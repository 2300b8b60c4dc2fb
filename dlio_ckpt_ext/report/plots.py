"""PNG charts for one run and for a sweep (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dlio_ckpt_ext.report.results import Result  # noqa: E402

GiB = float(1 << 30)
PHASE_COLOURS = {"save": "tab:blue", "load": "tab:green"}


def _points(records: list[dict], t0: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]], str]:
    """(time, I/O GiB/s) of every file, and (time, generation GiB/s) of every chunk
    where the run kept them (streaming.record_chunks), else of every file, with the
    generation points' unit. I/O is per file because a chunk's own rate is one
    request's of the many in flight (16 ranged reads, several parts): far below
    the rank's rate and the bars under it; a file's I/O time is wall time with a
    request in flight, so its rate is the rank's."""
    files = [f for rec in records for f in rec["files"]]
    io = [(f["end"] - t0, f["nbytes"] / GiB / (f["io_s"] + f["close_s"])) for f in files
          if f["io_s"] + f["close_s"] > 0]
    chunks = [c for f in files for c in f.get("chunks") or []]
    if chunks:  # [offset, nbytes, fill_s, io_s, wait_free_s, wait_filled_s, done_at, produced_at]
        return io, [(c[6] - t0, c[1] / GiB / c[2]) for c in chunks if c[2] > 0], "chunk"
    return io, [(f["end"] - t0, f["nbytes"] / GiB / f["fill_s"]) for f in files if f["fill_s"] > 0], "file"


def run_report(result: Result, out: Path) -> Path:
    fig = run_figure(result)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run_figure(result: Result):
    """A timeline of every rank's I/O GiB/s per file and generation GiB/s per chunk
    (per file where the run kept no chunks),
    per-checkpoint throughput bars, each host's throughput per checkpoint
    (a slow node stands out below the others), then a panel for each block the run
    has (tiers, recovery, training: their results/ modules), and where the run has an
    interval, its goodput against the interval and its badput at each scale."""
    from dlio_ckpt_ext.results import panels_of
    g = result.summary.get("goodput")
    blocks = panels_of(result.summary)
    heights = [3, 2, 2] + [2] * len(blocks) + ([3] if g else [])
    fig = plt.figure(figsize=(12, 11 + 3 * len(blocks) + (4 if g else 0)))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, width_ratios=[3, 2])
    timeline, bars, hosts = (fig.add_subplot(grid[i, :]) for i in range(3))
    t0 = result.summary["start_time"]
    unit = "chunk"
    for stats in result.rank_stats:
        for phase, records in stats["phases"].items():
            io, fills, unit = _points(records, t0)
            if io:
                timeline.scatter(*zip(*io), s=6, color=PHASE_COLOURS[phase], alpha=0.6,
                                 label=f"{phase} I/O" if stats["rank"] == 0 else None)
            if fills:
                timeline.scatter(*zip(*fills), s=6, marker="x", color="tab:orange", alpha=0.6,
                                 label=f"{phase} generation" if stats["rank"] == 0 else None)
    timeline.set_yscale("log")
    timeline.set_xlabel("seconds since the run started")
    timeline.set_ylabel(f"GiB/s per rank: I/O per file, generation per {unit} (log)")
    timeline.set_title(f"{result.summary['model']}, {result.summary['ranks']} ranks: each rank's I/O rate per file "
                       f"and generation rate per {unit} (generation far above I/O: the storage is the bottleneck)")
    timeline.legend(loc="upper right", fontsize=8)
    width, x = 0.4, 0
    ticks = []
    for phase in ("save", "load"):
        per = (result.summary.get(phase) or {}).get("per_checkpoint", [])
        xs = [x + i for i in range(len(per))]
        if per:  # the legend names only what is drawn
            bars.bar(xs, [w["throughput_gib_s"] for w in per], width * 2, color=PHASE_COLOURS[phase], label=phase)
        for xi, w in zip(xs, per):
            for host, h in (w.get("hosts") or {}).items():
                slow = host == w.get("slowest_host") and len(w["hosts"]) > 1
                hosts.scatter([xi], [h["throughput_gib_s"]], s=18, color="tab:red" if slow else PHASE_COLOURS[phase])
                if slow:
                    hosts.annotate(host, (xi, h["throughput_gib_s"]), fontsize=7, xytext=(4, -4),
                                   textcoords="offset points")
        ticks += [(xi, f"{phase} {w['step']}") for xi, w in zip(xs, per)]
        x += len(per) + 1
    for ax in (bars, hosts):
        if ticks:
            ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], rotation=45, fontsize=7)
    bars.set_ylabel("GiB/s (all ranks)")
    bars.set_title("throughput per checkpoint")
    bars.legend(fontsize=8)
    hosts.set_ylim(bottom=0)
    hosts.set_ylabel("GiB/s per host")
    hosts.set_title("each host's throughput per checkpoint (its ranks' bytes over its own window; slowest in red)")
    for i, (_, draw) in enumerate(blocks):  # TIERS, RECOVERY, TRAINING (each its results/ module's panel)
        draw(result.summary, fig.add_subplot(grid[3 + i, :]))
    if g:  # the GOODPUT block as a chart (report/goodput_chart.py)
        from dlio_ckpt_ext.report.goodput_chart import draw_goodput
        row = 3 + len(blocks)
        draw_goodput(g, fig.add_subplot(grid[row, 0]), fig.add_subplot(grid[row, 1]))
    fig.tight_layout()
    return fig


def sweep_chart(swept: list[str], rows: list[dict], out: Path) -> Path:
    fig = sweep_figure(swept, rows)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def sweep_figure(swept: list[str], rows: list[dict]):
    """Throughput against the swept parameter(s): a line for one numeric
    parameter, bars labelled with every parameter otherwise; beside it, where the
    jobs have a GOODPUT block, their goodput against it the same way."""
    with_goodput = any(r.get("goodput_pct") is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if with_goodput else 1, figsize=(16 if with_goodput else 10, 5), squeeze=False)
    ax = axes[0][0]
    labels = [", ".join(f"{k.split('.')[-1]}={r[k]}" for k in swept) or f"job {r['job']}" for r in rows]
    numeric = len(swept) == 1 and all(_is_number(r[swept[0]]) for r in rows)
    for phase in ("save", "load"):
        ys = [r[f"{phase}_gib_s"] for r in rows]
        if all(y is None for y in ys):
            continue
        errs = [r[f"{phase}_std"] or 0 for r in rows]
        if numeric:
            pts = sorted(zip((float(r[swept[0]]) for r in rows), ys, errs))
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                        capsize=3, color=PHASE_COLOURS[phase], label=phase)
        else:
            offset = -0.2 if phase == "save" else 0.2
            ax.bar([i + offset for i in range(len(rows))], ys, 0.4, yerr=errs, capsize=3,
                   color=PHASE_COLOURS[phase], label=phase)
    if numeric:
        ax.set_xlabel(swept[0])
    else:
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("checkpoint throughput, GiB/s (mean \u00b1 std)")
    ax.set_title("sweep: " + (", ".join(swept) or "no swept parameter"))
    ax.legend()
    if with_goodput:  # the GOODPUT block's figure at the run's own scale, against the setting
        g = axes[0][1]
        ys = [r.get("goodput_pct") for r in rows]
        if numeric:
            pts = sorted((float(r[swept[0]]), y) for r, y in zip(rows, ys) if y is not None)
            g.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="tab:purple")
            g.set_xlabel(swept[0])
        else:
            g.bar(range(len(rows)), [y or 0.0 for y in ys], color="tab:purple")
            g.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
        g.set_ylabel("goodput at the run's interval (%)")
        g.set_title("goodput against the swept setting (each job's GOODPUT, at its own scale)")
    fig.tight_layout()
    return fig


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False
