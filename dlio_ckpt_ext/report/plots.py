"""PNG charts for one run and for a sweep (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dlio_ckpt_ext.report.results import Result  # noqa: E402

GiB = float(1 << 30)
PHASE_COLOURS = {"save": "tab:blue", "load": "tab:green"}


def run_report(result: Result, out: Path) -> Path:
    """Per-chunk timeline (fill and I/O GiB/s of every rank over time) above
    per-checkpoint throughput bars."""
    fig, (timeline, bars) = plt.subplots(2, 1, figsize=(12, 8), gridspec_kw={"height_ratios": [3, 2]})
    t0 = result.summary["start_time"]
    for stats in result.rank_stats:
        for phase, records in stats["phases"].items():
            chunks = [c for rec in records for f in rec["files"] for c in f["chunks"]]
            if not chunks:
                continue
            t = [c[6] - t0 for c in chunks]
            timeline.scatter(t, [c[1] / GiB / c[3] if c[3] > 0 else 0 for c in chunks], s=6,
                             color=PHASE_COLOURS[phase], alpha=0.6,
                             label=f"{phase} I/O" if stats["rank"] == 0 else None)
            fills = [(ti, c[1] / GiB / c[2]) for ti, c in zip(t, chunks) if c[2] > 0]
            if fills:
                timeline.scatter(*zip(*fills), s=6, marker="x", color="tab:orange", alpha=0.6,
                                 label=f"{phase} generation" if stats["rank"] == 0 else None)
    timeline.set_yscale("log")
    timeline.set_xlabel("seconds since the run started")
    timeline.set_ylabel("GiB/s per chunk (log)")
    timeline.set_title(f"{result.summary['model']}, {result.summary['ranks']} ranks: per-chunk rates of every "
                       "rank (generation far above I/O means storage is the bottleneck)")
    timeline.legend(loc="upper right", fontsize=8)
    width, x = 0.4, 0
    ticks = []
    for phase in ("save", "load"):
        per = (result.summary.get(phase) or {}).get("per_checkpoint", [])
        xs = [x + i for i in range(len(per))]
        bars.bar(xs, [w["throughput_gib_s"] for w in per], width * 2, color=PHASE_COLOURS[phase], label=phase)
        ticks += [(xi, f"{phase} {w['step']}") for xi, w in zip(xs, per)]
        x += len(per) + 1
    if ticks:
        bars.set_xticks([t for t, _ in ticks], [label for _, label in ticks], rotation=45, fontsize=7)
    bars.set_ylabel("GiB/s (all ranks)")
    bars.set_title("throughput per checkpoint")
    bars.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def sweep_chart(swept: list[str], rows: list[dict], out: Path) -> Path:
    """Throughput against the swept parameter(s): a line for one numeric
    parameter, bars labelled with every parameter otherwise."""
    fig, ax = plt.subplots(figsize=(10, 5))
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
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False
